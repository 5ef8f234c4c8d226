"""fleetctl inside a real Slurm allocation (lab: munged + slurmctld + one slurmd per host).

The allocation comes from a real ``salloc -N3 --no-shell``; fleetctl then runs with that job's
``SLURM_JOB_ID``/``SLURM_JOB_NODELIST`` and no inventory, as in an sbatch script: nodes from the
allocation, supervisors started as srun steps, the same job core after launch.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.lab.core import Lab
from fleetctl.lab.slurm import SlurmLab, installed
from fleetctl.testing.cli_runner import run_cli_process, start_cli_process
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
OK_SCRIPT = """\
import os, socket
e = os.environ
print("RANKLINE", e["RANK"], socket.gethostname(), e.get("SLURMD_NODENAME"),
      e.get("SLURM_STEP_ID"), e["MASTER_ADDR"], e["WORLD_SIZE"], flush=True)
"""
FAIL_SCRIPT = """\
import os, sys, time
print("started", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1":
    time.sleep(1)
    sys.exit(7)
time.sleep(600)  # fleetctl_slurm_sleeper: must be stopped by the teardown
"""


@pytest.fixture(scope="module")
def slurm(make_lab_module: Callable[..., Lab]) -> Iterator[dict[str, Any]]:
    why = installed()
    if why:
        skip_or_fail(f"Slurm {why} (.ci/run installs slurm-wlm and munge)")
    lab = make_lab_module(3, user=None, shared_home=False)
    s = SlurmLab.start(lab)  # stopped by lab.down (the factory's finally) by PID
    job, nodelist = s.allocate(3)
    try:
        env = {"SLURM_CONF": str(s.conf), "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist}
        yield {"lab": lab, "slurm": s, "job": job, "env": env}
    finally:
        s.cancel(job)


def _run(slurm: dict[str, Any], tmp_path: Path, script: str) -> tuple[Any, Path]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(script)
    runs = tmp_path / "runs"
    res = run_cli_process(
        "run", "--launcher", "plain", "--runs-dir", str(runs), "job.py",
        env=slurm["env"], cwd=code, timeout=90,
    )  # fmt: skip
    folders = [p for p in runs.iterdir() if p.is_dir()] if runs.exists() else []
    assert len(folders) == 1, res.stdout + res.stderr
    return res, folders[0]


def test_plain_job_one_rank_per_allocated_node_via_srun(
    slurm: dict[str, Any], tmp_path: Path
) -> None:
    res, folder = _run(slurm, tmp_path, OK_SCRIPT)
    assert res.exit_code == 0, res.stdout + res.stderr
    lines = sorted(
        ln.split("RANKLINE", 1)[1].split() for ln in res.stdout.splitlines() if "RANKLINE" in ln
    )
    lab: Lab = slurm["lab"]
    master = lab.hosts[0].mgmt_addr
    assert len(lines) == 3, res.stdout
    for rank, (r, host, slurmd_node, step, addr, world) in enumerate(lines):
        # rank i on the i-th node of the allocation, started by slurmd as a job step
        assert (r, host, slurmd_node, addr, world) == (
            str(rank),
            f"node{rank + 1}",
            f"node{rank + 1}",
            master,
            "3",
        )
        assert step is not None and step.isdigit()
    plan = json.loads((folder / "plan.json").read_text())
    assert [n["host"] for n in plan["nodes"]] == ["node1", "node2", "node3"]
    ranks = json.loads((folder / "ranks.json").read_text())["ranks"]
    assert [(r["rank"], r["node"]) for r in ranks] == [(0, "node1"), (1, "node2"), (2, "node3")]
    for i in range(3):
        assert (folder / f"{i}-node{i + 1}" / "console.log").is_file()


def test_failing_rank_on_node2_stops_every_node(slurm: dict[str, Any], tmp_path: Path) -> None:
    res, folder = _run(slurm, tmp_path, FAIL_SCRIPT)
    out = res.stdout + res.stderr
    assert res.exit_code == 3, out
    assert "node 1 (node2) failed first" in out
    job = json.loads((folder / "job.json").read_text())
    assert job["status"] == "failed"
    assert (job["first_failure"]["host"], job["first_failure"]["exit_code"]) == ("node2", 7)
    lab: Lab = slurm["lab"]
    for i, h in enumerate(lab.hosts):  # no process of the job left on any host, at once
        ps = lab.exec(h.name, ["ps", "-eo", "args"], check=True).stdout
        assert "fleetctl_slurm" not in ps and "job.py" not in ps, (h.name, ps)
        assert (folder / f"{i}-{h.name}" / "console.log").is_file()

    def no_steps() -> bool:  # slurmstepd's own cleanup after its task is asynchronous
        p = subprocess.run(
            ["squeue", "-h", "-s", "-j", slurm["job"]],
            capture_output=True, text=True, env=slurm["slurm"].env(), timeout=10,
        )  # fmt: skip
        return p.returncode == 0 and not p.stdout.strip()

    wait_for(no_steps, 15, what="the job's srun steps gone from squeue")
    for h in lab.hosts:
        assert "slurmstepd" not in lab.exec(h.name, ["ps", "-eo", "args"]).stdout, h.name


def test_inventory_hosts_selected_and_ordered_by_the_allocation(
    slurm: dict[str, Any], tmp_path: Path
) -> None:
    lab: Lab = slurm["lab"]
    env = {**slurm["env"], "SLURM_JOB_NODELIST": "node3,node1"}  # a subset, in Slurm's order
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(OK_SCRIPT)
    res = run_cli_process(
        "run", "-i", str(lab.inventory_path), "--launcher", "plain",
        "--runs-dir", str(tmp_path / "runs"), "job.py",
        env=env, cwd=code, timeout=90,
    )  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    lines = sorted(
        ln.split("RANKLINE", 1)[1].split() for ln in res.stdout.splitlines() if "RANKLINE" in ln
    )
    master = lab.host("node3").mgmt_addr
    assert [(ln[0], ln[1], ln[2], ln[4], ln[5]) for ln in lines] == [
        ("0", "node3", "node3", master, "2"),
        ("1", "node1", "node1", master, "2"),
    ]


def test_a_stall_inside_the_allocation_dumps_every_ranks_stack(
    slurm: dict[str, Any], tmp_path: Path
) -> None:
    """Rank 1 blocks in a function while its peers wait in gloo's all-reduce: --stall-timeout
    reaches the nodes through srun steps, dumps every rank's stack (py-spy on the node), stops
    the job everywhere and brings the dumps home."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(ROOT / "examples" / "ddp_train.py", code / "ddp_train.py")
    runs = tmp_path / "runs"
    res = run_cli_process(
        "run", "--launcher", "torchrun", "--backend", "gloo", "--grace", "3",
        "--stall-timeout", "6", "--runs-dir", str(runs), "ddp_train.py",
        "--epochs", "1", "--steps", "50", "--hang-rank", "1", "--hang-step", "2",
        env=slurm["env"], cwd=code, timeout=120,
    )  # fmt: skip
    err = res.stderr.splitlines()
    assert res.exit_code == 3, res.stdout + res.stderr
    folded = err[err.index("where every rank was (innermost Python frame):") + 1 :]
    assert any(re.match(r"  rank 1: stuck_loading_batch \(ddp_train\.py:\d+\)$", x) for x in folded)
    folder = next(p for p in runs.iterdir() if p.is_dir())
    job = json.loads((folder / "job.json").read_text())
    assert job["verdict"].startswith("stalled: no progress on any node for "), job["verdict"]
    assert {n["host"]: n["methods"] for n in job["stack_nodes"]} == {
        f"node{i}": {"py-spy": 2}
        for i in (1, 2, 3)  # torchrun's agent and its worker
    }
    lab: Lab = slurm["lab"]
    for rank, h in enumerate(lab.hosts):  # the dumps came home; nothing left on the node
        assert list((folder / f"{rank}-{h.name}" / "stacks").glob("*.txt")), rank
        ps = lab.exec(h.name, ["ps", "-eo", "args"], check=True).stdout
        assert "ddp_train.py" not in ps, (h.name, ps)


def test_a_node_whose_slurmd_dies_and_link_is_cut_is_lost(
    slurm: dict[str, Any], tmp_path: Path
) -> None:
    """node3's slurmd is killed and its cable pulled mid-DDP (gloo): fleetctl names node3 lost
    as the first failure, stops the rest (no process, no step of theirs left), brings their
    logs home, exit 3. Last in the module: the allocation does not survive it."""
    lab: Lab = slurm["lab"]
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(ROOT / "examples" / "ddp_train.py", code / "ddp_train.py")
    runs = tmp_path / "runs"
    proc = start_cli_process(
        "run", "--launcher", "torchrun", "--backend", "gloo", "--lost-timeout", "3",
        "--runs-dir", str(runs), "ddp_train.py", "--epochs", "1", "--steps", "2000",
        "--sleep-per-step", "0.1",
        env=slurm["env"], cwd=code,
    )  # fmt: skip
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: sum("start rank=" in ln for ln in out) == 3, 120, what="3 ranks")
        slurm["slurm"].kill_slurmd("node3")
        lab.cut_link("node3")
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 3, "".join(out) + err
    folder = next(p for p in runs.iterdir() if p.is_dir())
    job = json.loads((folder / "job.json").read_text())
    ff = job["first_failure"]
    assert (ff["host"], ff["state"]) == ("node3", "lost"), ff
    for i, h in enumerate(lab.hosts[:2]):  # the rest: stopped, nothing left, logs home
        ps = lab.exec(h.name, ["ps", "-eo", "args"], check=True).stdout
        assert "ddp_train.py" not in ps and "torchrun" not in ps, (h.name, ps)
        assert (folder / f"{i}-{h.name}" / "console.log").stat().st_size > 0

    def no_steps_on_the_rest() -> bool:
        p = subprocess.run(
            ["squeue", "-h", "-s", "-j", slurm["job"], "-o", "%N"],
            capture_output=True, text=True, env=slurm["slurm"].env(), timeout=10,
        )  # fmt: skip
        return p.returncode == 0 and not ({"node1", "node2"} & set(p.stdout.split()))

    wait_for(no_steps_on_the_rest, 15, what="node1's and node2's srun steps gone")
