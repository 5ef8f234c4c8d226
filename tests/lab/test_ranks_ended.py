"""A launcher that takes longer than ``--stall-timeout`` to shut down after its ranks ended is
not a stall: every node's supervisor says ``A`` as its last rank ends (fleetctl/remote/kit/
supervision.py), which restarts the stall clock as a node's end does and, the ranks having
exited 0, gives the shut-down the "stalled finishing" limit (at least 300 s).

The launcher is torchrun's module path shadowed by a stand-in in the job's code folder
(``python -m torch.distributed.run`` runs ``./torch/distributed/run.py`` from the job's cwd):
it starts each local rank with LOCAL_RANK as torchrun does, waits for them, then lingers, as
torchrun's exit barrier does for a slower node. No torch: the job starts in a second or two.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
LINGER = 8  # s the launcher shuts down for, past the 3 s --stall-timeout

LAUNCHER = f"""\
import os, subprocess, sys, time
args = sys.argv[1:]
nproc = int(next(a for a in args if a.startswith("--nproc-per-node=")).split("=")[1])
program = args[next(i for i, a in enumerate(args) if not a.startswith("--")):]
ranks = [
    subprocess.Popen([sys.executable, *program], env=dict(os.environ, LOCAL_RANK=str(i)))
    for i in range(nproc)
]
codes = [r.wait() for r in ranks]
print("launcher: ranks ended", codes, "- shutting down", flush=True)
time.sleep({LINGER})
sys.exit(max(codes))
"""

RANK = """\
import os, time
with open(os.environ["FLEET_PROGRESS_FILE"], "a"):  # the job began: the stall clock runs
    pass
os.utime(os.environ["FLEET_PROGRESS_FILE"])
time.sleep(1.5)  # long enough for the supervisor's scan to know it as a rank
print("rank", os.environ["LOCAL_RANK"], "done", flush=True)
"""


def test_a_launcher_shutting_down_longer_than_the_stall_timeout_after_its_ranks_ended_is_no_stall(
    lab3: Lab, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    (code / "torch" / "distributed").mkdir(parents=True)
    (code / "torch" / "__init__.py").write_text("")
    (code / "torch" / "distributed" / "__init__.py").write_text("")
    (code / "torch" / "distributed" / "run.py").write_text(LAUNCHER)
    (code / "rank.py").write_text(RANK)
    runs = tmp_path / "runs"
    r = run_cli(
        *("run", "-i", str(lab3.inventory_path), "--launcher", "torchrun"),
        *("--nproc-per-node", "2", "--no-check", "--grace", "2", "--stall-timeout", "3"),
        *("--runs-dir", str(runs), "--code-dir", str(code), str(code / "rank.py")),
        cwd=ROOT,
    )
    assert runs.is_dir(), r.stderr[-2000:]
    [job_dir] = list(runs.iterdir())
    job = json.loads((job_dir / "job.json").read_text())
    assert (r.exit_code, job["status"], job.get("verdict")) == (0, "succeeded", None), (
        f"{r.stderr[-2000:]}\n{job.get('verdict')}"
    )
    assert [n["state"] for n in job["nodes"]] == ["succeeded"] * 3
    for node in job["nodes"]:
        folder = job_dir / node["folder"] if node.get("folder") else None
        console = (folder / "console.log").read_text() if folder else ""
        assert "launcher: ranks ended [0, 0]" in console, console
        ended = json.loads((folder / "ranks_ended.json").read_text()) if folder else {}
        assert (ended.get("ranks"), ended.get("failed")) == (2, 0), ended
