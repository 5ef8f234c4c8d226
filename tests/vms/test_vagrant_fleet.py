"""fleetctl against the Vagrantfile's 3 VMs (their own kernels, on plain qemu): the check
passes; a data NIC downed in a VM's own kernel fails the check naming that host; a failing rank
stops the job everywhere (exit 3); a VM powered off mid-run (``virsh destroy``: no FIN, no RST,
its kernel gone) is named lost, the other two are torn down, and the run exits 3.

Order matters: the power-off test comes last (the VM stays off until the session's teardown).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import run_cli_process, start_cli_process
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.vms

ROOT = Path(__file__).resolve().parents[2]

TICK = """\
import os, sys, time
rank = os.environ["FLEET_NODE_RANK"]
for i in range(int(sys.argv[1])):
    print(f"tick rank={rank} i={i}", flush=True)
    time.sleep(1)
"""

# Node rank 1 fails (exit 1) after ~3 s; the others tick until stopped.
FAIL_ON_1 = """\
import os, sys, time
rank = int(os.environ["FLEET_NODE_RANK"])
t0 = time.time()
while True:
    print(f"tick rank={rank}", flush=True)
    if rank == 1 and time.time() - t0 >= 3:
        print("rank 1 fails on purpose", flush=True)
        sys.exit(1)
    time.sleep(0.5)
"""


def run_args(inventory: Path, runs: Path, code: Path, *extra: str) -> list[str]:
    return ["run", "-i", str(inventory), "--launcher", "plain", "--nproc-per-node", "1",
            "--no-check", "--grace", "5", "--runs-dir", str(runs), "--code-dir", str(code),
            *extra]  # fmt: skip


def test_check_passes_on_the_three_vms(vagrant_fleet: Path) -> None:
    p = run_cli_process("check", "-i", str(vagrant_fleet), cwd=ROOT, timeout=600)
    assert p.exit_code == 0, p.stdout + p.stderr
    for node in ("node1", "node2", "node3"):
        assert node in p.stdout + p.stderr


def test_a_data_nic_down_in_a_vms_own_kernel_fails_the_check_naming_that_host(
    vagrant_fleet: Path, vm_sh: Callable[[str, str], subprocess.CompletedProcess[str]]
) -> None:
    down = vm_sh("node3", "sudo ip link set ib0 down")
    assert down.returncode == 0, down.stdout
    try:
        p = run_cli_process("check", "-i", str(vagrant_fleet), "--json", cwd=ROOT, timeout=600)
    finally:
        up = vm_sh("node3", "sudo ip link set ib0 up")
    assert up.returncode == 0, up.stdout
    assert p.exit_code == 3, p.stdout + p.stderr
    failures = {(f["host"], f["check"]): f["reason"] for f in json.loads(p.stdout)["failures"]}
    assert {host for host, _ in failures} == {"node3"}, failures  # mesh: its row and column
    assert "down" in failures[("node3", "nic")], failures


def test_a_failing_rank_stops_the_job_on_every_vm(vagrant_fleet: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "fail_on_1.py").write_text(FAIL_ON_1)
    runs = tmp_path / "runs"
    args = run_args(vagrant_fleet, runs, code, str(code / "fail_on_1.py"))
    p = run_cli_process(*args, cwd=ROOT, timeout=600)
    assert p.exit_code == 3, p.stdout + p.stderr
    [job_file] = runs.glob("*/job.json")
    job = json.loads(job_file.read_text())
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"], ff["state"], ff["exit_code"]) == (1, "node2", "failed", 1)
    assert [n["state"] for n in job["nodes"]] == ["stopped", "failed", "stopped"], job["nodes"]
    assert job["teardown"]["verified"] is True
    assert "rank 1 fails on purpose" in (job_file.parent / "1-node2" / "console.log").read_text()


def test_a_vm_powered_off_mid_run_is_lost_and_the_others_torn_down(
    vagrant_fleet: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    power_off: Callable[[str], None],
) -> None:
    monkeypatch.chdir(ROOT)  # the inventory's key and known_hosts paths are relative to it
    code = tmp_path / "code"
    code.mkdir()
    (code / "tick.py").write_text(TICK)
    runs = tmp_path / "runs"
    args = run_args(vagrant_fleet, runs, code, "--lost-timeout", "20", str(code / "tick.py"), "900")
    proc = start_cli_process(*args, cwd=ROOT, start_new_session=True)
    try:

        def all_running() -> bool:
            for job in runs.glob("*/job.json"):
                with contextlib.suppress(ValueError, OSError, KeyError):
                    nodes = json.loads(job.read_text())["nodes"]
                    return [n["state"] for n in nodes] == ["running"] * 3
            return False

        wait_for(all_running, 600, what="the job running on the 3 VMs", interval=1.0)
        power_off("node2")
        _out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == 3, err
    [job_file] = runs.glob("*/job.json")
    job = json.loads(job_file.read_text())
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"], ff["state"]) == (1, "node2", "lost"), ff
    assert [n["state"] for n in job["nodes"]] == ["stopped", "lost", "stopped"], job["nodes"]
    assert "node2" in err and "lost" in err, err
    job_id = job_file.parent.name
    for node in load_inventory(str(vagrant_fleet)).nodes:
        if node.name != "node2":
            left = node_leftovers(node_host(node), job_id, workdir=node.workdir, python=node.python)
            assert not left.processes, (node.name, left.processes)
