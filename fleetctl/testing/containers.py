"""What the ``--image`` lab tests share: the jobs they run, the run's argv, the image or a
skip, and the check that a job left no container and no process on any node.

A job's containers are found as teardown finds them, by the ``fleetctl.job`` label, listed by
each node's own runtime through ``fleetctl exec`` (a lab host keeps its runtime state in its own
namespaces: this machine's podman would not see them).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.images import ImageUnavailable
from fleetctl.testing.jobs import job_processes_left, killed_at_exit, node_record, on_node
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

T = TypeVar("T")

SHOW = """\
import os, sys
print("in-image", os.environ["FLEET_NODE_RANK"], sys.executable,
      open("/etc/os-release").read().split("PRETTY_NAME=")[1].splitlines()[0], flush=True)
"""
# rank 1 (node2) fails; the others ignore SIGTERM: only a kill, or the runtime, ends them
FAIL_ON_1 = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ["FLEET_NODE_RANK"] == "1":
    time.sleep(1.0)
    sys.exit(3)
time.sleep(120)
"""
SLEEP = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(120)
"""
#: the code folder of the podman and docker tests: script name -> source
JOB_SCRIPTS = {"show.py": SHOW, "fail_on_1.py": FAIL_ON_1, "sleep.py": SLEEP}


def built_or_skip(build: Callable[[], T]) -> T:
    """``build()`` (an image or its tarball); a missing tool or package skips the test
    (``skip_or_fail``: a failure under ``FLEETCTL_REQUIRE_LAB``)."""
    try:
        return build()
    except ImageUnavailable as e:
        skip_or_fail(str(e))


LAUNCHER = "plain"  # the jobs' scripts are each one process per node: no launcher needed


def run_argv(inventory: Path, runs: Path, code: Path, *extra: str) -> list[str]:
    """``fleetctl run`` with the plain launcher and a 2 s grace, then ``extra``."""
    return [
        "run", "-i", str(inventory), "--launcher", LAUNCHER, "--grace", "2",
        "--runs-dir", str(runs), "--code-dir", str(code), *extra,
    ]  # fmt: skip


def containers_left(inventory: Path, job_id: str) -> dict[str, list[str]]:
    """host -> ids of the job's containers (by label) that the node's podman still lists."""
    got = run_cli(
        "exec", "-i", str(inventory), "--",
        "podman", "ps", "-a", "-q", "--filter", f"label=fleetctl.job={job_id}",
    )  # fmt: skip
    assert got.exit_code == 0, got.stderr
    left: dict[str, list[str]] = {}
    for line in got.stdout.splitlines():
        host, _, cid = line.partition(": ")
        if cid.strip():
            left.setdefault(host, []).append(cid.strip())
    return left


def assert_nothing_left(
    inventory: Path, job_id: str, containers: dict[str, list[str]] | None = None
) -> None:
    """No container of the job on any node (``containers``: as another runtime listed them;
    default podman's :func:`containers_left`), then no process of it."""
    left = containers_left(inventory, job_id) if containers is None else containers
    assert left == {}, f"containers of job {job_id} left: {left}"
    processes = job_processes_left(inventory, job_id)
    assert processes == {}, f"processes of job {job_id} left: {processes}"


def kill_supervisor_for_its_guard(
    inventory: Path, proc: subprocess.Popen[str], job_id: str, rank: int, host: str
) -> None:
    """SIGKILL ``host``'s supervisor mid-run (its container's main process ignores SIGTERM):
    the controller, which loses the node, must fail, and the container guard started with the
    supervisor must end the one container of the job there, without a problem."""
    with killed_at_exit(proc):
        pid = node_record(inventory, job_id, rank, host, "supervisor.json")["supervisor_pid"]
        on_node(inventory, host, f"kill -KILL {int(pid)}")
        _out, err = proc.communicate(timeout=90)
    assert proc.returncode != 0, err
    guard = wait_for(
        lambda: node_record(inventory, job_id, rank, host, "container-guard.json"),
        30,
        what=f"{host}'s container guard ended the job's container",
    )
    assert len(guard["containers"]["found"]) == 1, guard
    assert guard["containers"]["problem"] is None, guard
