"""``LocalConnection.run`` (``ExecConnection``): byte-exact stdin and output, shell exit
codes, and a timeout that holds even when a background child keeps the output pipe open."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from fleetctl.errors import RemoteCommandError
from fleetctl.node import Node
from fleetctl.transport.connection import LocalConnection, connect


@pytest.fixture
def local() -> LocalConnection:
    conn = connect(Node.localhost())
    assert isinstance(conn, LocalConnection)
    return conn


def test_binary_stdin_reaches_the_command_byte_for_byte_and_fast(local: LocalConnection) -> None:
    data = os.urandom(1 << 20)  # invoke (the old runner) pumped 1 byte per 10 ms
    t0 = time.monotonic()
    r = local.run("sha256sum", stdin=data, timeout=30)
    assert time.monotonic() - t0 < 10
    import hashlib

    assert r.stdout.split()[0] == hashlib.sha256(data).hexdigest()


def test_without_stdin_the_command_reads_eof_at_once(local: LocalConnection) -> None:
    assert local.run("cat; echo done", timeout=10).stdout == "done\n"


def test_utf8_output_across_read_chunks_is_not_garbled(local: LocalConnection) -> None:
    # 999 ASCII bytes, then a 2-byte character across a 1000-byte read boundary
    r = local.run("printf '%999s' ''; printf 'é\\n' >&2; printf 'é\\n'", timeout=10)
    assert r.stdout == " " * 999 + "é\n"
    assert r.stderr == "é\n"


def test_exit_codes_and_signals_read_as_a_shell_reports_them(local: LocalConnection) -> None:
    assert local.run("exit 7", timeout=10).exit_code == 7
    assert local.run("kill -TERM $$", timeout=10).exit_code == 128 + 15
    with pytest.raises(RemoteCommandError, match="exit 3"):
        local.run("exit 3", timeout=10, check=True)


def test_the_timeout_holds_when_a_background_child_keeps_stdout_open(
    local: LocalConnection, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    t0 = time.monotonic()
    try:
        with pytest.raises(RemoteCommandError, match=r"timed out after 1s"):
            local.run(f"sleep 30 & echo $! > {pid_file}; echo started", timeout=1)
        assert time.monotonic() - t0 < 5
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # by its recorded PID
    with pytest.raises(RemoteCommandError, match=r"timed out after 0.5s"):
        local.run("exec sleep 30", timeout=0.5)
