"""The testinfra cleanliness checks find what a job leaves behind on a lab host, and only that.

A job process is stood in by a ``sleep`` carrying ``FLEET_JOB_ID`` (what the supervisor gives
every process of a job); the checks must find it through testinfra (OpenSSH) and through a
fleetctl Connection, name it, ignore other jobs when asked about one, and pass once it is gone.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.infra import assert_node_clean, node_host, node_leftovers
from fleetctl.transport.connection import SSHSettings, connect

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
HOST = "node2"


@pytest.fixture
def job_process(lab3: Lab) -> Iterator[tuple[str, int]]:
    """(job id, pid on the host) of a stand-in job process; killed by pid afterwards."""
    job = f"20250101-000000-{secrets.token_hex(3)}"
    r = lab3.exec(
        HOST,
        ["sh", "-c", "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"],
        env={"FLEET_JOB_ID": job, "FLEET_NODE_RANK": "1"},
        check=True,
    )
    pid = int(r.stdout.strip())
    try:
        yield job, pid
    finally:
        lab3.exec(HOST, ["kill", "-9", str(pid)])


def test_a_job_process_and_a_temp_file_are_found_and_named(
    lab3: Lab, job_process: tuple[str, int]
) -> None:
    job, pid = job_process
    node = next(n for n in load_inventory(lab3.inventory_path).nodes if n.name == HOST)
    envs = lab3.host_dir(HOST) / "fleetctl" / "envs"
    envs.mkdir(parents=True, exist_ok=True)
    part = envs / f"{secrets.token_hex(4)}.tar.gz.part"
    part.write_bytes(b"half an archive")
    try:
        host = node_host(node)
        left = node_leftovers(host, job)
        assert [p["pid"] for p in left.processes] == [pid]
        assert left.processes[0]["job_id"] == job
        assert "sleep 300" in left.processes[0]["cmd"]
        assert f"/root/.fleetctl/envs/{part.name}" in left.temp_files
        with pytest.raises(AssertionError) as err:
            assert_node_clean(host, job)
        assert f"process {pid} (pgid {pid}, FLEET_JOB_ID={job}): sleep 300" in str(err.value)
        assert f"temp file /root/.fleetctl/envs/{part.name}" in str(err.value)

        # Another job's check does not see this job's process (the temp file is anyone's).
        assert node_leftovers(host, "20250101-000000-000000").processes == []
        # Without a job id, any FLEET_JOB_ID counts.
        assert pid in [p["pid"] for p in node_leftovers(host).processes]
        # A fleetctl Connection gives the same answer.
        with connect(node, SSHSettings()) as conn:
            assert [p["pid"] for p in node_leftovers(conn, job).processes] == [pid]
    finally:
        part.unlink()
    lab3.exec(HOST, ["kill", "-9", str(pid)], check=True)
    gone = f"for i in $(seq 200); do kill -0 {pid} 2>/dev/null || exit 0; sleep 0.05; done; exit 1"
    lab3.exec(HOST, ["sh", "-c", gone], check=True)  # reaped by the host's PID 1 (<= 10 s)
    assert_node_clean(host, job)


def test_the_clean_suite_fails_on_a_leftover_and_passes_for_another_job(
    lab3: Lab, job_process: tuple[str, int], tmp_path: Path
) -> None:
    """tests/infra/test_node_clean.py as users run it, with --job-id."""
    job, pid = job_process

    def suite(job_id: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                str(REPO / "tests" / "infra" / "test_node_clean.py"),
                f"--hosts=ssh://{HOST}", f"--ssh-config={lab3.ssh_config}", f"--job-id={job_id}",
            ],
            capture_output=True, text=True, timeout=120, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    dirty = suite(job)
    assert dirty.returncode == 1, dirty.stdout + dirty.stderr
    assert "1 failed, 1 passed" in dirty.stdout
    assert f"process {pid} " in dirty.stdout
    clean = suite("20250101-000000-000000")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "2 passed" in clean.stdout
