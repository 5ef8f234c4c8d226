"""A slow node in a job whose nodes progress independently, named from the progress its
ranks print, with no change to the script: three ``--launcher plain`` nodes each run their
own loop printing pytorch/examples mnist's ``Train Epoch: E [N/TOTAL (P%)]`` lines; one host's
steps take 4× longer (a sleep: no cgroup cap, no busier CPU, so the pace judge has nothing
to see). It is named within the window, live and in job.json with its progress figures,
no healthy host is, and ``--on-slow stop`` ends the job with it as the first failure,
nothing left on any host."""

from __future__ import annotations

import json
import time

import pytest

from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.jobs import assert_nothing_left, launched_job_id, slow_warnings

pytestmark = pytest.mark.lab

# Independent loops: 64 samples a step, 100 steps an epoch; argv[1]'s host steps 4x slower.
LOOPS = """\
import socket, sys, time
step_s = 0.4 if socket.gethostname() == sys.argv[1] else 0.1
end, epoch, step = time.time() + 60, 1, 0
while time.time() < end:
    time.sleep(step_s)
    step += 1
    if step == 100:
        epoch, step = epoch + 1, 0
    print(f"Train Epoch: {epoch} [{step * 64}/6400 ({step}%)]\\tLoss: 0.301", flush=True)
"""


def test_a_node_whose_loop_falls_behind_is_named_from_its_progress_and_stopped(
    make_lab, tmp_path
) -> None:
    lab = make_lab(3)
    slow = lab.hosts[1].name
    code, runs = tmp_path / "code", tmp_path / "runs"
    code.mkdir()
    (code / "loops.py").write_text(LOOPS)
    res = run_cli(
        *["run", "-i", str(lab.inventory_path), "--launcher", "plain", "--no-check"],
        *["--runs-dir", str(runs), "--code-dir", str(code), "--on-slow", "stop"],
        *["--timeout", "90", "--grace", "1", "--no-post-mortem"],
        *[str(code / "loops.py"), slow],
        env={"FLEETCTL_SSH_CONFIG": "/dev/null"},
    )
    out = res.stdout + res.stderr
    assert res.exit_code == 3, out
    job_id = launched_job_id(res.stderr)
    folder = runs / job_id
    warned, after = slow_warnings(folder)
    assert len(warned) == 1, warned  # one node named, never a healthy one
    said = f" warning [1 {slow}] node 1 ({slow}) slows the job: its ranks progress ~"
    assert said in warned[0], warned
    assert after is not None
    assert after <= 40.0, (after, warned)  # the span (12 s) and 4 rounds, plus the start
    job = json.loads((folder / "job.json").read_text())
    slow_rec = job["slow"]
    assert (slow_rec["rank"], slow_rec["host"]) == (1, slow), slow_rec
    assert slow_rec["busy"] is None and slow_rec["stacks"] is None, slow_rec
    p = slow_rec["progress"]
    assert p["shape"] == "mnist" and p["unit"] == "samples", p
    assert 2.5 <= slow_rec["compute_ratio"] <= 6.0, slow_rec  # 4x by the script's sleeps
    assert "× slower (samples " in slow_rec["why"], slow_rec
    assert job["first_failure"]["host"] == slow, job["first_failure"]
    assert job["culprits"] == [f"{slow}: slow: {slow_rec['why']}"]
    assert f"failed first: slows the job ({slow_rec['why']})" in res.stderr, res.stderr
    assert_nothing_left(lab.inventory_path, job_id)
    listed = json.loads(run_cli("health", "--json").stdout)["hosts"]
    assert [e["host"] for e in listed] == [slow], listed
    run_cli("health", "--clear-all")


def test_a_detached_jobs_monitor_names_the_node_whose_loop_falls_behind_and_stops_it(
    make_lab, tmp_path
) -> None:
    """Detached, nobody reads the lines as they come: each supervisor counts its ranks'
    markers and reports them with its pace reports (pace.json), and the job's monitor judges
    them as an attached run judges its lines: the slow host named (events.log, job.json, the
    ledger) and, with ``--on-slow stop``, the job ended with it as its first failure."""
    lab = make_lab(3)
    slow = lab.hosts[1].name
    code, runs = tmp_path / "code", tmp_path / "runs"
    code.mkdir()
    (code / "loops.py").write_text(LOOPS)
    started = time.monotonic()
    res = run_cli(
        *["run", "-i", str(lab.inventory_path), "--launcher", "plain", "--no-check"],
        *["--runs-dir", str(runs), "--code-dir", str(code), "--on-slow", "stop"],
        *["--detach", "--slow-rounds", "2", "--timeout", "90", "--grace", "1"],
        *[str(code / "loops.py"), slow],
        env={"FLEETCTL_SSH_CONFIG": "/dev/null"},
    )
    assert res.exit_code == 0, res.stdout + res.stderr
    job_id = launched_job_id(res.stderr)
    folder = runs / job_id
    try:
        while True:
            job = json.loads((folder / "job.json").read_text())
            if job["status"] not in ("running", "launching", "starting", "detached"):
                break
            # the job's own --timeout 90 ends it; a minute counted the launch too, which a
            # loaded machine stretches (the time to name is printed below)
            assert time.monotonic() - started < 90 + 30, (folder / "events.log").read_text()
            time.sleep(0.5)
    finally:
        if job["status"] in ("running", "launching", "starting", "detached"):
            run_cli("stop", "--runs-dir", str(runs), job_id, "--grace", "0")
    events = (folder / "events.log").read_text()
    assert job["status"] == "failed", (job, events)
    warned, after = slow_warnings(folder)
    assert len(warned) == 1, warned  # one node named, never a healthy one
    said = f"monitor warning [1 {slow}] node 1 ({slow}) slows the job: its ranks progress ~"
    assert said in warned[0], warned
    print(f"named {after:.1f} s after the launch")
    slow_rec = job["slow"]
    assert (slow_rec["rank"], slow_rec["host"]) == (1, slow), slow_rec
    assert slow_rec["progress"]["shape"] == "mnist" and slow_rec["stacks"] is None, slow_rec
    assert 2.5 <= slow_rec["compute_ratio"] <= 6.0, slow_rec  # 4x by the script's sleeps
    assert job["first_failure"]["host"] == slow, job["first_failure"]
    assert_nothing_left(lab.inventory_path, job_id)
    listed = json.loads(run_cli("health", "--json").stdout)["hosts"]
    assert [e["host"] for e in listed] == [slow], listed
    run_cli("health", "--clear-all")
