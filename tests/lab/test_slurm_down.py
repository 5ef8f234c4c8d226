"""A node Slurm marks down is lost by Slurm's word (lab: a real Slurm with ``SlurmdTimeout=10``).

node3's slurmd is killed and its cable pulled while a job runs on node1..3. ``--lost-timeout``
is 60 s (its most) and the ranks are independent sleepers, so nothing but Slurm's node state
(``NOT_RESPONDING`` ~15 s after the cut) can end the job within the test's limits: fleetctl
names node3 lost quoting Slurm, stops the rest, brings their logs home, exit 3. Each test gets
its own lab: the allocation, and node3, do not survive it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.lab.core import Lab
from fleetctl.lab.slurm import SlurmLab, installed
from fleetctl.testing.cli_runner import start_cli_process
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
SLEEP_SCRIPT = """\
import os, time
print("started", os.environ["RANK"], flush=True)
time.sleep(600)  # fleetctl_slurm_sleeper
"""
SLURM_SAYS = 45.0  # s from the cut: Slurm's NOT_RESPONDING (~15 s), with room for a busy host


@pytest.fixture
def slurm(make_lab: Callable[..., Lab]) -> Iterator[dict[str, Any]]:
    why = installed()
    if why:
        skip_or_fail(f"Slurm {why} (.ci/run installs slurm-wlm and munge)")
    lab = make_lab(3, user=None, shared_home=False)
    s = SlurmLab.start(lab, slurmd_timeout=10)  # stopped by lab.down by PID
    code = lab.dir / "code"  # seen by every host, as a shared home is
    code.mkdir()
    (code / "sleep.py").write_text(SLEEP_SCRIPT)
    try:
        yield {"lab": lab, "slurm": s, "code": code}
    finally:
        shutil.rmtree(code, ignore_errors=True)
        shutil.rmtree(lab.dir / "runs", ignore_errors=True)


def _squeue(s: SlurmLab, *args: str) -> str:
    p = subprocess.run(
        ["squeue", "-h", *args], capture_output=True, text=True, env=s.env(), timeout=10
    )
    return p.stdout.strip()


def _run_and_pull_node3(slurm: dict[str, Any], args: list[str], env: dict[str, str]) -> Any:
    """Start ``fleetctl run ARGS``; once 3 ranks run, kill node3's slurmd and cut its link;
    (exit code, stdout, stderr, seconds from the cut to the end)."""
    lab: Lab = slurm["lab"]
    proc = start_cli_process(
        "run", "--runs-dir", str(lab.dir / "runs"), "--launcher", "plain",
        "--lost-timeout", "60", *args, "sleep.py",
        env=env, cwd=slurm["code"], start_new_session=True,
    )  # fmt: skip
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: sum("started" in ln for ln in out) == 3, 90, what="3 ranks started")
        slurm["slurm"].kill_slurmd("node3")
        lab.cut_link("node3")
        cut = time.monotonic()
        _, err = proc.communicate(timeout=120)
        took = time.monotonic() - cut
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    reader.join(5)
    return proc.returncode, "".join(out), err, took


def _folder(lab: Lab) -> Path:
    folders = [p for p in (lab.dir / "runs").iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def _node3_lost_by_slurm_and_the_rest_clean(lab: Lab, folder: Path) -> None:
    job = json.loads((folder / "job.json").read_text())
    ff = job["first_failure"]
    assert (ff["host"], ff["state"]) == ("node3", "lost"), ff
    assert ff["reason"].startswith("Slurm marked node3 "), ff  # not "no heartbeat for 60s"
    assert "NOT_RESPONDING" in ff["reason"] or "DOWN" in ff["reason"], ff
    for i, h in enumerate(lab.hosts[:2]):  # the rest: stopped, nothing left, logs home
        ps = lab.exec(h.name, ["ps", "-eo", "args"], check=True).stdout
        assert "fleetctl_slurm_sleeper" not in ps and "sleep.py" not in ps, (h.name, ps)
        assert f"started {i}" in (folder / f"{i}-{h.name}" / "console.log").read_text()


def test_inside_an_allocation_a_node_slurm_marks_down_is_lost_at_once(
    slurm: dict[str, Any],
) -> None:
    lab: Lab = slurm["lab"]
    s: SlurmLab = slurm["slurm"]
    job, nodelist = s.allocate(3, "--no-kill")  # Slurm's kill at DOWN would race the teardown
    try:
        env = {"SLURM_CONF": str(s.conf), "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist}
        code, out, err, took = _run_and_pull_node3(slurm, [], env)
        assert code == 3, out + err
        assert "node 2 (node3) failed first: lost (Slurm marked node3 " in err, err
        assert took < SLURM_SAYS, took
        _node3_lost_by_slurm_and_the_rest_clean(lab, _folder(lab))

        def no_steps_on_the_rest() -> bool:
            nodes = _squeue(s, "-s", "-j", job, "-o", "%N").split()
            return not ({"node1", "node2"} & set(nodes))

        wait_for(no_steps_on_the_rest, 15, what="node1's and node2's srun steps gone")
    finally:
        s.cancel(job)


def test_submitted_with_slurm_a_lost_node_ends_the_job_exit_3_naming_it(
    slurm: dict[str, Any],
) -> None:
    """The --slurm variant: the batch script (on node1) runs fleetctl, which loses node3 by
    Slurm's word; the submitter ends with exit 3 naming node3, the Slurm job gone."""
    lab: Lab = slurm["lab"]
    s: SlurmLab = slurm["slurm"]
    env = {"SLURM_CONF": str(s.conf), "PYTHONPATH": str(ROOT)}
    code, out, err, _ = _run_and_pull_node3(slurm, ["--slurm", "--nodes", "3"], env)
    assert code == 3, out + err
    last = err.strip().splitlines()[-1]
    assert last.startswith("fleetctl: error: job ") and "node 2 (node3)" in last, err
    assert "lost (Slurm marked node3 " in last, err
    folder = _folder(lab)
    _node3_lost_by_slurm_and_the_rest_clean(lab, folder)
    slurm_job = str(json.loads((folder / "slurm.json").read_text())["job_id"])
    assert _squeue(s, "-j", slurm_job) == "" and _squeue(s, "-s", "-j", slurm_job) == ""
