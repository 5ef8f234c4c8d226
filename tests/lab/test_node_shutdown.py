"""A node shut down cleanly mid-run (``reboot``, ``shutdown``, a preemption): its service
manager SIGTERMs every process first — the job's supervisor and its ranks — so that node's part
ends (the supervisor's ``X``) before the node goes away. That end is the node's failure, not a
stop the controller asked for: the run blames that node at once, stops the others, and a retry
(the default rule ``node-stop``) runs the job again. Seen on a VM's ``reboot`` (tests/vms)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.jobs import killed_at_exit, node_record, on_node, start_running

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]

# Ticks for N s; a second attempt (its job id ends .2) only ticks twice.
TICK = """\
import os, sys, time
rank = os.environ["FLEET_NODE_RANK"]
n = 2 if os.environ["FLEET_JOB_ID"].endswith(".2") else int(sys.argv[1]) * 5
for i in range(n):
    print(f"tick rank={rank} i={i}", flush=True)
    time.sleep(0.2)
"""


def test_a_node_that_sigterms_its_supervisor_is_blamed_and_retried(
    lab3: Lab, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "tick.py").write_text(TICK)
    runs = tmp_path / "runs"
    inv = lab3.inventory_path
    argv = ["run", "-i", str(inv), "--launcher", "plain", "--nproc-per-node", "1", "--no-check",
            "--grace", "2", "--runs-dir", str(runs), "--code-dir", str(code),
            "--max-retries", "1", "--retry-backoff", "0.1",
            str(code / "tick.py"), "120"]  # fmt: skip
    proc, job_id = start_running(argv, runs, 3, cwd=ROOT)
    with killed_at_exit(proc):
        sup = node_record(inv, job_id, 1, "node2", "supervisor.json")
        # what systemd does on `reboot`: SIGTERM to every process of the session, at once
        on_node(inv, "node2", f"kill -TERM {int(sup['supervisor_pid'])} {int(sup['pid'])}")
        _out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    job = json.loads((runs / job_id / "job.json").read_text())
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"], ff["state"], ff["signal"]) == (1, "node2", "failed", 15), ff
    assert [n["state"] for n in job["nodes"]] == ["stopped", "failed", "stopped"], job["nodes"]
    assert job["nodes"][1]["reason"] == "stopped on the node: supervisor got SIGTERM", job
    attempts = json.loads((runs / job_id / "attempts.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "succeeded"], attempts
    assert attempts[0]["decision"] == "retry: retry on node-stop (default)", attempts[0]
    assert "node2" in err and "supervisor got SIGTERM" in err, err
