"""fleetctl against the Vagrantfile's 3 VMs (their own kernels, on plain qemu): the check
passes; a data NIC downed in a VM's own kernel fails the check naming that host; push ships the
code to every VM; a DDP job (gloo, the box's Debian torch) trains on the 3 VMs; a failing rank
stops the job everywhere (exit 3); a VM reset mid-run (``virsh reset``: its kernel gone, then a
new boot) is lost, and the one retry waits for it to answer SSH again and succeeds on it; a VM
rebooted cleanly mid-run (``sudo systemctl reboot``: systemd SIGTERMs the job's supervisor
first) is blamed, waited for, and the retry succeeds on it; a VM powered off mid-run
(``virsh destroy``: no FIN, no RST, its kernel gone) is named lost, the other two are torn
down, and the run exits 3.

Order matters: the power-off test comes last (the VM stays off until the session's teardown).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import run_cli_process, start_cli_process
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.vms

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
NODES = ("node1", "node2", "node3")

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


def run_args(
    inventory: Path, runs: Path, code: Path, *extra: str, check: bool = False
) -> list[str]:
    return ["run", "-i", str(inventory), "--launcher", "plain", "--nproc-per-node", "1",
            *([] if check else ["--no-check"]), "--grace", "5", "--runs-dir", str(runs),
            "--code-dir", str(code), *extra]  # fmt: skip


def running_on_all(runs: Path) -> bool:
    """The first attempt's job.json says every node runs."""
    for job in sorted(runs.glob("*/job.json")):
        with contextlib.suppress(ValueError, OSError, KeyError):
            nodes = json.loads(job.read_text())["nodes"]
            return [n["state"] for n in nodes] == ["running"] * 3
    return False


def start_and_then(args: list[str], runs: Path, fault: Callable[[], None], timeout: float):
    """``fleetctl ARGS`` as a process; once the job runs on the 3 VMs, ``fault()``. Returns
    the exit code and stderr (the process group is killed past ``timeout``)."""
    proc = start_cli_process(*args, cwd=ROOT, start_new_session=True)
    try:
        wait_for(lambda: running_on_all(runs), 600, what="the job on the 3 VMs", interval=1.0)
        fault()
        _out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return proc.returncode, err


def test_check_passes_on_the_three_vms(vagrant_fleet: Path) -> None:
    p = run_cli_process("check", "-i", str(vagrant_fleet), cwd=ROOT, timeout=600)
    assert p.exit_code == 0, p.stdout + p.stderr
    for node in ("node1", "node2", "node3"):
        assert node in p.stdout + p.stderr


