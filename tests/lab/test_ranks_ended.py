"""A launcher that takes longer than ``--stall-timeout`` to shut down after its ranks ended is
not a stall: every node's supervisor says ``A`` as its last rank ends (fleetctl/remote/kit/
supervision.py), which restarts the stall clock as a node's end does and, the ranks having
exited 0, gives the shut-down the "stalled finishing" limit (at least 300 s).

The launcher is torchrun's module path shadowed by a stand-in in the job's code folder
(``python -m torch.distributed.run`` runs ``./torch/distributed/run.py`` from the job's cwd):
it starts each local rank with LOCAL_RANK as torchrun does, waits for them, then lingers, as
torchrun's exit barrier does for a slower node. No torch: the job starts in a second or two.

The ``A`` must not be lost with a channel either: a node's rank that ends while its link is cut
says it into the dead channel, and the controller, back over a new connection, hears it from
``reattach`` (from ranks_ended.json).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli, start_cli_process
from fleetctl.testing.wait import wait_for

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
time.sleep(float(os.environ.get("LINGER", "{LINGER}")))
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


CUT_RANK = """\
import os, time
with open(os.environ["FLEET_PROGRESS_FILE"], "a"):
    pass
os.utime(os.environ["FLEET_PROGRESS_FILE"])
time.sleep(2)  # the touch's P (at the supervisor's next heartbeat) before our line: begun
print("rank ready", flush=True)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:  # the host's own /sys: its eth0 reads down once cut
    with open("/sys/class/net/eth0/operstate") as f:
        if f.read().strip() != "up":
            break
    time.sleep(0.05)
print("rank ended with the link down", flush=True)
"""


def test_the_ranks_end_said_while_the_link_was_cut_reaches_the_controller_over_the_new_connection(
    lab3: Lab, tmp_path: Path
) -> None:
    """The node's rank ends while its management link is cut: the supervisor's ``A`` goes
    into the dead channel. The link heals before --lost-timeout, the controller reattaches,
    and ``reattach`` says ``A`` again: the launcher's 16 s shut-down, past --stall-timeout
    (8 s), is shut-down, not a stall (it was taken for one when the ``A`` was lost)."""
    code = tmp_path / "code"
    (code / "torch" / "distributed").mkdir(parents=True)
    (code / "torch" / "__init__.py").write_text("")
    (code / "torch" / "distributed" / "__init__.py").write_text("")
    (code / "torch" / "distributed" / "run.py").write_text(LAUNCHER)
    (code / "rank.py").write_text(CUT_RANK)
    runs = tmp_path / "runs"
    p = start_cli_process(
        *("run", "-i", str(lab3.inventory_path), "--launcher", "torchrun", "--nodes", "1"),
        *("--nproc-per-node", "1", "--no-check", "--grace", "2", "--stall-timeout", "8"),
        *("--lost-timeout", "6", "--env-var", "LINGER=16"),
        *("--runs-dir", str(runs), "--code-dir", str(code), str(code / "rank.py")),
        cwd=ROOT,
    )
    out: list[str] = []
    assert p.stdout is not None and p.stderr is not None
    reader = threading.Thread(target=lambda: out.extend(p.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        line = wait_for(
            lambda: next((x for x in list(out) if x.rstrip().endswith("rank ready")), None),
            60, what="the rank's start", detail=lambda: "".join(out)[-2000:],
        )  # fmt: skip
        host = str(line).split("]")[0].split()[-1]  # "[0 node1] rank ready"
        lab3.cut_link(host)
        try:
            time.sleep(3.5)  # past half --lost-timeout: a new connection is being tried
        finally:
            lab3.heal_link(host)
        assert p.wait(90) == 0, "".join(out)[-2000:] + p.stderr.read()[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    reader.join(10)
    err = p.stderr.read()
    # once: the new channel's heartbeats carry the quiet shut-down (no reattach every 3 s)
    assert err.count("back over a new connection") == 1, err[-3000:]
    [job_dir] = list(runs.iterdir())
    job = json.loads((job_dir / "job.json").read_text())
    assert (job["status"], job.get("verdict")) == ("succeeded", None), err[-3000:]
    [node] = job["nodes"]
    folder = job_dir / node["folder"]
    assert "rank ended with the link down" in (folder / "console.log").read_text()
    ended = json.loads((folder / "ranks_ended.json").read_text())
    assert (ended["ranks"], ended["failed"]) == (1, 0), ended
