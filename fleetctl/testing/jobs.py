"""A job the lab tests run through the CLI, watched from outside: its run folder here, the
controller's process, files of its node run folders and processes left on the nodes.

Nodes are reached by ``fleetctl exec`` on the inventory (as the login user the lab gives
them), never by this machine's view of the hosts, so the tests see what a node's user sees.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import run_cli, start_cli_process
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.testing.wait import wait_for


def only_job(runs: Path) -> tuple[str, dict[str, Any]]:
    """The one job folder under ``runs``: its id and job.json."""
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return folder.name, json.loads((folder / "job.json").read_text())


def running_on_all(runs: Path, nodes: int) -> str | None:
    """The job id once a job.json under ``runs`` says the job runs on all ``nodes``."""
    for d in runs.glob("*") if runs.is_dir() else []:
        j = json.loads((d / "job.json").read_text()) if (d / "job.json").is_file() else {}
        if [n.get("state") for n in j.get("nodes", [])] == ["running"] * nodes:
            return d.name
    return None


def kill_if_running(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a controller started in its own session (its whole group), if still running."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)


@contextmanager
def killed_at_exit(proc: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """The block's controller process, killed when the block leaves it running (a failed
    step must not leave a job behind)."""
    try:
        yield proc
    finally:
        kill_if_running(proc)


def start_running(
    argv: Sequence[str], runs: Path, nodes: int, *, cwd: Path, timeout: float = 60
) -> tuple[subprocess.Popen[str], str]:
    """``fleetctl ARGV`` started in a session of its own: (its process, the job id) once
    job.json says the job runs on all ``nodes``. A controller that exits first is an
    AssertionError with its output; one that never gets there is killed."""
    proc = start_cli_process(*argv, cwd=cwd, start_new_session=True)
    try:
        job_id = wait_for(
            lambda: running_on_all(runs, nodes) or proc.poll() is not None,
            timeout,
            what=f"job running on all {nodes} nodes",
            interval=0.3,
        )
    except BaseException:
        kill_if_running(proc)
        raise
    if proc.poll() is not None:
        raise AssertionError(proc.communicate())
    return proc, job_id


def stop_job(runs: Path, job_id: str) -> None:
    """``fleetctl stop`` from another terminal (grace 1 s), which must succeed."""
    stop = run_cli("stop", "--runs-dir", str(runs), job_id, "--grace", "1")
    assert stop.exit_code == 0, stop.stdout + stop.stderr


def on_node(inventory: Path, host: str | None, script: str) -> dict[str, str]:
    """``sh -c script`` on one host of the inventory (every host: None), which must succeed:
    host -> its output, the host prefix taken off."""
    limit = ("--limit", host) if host else ()
    got = run_cli("exec", "-i", str(inventory), *limit, "--", "sh", "-c", script)
    assert got.exit_code == 0, got.stdout + got.stderr
    out: dict[str, str] = {}
    for line in got.stdout.splitlines():
        name, _, text = line.partition(": ")
        out[name] = (out[name] + "\n" + text) if name in out else text
    return out


def node_file(inventory: Path, job_id: str, rank: int, host: str, name: str) -> str:
    """A file of the job's node run folder on ``host`` (``{}`` while there is none)."""
    (node,) = [n for n in load_inventory(str(inventory)).nodes if n.name == host]
    path = f"{node.workdir.rstrip('/')}/runs/{job_id}/{rank}-{host}/{name}"
    return on_node(inventory, host, f"cat {path} 2>/dev/null || echo '{{}}'").get(host, "")


def node_record(inventory: Path, job_id: str, rank: int, host: str, name: str) -> Any:
    """A JSON file of the job's node run folder on ``host`` ({} while there is none)."""
    return json.loads(node_file(inventory, job_id, rank, host, name))


def job_processes_left(inventory: Path, job_id: str) -> dict[str, list[dict[str, Any]]]:
    """host -> processes of the job still alive (found by their env tag, container or not)."""
    out = {}
    for node in load_inventory(str(inventory)).nodes:
        left = node_leftovers(node_host(node), job_id, workdir=node.workdir, python=node.python)
        if left.processes:
            out[node.name] = left.processes
    return out


def launched_job_id(stderr: str) -> str:
    """The job id a run's ``launching … job ID`` line names on its stderr."""
    m = re.search(r"launching \S+ on \d+ node\(s\), job (\S+)$", stderr, re.M)
    assert m, stderr
    return m.group(1)


def assert_nothing_left(inventory: Path, job_id: str) -> None:
    """No process of the job on any node of ``inventory`` (its env tag, container or not)."""
    left = job_processes_left(inventory, job_id)
    assert not left, left


def slow_warnings(folder: Path) -> tuple[list[str], float | None]:
    """A run folder's live warnings (events.log lines) and how long after the launch the first
    came, by the log's own stamps (None without a warning): the slow-node tests' evidence."""
    events = (folder / "events.log").read_text().splitlines()
    launched = next(ln for ln in events if " phase launching " in ln)
    warned = [ln for ln in events if " warning [" in ln]
    if not warned:
        return warned, None

    def at(line: str) -> float:
        stamp = line.split(" ", 1)[0]
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    return warned, at(warned[0]) - at(launched)
