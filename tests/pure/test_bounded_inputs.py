"""Files the user names are read bounded: an ssh_config that is a FIFO or bigger than 32 MiB
is refused in one line (never a hung or memory-eating read), as the inventory is."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.errors import SSHConfigError
from fleetctl.node import Node
from fleetctl.transport import sshconfig
from fleetctl.transport.connection import SSHSettings


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO with a writer that opens and closes it for every reader, so a read that blocks
    on it ends (with nothing read) instead of hanging the test."""
    path = tmp_path / "fifo" / "ssh_config"
    path.parent.mkdir()
    os.mkfifo(path)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            os.close(os.open(path, os.O_WRONLY))  # blocks until a reader opens it

    writer = threading.Thread(target=serve, daemon=True)
    writer.start()
    yield path
    stop.set()
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # the reader its last open waits for
    writer.join(5)
    os.close(fd)


def _fifo(tmp_path: Path) -> Path:
    return tmp_path / "fifo" / "ssh_config"


def _huge(tmp_path: Path) -> Path:
    path = tmp_path / "ssh_config"
    with open(path, "wb") as f:
        f.truncate((32 << 20) + 1)  # sparse: costs no disk
    return path


@pytest.mark.parametrize(
    ("make", "why"), [(_fifo, "not a regular file (a FIFO)"), (_huge, "more than the 32 MiB")]
)
@pytest.mark.parametrize("jump", [None, "bastion"])
def test_an_ssh_config_is_read_through_the_bounded_reader(
    tmp_path: Path, fifo: Path, make, why: str, jump: str | None
) -> None:
    path = make(tmp_path)
    node = Node("a", "a", proxy_jump=jump) if jump else Node("a", "a")
    with pytest.raises(SSHConfigError) as ei:
        sshconfig.resolve(node, SSHSettings(ssh_config=str(path)))
    line = ei.value.one_line()
    assert line.startswith(f"a: cannot use ssh_config {path}: "), line
    assert why in line, line


# Job-file numbers: the command line's bounds, one line naming the file, line and key, exit 2.
ROLES = "roles:\n  worker:\n    script: train.py\n"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("timeout: 1e12\n" + ROLES, "job.yml:1: timeout must be a number of seconds 1..31622400"),
        ("stall_timeout: .inf\n" + ROLES, "job.yml:1: stall_timeout must be a number of seconds"),
        ("retry: {max_retries: 101}\n" + ROLES, "max_retries must be an integer 0..100, got 101"),
        ("retry: {backoff: .nan}\n" + ROLES, "backoff must be a number of seconds 0..300"),
        ("retry: {backoff_max: 1e9}\n" + ROLES, "backoff_max must be a number of seconds 0..300"),
        (ROLES + "    nproc_per_node: 4097\n", "4: nproc_per_node must be an integer 1..4096"),
        (ROLES + "    instances: 1000000001\n", "instances must be an integer 1..1000000, got"),
        (ROLES + "    min_failed: 10000000000\n", "min_failed must be an integer 1..1000000"),
    ],
)
def test_job_file_numbers_are_bounded_like_the_options(text: str, why: str) -> None:
    from fleetctl.errors import UsageError
    from fleetctl.plan.roles.jobfile import parse_job_file

    with pytest.raises(UsageError) as ei:
        parse_job_file(text, "job.yml")
    assert why in ei.value.one_line() and ei.value.exit_code == 2, ei.value.one_line()


def test_the_bounds_are_the_command_lines() -> None:
    """The largest value the option takes, the job file takes; one more, neither."""
    import click

    from fleetctl.cli.run_cmd import run_command
    from fleetctl.plan.roles.jobfile import parse_job_file
    from fleetctl.plan.userinput import MAX_BACKOFF, MAX_NPROC, MAX_RETRIES

    params = {p.name: p for p in run_command.params}
    params["nproc"].type.convert(str(MAX_NPROC), params["nproc"], None)
    with pytest.raises(click.BadParameter):
        params["nproc"].type.convert(str(MAX_NPROC + 1), params["nproc"], None)
    for name, high in (("timeout", 366 * 86400), ("stall_timeout", 366 * 86400)):
        params[name].type.convert(high, params[name], None)
        with pytest.raises(click.BadParameter):
            params[name].type.convert(high + 1, params[name], None)
        parse_job_file(f"{name}: {high}\n" + ROLES, "job.yml")
    params["max_retries"].type.convert(MAX_RETRIES, params["max_retries"], None)
    with pytest.raises(click.BadParameter):
        params["max_retries"].type.convert(MAX_RETRIES + 1, params["max_retries"], None)
    params["retry_backoff"].type.convert(MAX_BACKOFF, params["retry_backoff"], None)
    with pytest.raises(click.BadParameter):
        params["retry_backoff"].type.convert(MAX_BACKOFF + 1, params["retry_backoff"], None)
    parse_job_file(f"retry: {{max_retries: {MAX_RETRIES}, backoff: {MAX_BACKOFF}}}\n" + ROLES)