def test_a_data_nic_down_in_a_vms_own_kernel_fails_the_check_naming_that_host(
    vagrant_fleet: Path, vm_sh: Callable[..., subprocess.CompletedProcess[str]]
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


def test_push_ships_the_code_to_every_vm(
    vagrant_fleet: Path,
    tmp_path: Path,
    vm_sh: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "hello.py").write_text(f"print('hello from {tmp_path.name}')\n")
    digest = hashlib.sha256((code / "hello.py").read_bytes()).hexdigest()
    p = run_cli_process("push", "-i", str(vagrant_fleet), "--code", str(code), "--json",
                        cwd=ROOT, timeout=600)  # fmt: skip
    assert p.exit_code == 0, p.stdout + p.stderr
    for node in NODES:
        assert node in p.stdout, p.stdout
        found = vm_sh(node, "find ~/.fleetctl -name hello.py -exec sha256sum {} +")
        assert digest in found.stdout, (node, found.stdout)


def test_a_ddp_job_over_gloo_trains_on_the_three_vms(
    vagrant_fleet: Path,
    torch_warm: dict[str, str],
    tmp_path: Path,
) -> None:
    if not all(a.endswith("rc=0") for a in torch_warm.values()):
        skip_or_fail(f"no torch on every VM (an older `fleetctl lab box`?): {torch_warm}")
    runs = tmp_path / "runs"
    # --lost-timeout 20, as in the fault tests: a 1-vCPU VM on TCG whose rank is importing
    # torch answered no heartbeat and no new SSH banner for 5 s (all 3 lost at the default 5 s)
    args = run_args(vagrant_fleet, runs, EXAMPLES, "--lost-timeout", "20",
                    str(EXAMPLES / "ddp_train.py"), "--epochs", "1", "--steps", "3")  # fmt: skip
    t0 = time.monotonic()
    p = run_cli_process(*args, cwd=ROOT, timeout=1200)
    print(f"DDP on the 3 VMs ({torch_warm['node1']}): {time.monotonic() - t0:.0f}s")
    assert p.exit_code == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for rank in range(3):
        assert f"done rank={rank} world=3" in p.stdout, p.stdout[-3000:]
    assert "backend=gloo" in p.stdout
    [job_file] = runs.glob("*/job.json")
    job = json.loads(job_file.read_text())
    assert job["status"] == "succeeded" and [n["exit_code"] for n in job["nodes"]] == [0, 0, 0]


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


BOOT_ID = "cat /proc/sys/kernel/random/boot_id"


@dataclass
class Retried:
    """A run whose node2 booted again mid-run: its stderr and both attempts' run folders."""

    err: str
    attempts: list[dict[str, Any]]
    first: Path  # attempt 1's run folder (attempts.json lives there)
    second: Path


def node2_rebooted_mid_run(
    vm_sh: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
    inventory: Path,
    reboot: Callable[[], object],
    what: str,
) -> Retried:
    """A 30 s tick job on the 3 VMs with one retry (``--reboot-timeout 900``); once it runs on
    all 3, ``reboot()`` node2. Asserts what every such reboot must end in: exit 0, node2's boot
    id changed, attempt 1 failed, and the retry ran to its end on all 3."""
    before = vm_sh("node2", BOOT_ID).stdout.strip()
    code = tmp_path / "code"
    code.mkdir()
    (code / "tick.py").write_text(TICK)
    runs = tmp_path / "runs"
    args = run_args(inventory, runs, code, "--max-retries", "1", "--retry-backoff", "1",
                    "--lost-timeout", "20", "--reboot-timeout", "900", str(code / "tick.py"),
                    "30", check=True)  # fmt: skip
    t0 = time.monotonic()
    rc, err = start_and_then(args, runs, reboot, 1500)
    print(f"{what} and retry: {time.monotonic() - t0:.0f}s")
    print("\n".join(ln for ln in err.splitlines() if "node2" in ln or "attempt" in ln))
    assert rc == 0, err[-4000:]
    after = vm_sh("node2", BOOT_ID).stdout.strip()
    assert before and after and before != after  # node2 did boot again
    [first] = [p for p in runs.iterdir() if (p / "attempts.json").exists()]
    attempts = json.loads((first / "attempts.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "succeeded"], attempts
    assert "waiting up to 900s for node2 to answer SSH again" in err, err[-4000:]
    second = runs / attempts[1]["job_id"]
    for rank, node in enumerate(NODES):
        assert "i=29" in (second / f"{rank}-{node}" / "console.log").read_text()
    return Retried(err, attempts, first, second)


def test_a_vm_reset_mid_run_is_waited_for_and_the_one_retry_succeeds_on_it(
    vagrant_fleet: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    vm_sh: Callable[..., subprocess.CompletedProcess[str]],
    reset: Callable[[str], None],
) -> None:
    """``virsh reset``: node2's kernel is gone at once (no FIN, no RST) and it boots again,
    minutes on TCG. Attempt 1 loses it; the one retry (``--max-retries 1``) waits for its SSH
    (``--reboot-timeout``) instead of failing on a host still booting, checks the fleet again
    and runs to the end on all 3."""
    monkeypatch.chdir(ROOT)
    r = node2_rebooted_mid_run(vm_sh, tmp_path, vagrant_fleet, lambda: reset("node2"), "reset")
    waited = re.search(r"node2: answers SSH again after ([0-9.]+)s", r.err)
    assert waited, r.err[-4000:]
    print(f"node2 answered SSH again after {waited.group(1)}s of waiting")
    assert r.attempts[0]["ended_by"].startswith("node 1 (node2): lost"), r.attempts[0]
    assert r.attempts[0]["decision"] == "retry: retry on lost (default)", r.attempts[0]
    events1 = (r.first / "events.log").read_text()
    events2 = (r.second / "events.log").read_text()
    assert "[1 node2]" in events1 and "lost" in events1, events1
    assert f"job {r.attempts[1]['job_id']}" in events2, events2


def test_a_vm_rebooted_cleanly_mid_run_is_blamed_waited_for_and_the_retry_succeeds_on_it(
    vagrant_fleet: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    vm_sh: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    """``sudo reboot`` in node2: systemd SIGTERMs every process first — the job's supervisor
    and its rank, sshd's session — then the kernel restarts. Attempt 1 must blame node2 (not end
    as a stop of ours while the others run on), the one retry waits for its SSH and succeeds."""
    monkeypatch.chdir(ROOT)
    reboot = functools.partial(vm_sh, "node2", "sudo systemctl reboot")
    r = node2_rebooted_mid_run(vm_sh, tmp_path, vagrant_fleet, reboot, "reboot")
    print(f"attempt 1: {r.attempts[0]['ended_by']}; {r.attempts[0]['decision']}")
    assert r.attempts[0]["ended_by"].startswith("node 1 (node2): "), r.attempts[0]
    job1 = json.loads((r.first / "job.json").read_text())
    assert [n["state"] for n in job1["nodes"]][0::2] == ["stopped", "stopped"], job1["nodes"]


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
    rc, err = start_and_then(args, runs, lambda: power_off("node2"), 600)
    assert rc == 3, err
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
