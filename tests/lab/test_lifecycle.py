"""Job lifecycle on the 3-host lab: detach + runs/status/logs/stop, retries, task roles.

Runs the CLI in-process through its entry (``fleetctl.testing.cli_runner``), and as a real
process where one is needed (``run --detach``, signals, ``logs --follow``, ``monitor``); plain
Python scripts (no torch), so each job starts in a few seconds. "Nothing left" is checked on
every host over SSH by job id in /proc (``fleetctl.testing.infra.node_leftovers``, the
testinfra helper).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from fleetctl.job.monitor.process import monitor_alive
from fleetctl.lab import Lab
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import CliResult, run_cli, run_cli_process, start_cli_process
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.testing.jobs import killed_at_exit, start_running, stop_job
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("node1", "node2", "node3")

TICK = """\
import os, sys, time
rank = os.environ["FLEET_NODE_RANK"]
for i in range(int(sys.argv[1]) * 5):
    print(f"tick rank={rank} i={i}", flush=True)
    time.sleep(0.2)
"""

# Node rank 1 fails (exit 1) after ~2 s; every other rank ticks until stopped.
FAIL_ON_1 = """\
import os, sys, time
rank = int(os.environ["FLEET_NODE_RANK"])
t0 = time.time()
i = 0
while True:
    print(f"tick rank={rank} i={i}", flush=True)
    if rank == 1 and time.time() - t0 >= 2:
        print("rank 1 fails on purpose", flush=True)
        sys.exit(1)
    i += 1
    time.sleep(0.2)
"""

# Prints one line, then waits in a function forever without a word: a hung job.
SILENT = """\
import os, time
print(f"silent rank={os.environ['FLEET_NODE_RANK']}", flush=True)
def silently_waiting():
    time.sleep(600)
silently_waiting()
"""

# Never says a word: a start-up that does not end.
NEVER = """\
import time
def loading_a_large_model():
    time.sleep(600)
loading_a_large_model()
"""

# Fails once on node rank 1 (marker in the host's private /tmp), then succeeds.
FLAKY = """\
import os, sys
mode, marker = sys.argv[1], sys.argv[2]
rank = int(os.environ["FLEET_NODE_RANK"])
print(f"attempt job={os.environ['FLEET_JOB_ID']} rank={rank}", flush=True)
if rank == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    if mode == "nccl":
        print("[E] ProcessGroupNCCL: NCCL timeout after 600000 ms", flush=True)
        sys.exit(1)
    if mode == "kill":
        sys.exit(137)
    raise ValueError("a bug in user code")
print(f"ok rank={rank}", flush=True)
"""

# pytorch/examples' habit: data read from a folder beside the script, a snapshot written to
# a relative path and resumed from after a restart
RESUME = """\
import os, sys
rank = int(os.environ["FLEET_NODE_RANK"])
data = open("data/input.txt").read().split()
snap = f"snapshot-{rank}.txt"  # one per rank: on a shared home every node has this folder
step = int(open(snap).read()) if os.path.exists(snap) else 0
print(f"rank={rank} cwd={os.getcwd()} start at step {step}", flush=True)
while step < len(data):
    step += 1
    with open(snap + ".tmp", "w") as f:
        f.write(str(step))
    os.replace(snap + ".tmp", snap)
    if step == 3 and rank == 1 and not os.path.exists("died-once"):
        open("died-once", "w").close()
        sys.exit(137)
print(f"rank={rank} done at step {step}: {data[step - 1]}", flush=True)
"""

SERVER = """\
import os, socket
port = int(os.environ["FLEET_PORT_http"])
s = socket.socket()
s.bind(("0.0.0.0", port))
s.listen(8)
print(f"server listening on {port}", flush=True)
while True:
    c, addr = s.accept()
    msg = c.recv(1024).decode()
    print(f"server got {msg!r}", flush=True)
    c.sendall(f"ack {msg}".encode())
    c.close()
"""

# Uses the OpenPAI names (--env-style pai) for the server, the fleet ones for itself.
WORKER = """\
import os, socket, time
host = os.environ["PAI_HOST_IP_server_0"]
port = int(os.environ["PAI_PORT_LIST_server_0_http"])
me = os.environ["FLEET_ROLE"] + "_" + os.environ["FLEET_ROLE_INDEX"]
mine = os.environ["FLEET_HOST_IP_" + me] + ":" + os.environ["FLEET_PORT_" + me + "_data"]
for _ in range(100):
    try:
        c = socket.create_connection((host, port), timeout=5)
        break
    except OSError:
        time.sleep(0.1)
print(f"{me} connected to {host}:{port}", flush=True)
c.sendall(f"{me} at {mine}".encode())
print(f"{me} reply {c.recv(1024).decode()!r}", flush=True)
print("env " + " ".join(f"{k}={os.environ[k]}" for k in sorted(os.environ)
                        if k.startswith(("PAI_TASK", "PAI_CURRENT", "FLEET_ROLE"))), flush=True)
"""

JOB_YML = """\
name: ps-demo
env_style: pai
roles:
  server:
    instances: 1
    command: [python3, server.py]
    ports: [http]
  worker:
    instances: 2
    script: worker.py
    ports: [data]
    min_succeeded: 2
"""


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("code")
    for name, text in (
        ("tick.py", TICK),
        ("fail_on_1.py", FAIL_ON_1),
        ("flaky.py", FLAKY),
        ("server.py", SERVER),
        ("worker.py", WORKER),
        ("job.yml", JOB_YML),
        ("silent.py", SILENT),
        ("never.py", NEVER),
        ("resume.py", RESUME),
    ):
        (d / name).write_text(text)
    (d / "data").mkdir()
    (d / "data" / "input.txt").write_text("a b c d e f\n")
    return d


def fleetctl(*args: str) -> CliResult:
    return run_cli(*args, cwd=ROOT)


def fleetctl_detach(*args: str) -> CliResult:
    """``run --detach`` as its own process: the monitor it leaves must outlive its parent."""
    assert "--detach" in args
    return run_cli_process(*args, cwd=ROOT, timeout=120)


def run_args(lab: Lab, runs: Path, code: Path, *extra: str) -> list[str]:
    return [
        "run",
        "-i",
        str(lab.inventory_path),
        "--launcher",
        "plain",
        "--nproc-per-node",
        "1",
        "--no-check",
        "--grace",
        "2",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        *extra,
    ]


def left_over(
    lab: Lab, job_id: str, hosts: tuple[str, ...] = HOSTS
) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for node in load_inventory(str(lab.inventory_path)).nodes:
        if node.name not in hosts:
            continue
        left = node_leftovers(node_host(node), job_id, workdir=node.workdir, python=node.python)
        if left.processes:
            out[node.name] = left.processes
    return out


def job_json(runs: Path, job_id: str) -> dict[str, Any]:
    return json.loads((runs / job_id / "job.json").read_text())


def monitor_of(runs: Path, job_id: str) -> dict[str, Any]:
    info = job_json(runs, job_id).get("monitor")
    assert isinstance(info, dict), job_json(runs, job_id)
    return info


def kill_monitor(runs: Path, job_id: str) -> None:
    """Test cleanup: SIGKILL the job's monitor, only while pid and start time still name it."""
    try:
        info = job_json(runs, job_id).get("monitor")
    except (OSError, ValueError):
        return
    if monitor_alive(info):
        os.kill(info["pid"], signal.SIGKILL)


def wait_ended(runs: Path, job_id: str, timeout: float) -> dict[str, Any]:
    """job.json once the job is no longer live and its monitor has exited (bounded)."""

    def ended() -> dict[str, Any] | None:
        job = job_json(runs, job_id)
        live = job["status"] in ("running", "starting", "detached")
        return None if live or monitor_alive(job.get("monitor")) else job

    return wait_for(
        ended,
        timeout,
        what=f"job {job_id} ended",
        interval=0.3,
        detail=lambda: monitor_log(runs, job_id),
    )


def detached_until_its_monitor_ends_it(
    lab: Lab, runs: Path, argv: list[str]
) -> tuple[str, dict[str, Any]]:
    """``run --detach`` and nothing else: (job id, job.json) once its monitor ended the job,
    with nothing of it left on any host; whatever happens, no monitor or job outlives the test."""
    p = fleetctl_detach(*argv)
    assert p.exit_code == 0, p.stderr
    job_id = p.stdout.strip()
    try:
        job = wait_ended(runs, job_id, timeout=60)
        assert left_over(lab, job_id) == {}
    finally:
        kill_monitor(runs, job_id)
        if left_over(lab, job_id):
            fleetctl("stop", "--runs-dir", str(runs), job_id, "--grace", "0")
    return job_id, job


def wait_job(runs: Path, job_id: str, what: str, pred: Any, timeout: float) -> dict[str, Any]:

    def matches() -> dict[str, Any] | None:
        job = job_json(runs, job_id)
        return job if pred(job) else None

    return wait_for(
        matches,
        timeout,
        what=f"job {job_id} {what}",
        interval=0.3,
        detail=lambda: f"{job_json(runs, job_id)}\n{monitor_log(runs, job_id)}",
    )


def monitor_log(runs: Path, job_id: str) -> str:
    return (runs / job_id / "monitor.log").read_text(errors="replace")[-3000:]


def claims_folder(lab: Lab) -> str:
    """Shell that makes the login's private port claim folder on a lab host as ``$d``."""
    login = lab.user or "root"
    return f'd=/tmp/fleetctl-ports-$(id -u {login}) && install -d -m 700 -o {login} "$d" && '


def runs_json(runs: Path) -> list[dict[str, Any]]:
    p = fleetctl("runs", "--runs-dir", str(runs), "--json")
    assert p.exit_code == 0, p.stderr
    return json.loads(p.stdout)


# ----------------------------------------------------------------------------- detach


@pytest.mark.login
@pytest.mark.shared_home
def test_a_detached_job_is_listed_followed_and_stopped_from_another_terminal(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    p = fleetctl_detach(*run_args(lab3, runs, code, "--detach", str(code / "tick.py"), "300"))
    assert p.exit_code == 0, p.stderr
    job_id = p.stdout.strip()
    assert (runs / job_id / "connect.json").is_file(), p.stdout + p.stderr
    try:
        monitor = monitor_of(runs, job_id)
        assert monitor_alive(monitor) and monitor["phase"] == "watching"
        assert f"watched by monitor pid {monitor['pid']}" in p.stderr
        log = runs / job_id / "monitor.log"
        assert log.stat().st_mode & 0o777 == 0o600 and str(log) in p.stderr
        # The controller is gone, the job runs on (no dead-man switch for detached jobs).
        time.sleep(1.0)
        assert sorted(left_over(lab3, job_id)) == list(HOSTS)
        [rec] = runs_json(runs)
        assert rec["job_id"] == job_id and rec["status"] == "detached" and rec["nodes"] == 3

        st = fleetctl("status", "--runs-dir", str(runs), job_id, "--json")
        assert st.exit_code == 0, st.stderr
        status = json.loads(st.stdout)
        assert [n["state"] for n in status["nodes"]] == ["running"] * 3, status
        assert all(n["detached"] and n["processes"] for n in status["nodes"])
        assert status["monitor"]["pid"] == monitor["pid"] and status["monitor"]["alive"]

        seen = _follow_until_every_rank_ticks(runs, job_id)
        assert {line.split("]")[0] + "]" for line in seen} == {
            "[0 node1]",
            "[1 node2]",
            "[2 node3]",
        }

        # Every rank's stack on demand (py-spy, shipped from here), the job untouched.
        sk = fleetctl("stacks", "--runs-dir", str(runs), job_id, "--json")
        assert sk.exit_code == 0, sk.stdout + sk.stderr
        stacks = json.loads(sk.stdout)
        assert [n["methods"] for n in stacks["nodes"]] == [{"py-spy": 1}] * 3, stacks
        # Mostly one group (in time.sleep's line), but a rank caught printing is a second
        # group of the same module: every rank is in tick.py's loop, whichever line.
        groups = stacks["stacks"]
        assert sorted(r for g in groups for r in g["ranks"]) == [0, 1, 2], stacks
        assert all(g["frame"].startswith("<module> (tick.py:") for g in groups), stacks
        assert Path(stacks["saved"]).parent == runs / job_id
        assert "pid" in Path(stacks["saved"]).read_text()
        assert sorted(left_over(lab3, job_id)) == list(HOSTS)  # still running everywhere

        stop = fleetctl("stop", "--runs-dir", str(runs), job_id, "--grace", "2")
        assert stop.exit_code == 0, stop.stdout + stop.stderr
        assert "verified: nothing left on any node" in stop.stderr
        # The stop first sent the monitor away, so the two never tore down at once.
        assert f"monitor pid {monitor['pid']} exited" in stop.stderr
        assert not monitor_alive(monitor)
    finally:
        kill_monitor(runs, job_id)
        fleetctl("stop", "--runs-dir", str(runs), job_id, "--grace", "0")
    assert left_over(lab3, job_id) == {}
    assert monitor_of(runs, job_id)["phase"] == "exited"
    events = (runs / job_id / "events.log").read_text()
    assert "stopped by a signal: the job is left running" in events
    job = job_json(runs, job_id)
    assert job["status"] == "stopped" and job["teardown"]["verified"] is True
    assert [n["state"] for n in job["nodes"]] == ["stopped"] * 3
    for rank, host in enumerate(HOSTS):
        console = (runs / job_id / f"{rank}-{host}" / "console.log").read_text()
        assert f"tick rank={rank} i=0" in console
    [rec] = runs_json(runs)
    assert rec["status"] == "stopped"
    # Collected logs are now what `logs` shows, prefixed per node.
    logs = fleetctl("logs", "--runs-dir", str(runs), job_id, "--node", "node2", "-n", "2")
    assert logs.exit_code == 0, logs.stderr
    assert [x.split(" ")[:2] for x in logs.stdout.splitlines()] == [["[1", "node2]"]] * 2


def _follow_until_every_rank_ticks(runs: Path, job_id: str) -> list[str]:
    proc = start_cli_process(
        "logs", "--runs-dir", str(runs), "--follow", "-n", "1", job_id,
        cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line.rstrip("\n"))
            ticks = {ln.split("]")[0] for ln in seen if "tick rank=" in ln}
            if len(ticks) == 3 and len(seen) >= 9:
                break
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert len({ln.split("]")[0] for ln in seen if "tick rank=" in ln}) == 3, (
        seen,
        proc.stderr.read() if proc.stderr else "",
    )
    return seen


@pytest.mark.login
@pytest.mark.shared_home
def test_a_detached_job_whose_rank_fails_is_torn_down_by_its_monitor(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """Nobody types anything after `run --detach`: the monitor sees rank 1 fail, stops the
    job on every node, brings every node's log home and records who failed first."""
    runs = tmp_path / "runs"
    job_id, job = detached_until_its_monitor_ends_it(
        lab3, runs, run_args(lab3, runs, code, "--detach", str(code / "fail_on_1.py"))
    )
    assert job["status"] == "failed", job
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"], ff["state"], ff["exit_code"]) == (1, "node2", "failed", 1)
    assert ff["time"] and ff["after"] >= 2.0
    assert [n["state"] for n in job["nodes"]] == ["stopped", "failed", "stopped"], job["nodes"]
    assert job["teardown"]["verified"] is True
    for rank, host in enumerate(HOSTS):
        console = (runs / job_id / f"{rank}-{host}" / "console.log").read_text()
        assert f"tick rank={rank} i=0" in console
    assert "rank 1 fails on purpose" in (runs / job_id / "1-node2" / "console.log").read_text()
    mon = job["monitor"]
    assert (mon["phase"], mon["outcome"]) == ("exited", "failed") and not monitor_alive(mon)
    events = (runs / job_id / "events.log").read_text()
    assert "monitor node 1 (node2) failed first: exit code 1" in events
    # the monitor wrote the report, as an attached run does, and said where
    html = (runs / job_id / "report.html").read_text()
    assert 'class="host">node2</span>' in html
    assert f"monitor report: {runs / job_id / 'report.html'}" in events
    [rec] = runs_json(runs)
    assert rec["status"] == "failed" and rec["first_failure"].startswith("node 1 (node2): exit")


@pytest.mark.login
@pytest.mark.shared_home
@pytest.mark.parametrize(
    ("opts", "script", "verdict"),
    [
        (("--timeout", "4"), ("tick.py", "300"), "timed out after 4 s"),
        (("--stall-timeout", "4"), ("silent.py",), "stalled: no progress on any node for "),
        (
            ("--stall-timeout", "2", "--startup-timeout", "6"),
            ("never.py",),
            "stalled at start-up: no progress on any node ",
        ),
    ],
    ids=["timeout", "stall", "startup"],
)
def test_a_detached_job_past_its_limit_is_stopped_by_its_monitor(
    lab3: Lab,
    tmp_path: Path,
    code: Path,
    opts: tuple[str, ...],
    script: tuple[str, ...],
    verdict: str,
) -> None:
    runs = tmp_path / "runs"
    argv = [str(code / script[0]), *script[1:]]
    _, job = detached_until_its_monitor_ends_it(
        lab3, runs, run_args(lab3, runs, code, "--detach", *opts, *argv)
    )
    assert job["status"] == "failed" and job["first_failure"] is None, job
    assert job["verdict"].startswith(verdict), job["verdict"]
    assert [n["state"] for n in job["nodes"]] == ["stopped"] * 3, job["nodes"]
    assert job["teardown"]["verified"] is True
    if script[0] == "silent.py":  # every rank's stack, dumped before the teardown, folded
        [group] = job["stacks"]
        assert group["ranks"] == [0, 1, 2], job["stacks"]
        assert group["frame"].startswith("silently_waiting (silent.py:"), group
        assert [n["methods"] for n in job["stack_nodes"]] == [{"py-spy": 1}] * 3


@pytest.mark.login
@pytest.mark.shared_home
def test_a_detached_job_that_succeeds_is_collected_by_its_monitor(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    p = fleetctl_detach(*run_args(lab3, runs, code, "--detach", str(code / "tick.py"), "2"))
    assert p.exit_code == 0, p.stderr
    job_id = p.stdout.strip()
    try:
        job = wait_ended(runs, job_id, timeout=45)
    finally:
        kill_monitor(runs, job_id)
    assert job["status"] == "succeeded" and job["first_failure"] is None, job
    assert [n["state"] for n in job["nodes"]] == ["succeeded"] * 3
    assert job["teardown"]["verified"] is True and job["monitor"]["outcome"] == "succeeded"
    for rank, host in enumerate(HOSTS):
        console = (runs / job_id / f"{rank}-{host}" / "console.log").read_text()
        assert f"tick rank={rank} i=9" in console  # the whole log: 2 s of ticks
    assert left_over(lab3, job_id) == {}


@pytest.mark.login
@pytest.mark.shared_home
def test_a_monitor_attached_by_hand_watches_a_job_started_without_one(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    p = fleetctl_detach(
        *run_args(lab3, runs, code, "--detach", "--no-monitor", str(code / "tick.py"), "2")
    )
    assert p.exit_code == 0, p.stderr
    job_id = p.stdout.strip()
    assert "no monitor (--no-monitor)" in p.stderr and "monitor" not in job_json(runs, job_id)
    proc = start_cli_process(
        "monitor", "--runs-dir", str(runs), "--poll", "0.5", job_id[:15],
        cwd=ROOT, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=45)  # it ends with the job, by itself
    finally:
        if proc.poll() is None:  # our own child: its pid cannot have been reused
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 0, out
    assert "fleetctl monitor: done: succeeded" in out
    job = job_json(runs, job_id)
    assert job["status"] == "succeeded" and job["monitor"]["pid"] == proc.pid
    assert (runs / job_id / "2-node3" / "console.log").is_file()
    assert left_over(lab3, job_id) == {}


@pytest.mark.login
@pytest.mark.shared_home
def test_a_lost_node_fails_a_detached_job_and_is_stopped_once_it_answers_again(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """node3's cable is pulled: after --monitor-lost-timeout the monitor fails the job (node 2
    lost) and stops the others; node3's detached part has no dead-man switch and runs on
    until the cable is back, when the monitor stops it there too and brings its log home."""
    runs = tmp_path / "runs"
    args = ("--detach", "--monitor-lost-timeout", "3", "--connect-timeout", "2")
    p = fleetctl_detach(*run_args(lab3, runs, code, *args, str(code / "tick.py"), "300"))
    assert p.exit_code == 0, p.stderr
    job_id = p.stdout.strip()
    try:
        lab3.cut_link("node3")
        job = wait_job(runs, job_id, "failed", lambda j: j["status"] == "failed", timeout=45)
        ff = job["first_failure"]
        assert (ff["rank"], ff["host"], ff["state"]) == (2, "node3", "lost"), ff
        assert ff["reason"].startswith("unreachable for ")
        assert [n["state"] for n in job["nodes"]] == ["stopped", "stopped", "lost"]
        assert job["teardown"]["nodes"][2]["skipped"] and not job["teardown"]["verified"]
        assert left_over(lab3, job_id, ("node1", "node2")) == {}
        # the monitor writes the report (and runs hooks) after the verdict, then chases
        job = wait_job(
            runs, job_id, "chasing", lambda j: j["monitor"]["phase"] == "chasing", timeout=30
        )
        assert monitor_alive(job["monitor"])
        lab3.heal_link("node3")
        job = wait_ended(runs, job_id, timeout=45)
        assert left_over(lab3, job_id) == {}
    finally:
        kill_monitor(runs, job_id)
        lab3.reset_faults()
        if left_over(lab3, job_id):
            fleetctl("stop", "--runs-dir", str(runs), job_id, "--grace", "0")
    assert job["status"] == "failed" and job["first_failure"]["rank"] == 2
    assert job["teardown"]["verified"] is True and job["nodes"][2]["collected"] is True
    assert job["nodes"][2]["reason"].endswith("stopped when it answered again")
    assert "tick rank=2 i=0" in (runs / job_id / "2-node3" / "console.log").read_text()
    events = (runs / job_id / "events.log").read_text()
    assert "monitor node 2 (node3) did not answer" in events
    assert "monitor lost node 2 (node3) answers again; job stopped there" in events


@pytest.mark.login
@pytest.mark.shared_home
def test_stop_from_another_terminal_interrupts_an_attached_run(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    argv = run_args(lab3, runs, code, str(code / "tick.py"), "300")
    proc, job_id = start_running(argv, runs, 3, cwd=ROOT)
    with killed_at_exit(proc):
        stop_job(runs, job_id)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped by `fleetctl stop`" in err
    assert "FAILED FIRST" not in err and "Interrupted: job " in err
    job = job_json(runs, job_id)
    assert job["status"] == "interrupted" and job["first_failure"] is None
    assert [n["state"] for n in job["nodes"]] == ["stopped"] * 3
    assert left_over(lab3, job_id) == {}


# ----------------------------------------------------------------------------- retries


# The node side is the same for both (a rank ends, attempt 2 runs in the job's work folder);
# the rule that matches (a log line, an exit code) is the controller's: one for the passes.
@pytest.mark.parametrize(
    "mode", ["nccl", pytest.param("kill", marks=[pytest.mark.login, pytest.mark.shared_home])]
)
def test_a_retryable_failure_is_retried_and_attempt_2_succeeds(
    lab3: Lab, tmp_path: Path, code: Path, mode: str
) -> None:
    runs = tmp_path / "runs"
    marker = f"/tmp/fleet-retry-{uuid.uuid4().hex}"
    p = fleetctl(
        *run_args(
            lab3,
            runs,
            code,
            "--max-retries",
            "2",
            "--retry-backoff",
            "0.2",
            str(code / "flaky.py"),
            mode,
            marker,
        )
    )
    assert p.exit_code == 0, p.stdout + p.stderr
    [rec] = runs_json(runs)
    job_id = rec["job_id"]
    assert rec["status"] == "succeeded" and rec["attempts"] == 2
    attempts = json.loads((runs / job_id / "attempts.json").read_text())["attempts"]
    assert [(a["attempt"], a["status"], a["retried"]) for a in attempts] == [
        (1, "failed", True),
        (2, "succeeded", False),
    ]
    why = "log:NCCL" if mode == "nccl" else "exit:137"
    assert attempts[0]["decision"].startswith("retry: ") and why in attempts[0]["decision"]
    assert attempts[0]["ended_by"].startswith("node 1 (node2)")
    assert job_json(runs, job_id)["first_failure"]["rank"] == 1
    second = job_json(runs, f"{job_id}.2")
    assert second["status"] == "succeeded" and second["attempt"] == 2
    console = (runs / f"{job_id}.2" / "1-node2" / "console.log").read_text()
    assert f"attempt job={job_id}.2 rank=1" in console and "ok rank=1" in console
    assert "attempt 1 failed" in p.stderr and "attempt 2 of 3" in p.stderr
    assert left_over(lab3, job_id) == {} and left_over(lab3, f"{job_id}.2") == {}


@pytest.mark.login
@pytest.mark.shared_home
def test_a_relative_snapshot_survives_the_retry_in_the_jobs_work_folder(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """The script reads ``data/`` beside it and resumes from ``snapshot-<rank>.txt``, both relative
    paths: attempt 2 runs in the same work folder (a copy of the code), so it resumes where
    attempt 1 stopped; each attempt's logs stay in its own run folder, and the shared code
    snapshot never sees the job's files."""
    runs = tmp_path / "runs"
    args = run_args(lab3, runs, code, "--max-retries", "1", "--retry-backoff", "0.2")
    p = fleetctl(*args, str(code / "resume.py"))
    assert p.exit_code == 0, p.stdout + p.stderr
    [rec] = runs_json(runs)
    job_id = rec["job_id"]
    assert rec["attempts"] == 2
    first = (runs / job_id / "1-node2" / "console.log").read_text()
    second = (runs / f"{job_id}.2" / "1-node2" / "console.log").read_text()
    assert "start at step 0" in first and "done" not in first
    assert "start at step 3" in second and "done at step 6: f" in second
    [work] = re.findall(r"cwd=(\S+) start", second)
    assert work.endswith(f"/.fleetctl/work/{job_id}") and f"cwd={work} " in first
    node = next(n for n in load_inventory(str(lab3.inventory_path)).nodes if n.name == "node2")
    h = node_host(node)
    assert h.file(f"{work}/snapshot-1.txt").content_string == "6"
    code_dir = json.loads((runs / job_id / "plan.json").read_text())["nodes"][0]["code_dir"]
    snapshot = work.rsplit("/work/", 1)[0] + "/" + code_dir.split("/.fleetctl/", 1)[1]
    assert h.file(f"{snapshot}/data/input.txt").exists  # the pushed code, untouched:
    assert not h.file(f"{snapshot}/snapshot-1.txt").exists


def run_and_crash(
    lab: Lab, runs: Path, args: list[str], rank: int, *, boot: bool, boot_on: str | None = None
) -> tuple[int, str]:
    """``fleetctl run ARGS`` as a process; once attempt 1 runs on node ``rank``, that host
    crashes (and boots again with ``boot``; with ``boot_on``, only a second after a line of
    fleetctl's stderr says it). Returns exit code and stderr."""
    host = f"node{rank + 1}"
    proc = start_cli_process(*args, cwd=ROOT, start_new_session=True)
    if boot_on is not None:
        return _crash_and_boot_on(lab, runs, proc, rank, boot_on)
    try:

        def running() -> bool:
            for job in runs.glob("*/job.json"):
                with contextlib.suppress(ValueError, OSError, IndexError):
                    if json.loads(job.read_text())["nodes"][rank]["state"] == "running":
                        return True
            return False

        wait_for(running, 60, what=f"attempt 1 running on {host}", interval=0.2)
        lab.crash_host(host)
        if boot:
            lab.boot_host(host)
        _out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode, err


def _crash_and_boot_on(
    lab: Lab, runs: Path, proc: subprocess.Popen[str], rank: int, boot_on: str
) -> tuple[int, str]:
    host = f"node{rank + 1}"
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if boot_on in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_for(lambda: _running(runs, rank), 60, what=f"attempt 1 on {host}", interval=0.2)
        lab.crash_host(host)
        assert seen.wait(120), "".join(lines[-30:])
        time.sleep(1.0)  # the retry meets a host that refuses SSH, and waits
        lab.boot_host(host)
        proc.wait(180)
        reader.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode, "".join(lines)


def _running(runs: Path, rank: int) -> bool:
    for job in runs.glob("*/job.json"):
        with contextlib.suppress(ValueError, OSError, IndexError):
            if json.loads(job.read_text())["nodes"][rank]["state"] == "running":
                return True
    return False


@pytest.mark.login
@pytest.mark.shared_home
def test_the_only_retry_waits_for_a_host_still_booting_and_succeeds_on_it(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """node3 crashes mid-run and is still down when the one retry (--max-retries 1) begins:
    the retry waits for it to answer SSH again (--reboot-timeout) instead of failing before
    launch on a refused connection, and succeeds on it once it booted."""
    runs = tmp_path / "runs"
    args = run_args(lab3, runs, code, "--max-retries", "1", "--retry-backoff", "0.2")
    args += ["--lost-timeout", "3", str(code / "tick.py"), "4"]
    code, err = run_and_crash(lab3, runs, args, 2, boot=True, boot_on="to answer SSH again")
    assert code == 0, err
    assert "waiting up to 300s for node3 to answer SSH again (a reboot?)" in err, err
    assert re.search(r"node3: answers SSH again after [0-9.]+s", err), err
    [rec] = runs_json(runs)
    attempts = json.loads((runs / rec["job_id"] / "attempts.json").read_text())["attempts"]
    assert [a["status"] for a in attempts] == ["failed", "succeeded"], attempts
    assert "node 2 (node3): lost" in attempts[0]["ended_by"]
    last = attempts[1]["job_id"]
    assert "tick rank=2 i=" in (runs / last / "2-node3" / "console.log").read_text()
    assert left_over(lab3, last) == {}


@pytest.mark.login
@pytest.mark.shared_home
def test_a_crashed_and_rebooted_host_rejoins_on_the_retry_over_a_new_connection(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """node3 crashes mid-run (every process on it killed, its SSH connection dead) and boots
    again; the retry must reconnect to it instead of reusing the dead transport."""
    runs = tmp_path / "runs"
    args = run_args(lab3, runs, code, "--max-retries", "3", "--retry-backoff", "2")
    args += ["--lost-timeout", "3", str(code / "tick.py"), "6"]
    code, err = run_and_crash(lab3, runs, args, 2, boot=True)
    assert code == 0, err
    assert "node3: reconnecting (new SSH connection)" in err
    [rec] = runs_json(runs)
    job_id = rec["job_id"]
    attempts = json.loads((runs / job_id / "attempts.json").read_text())["attempts"]
    assert attempts[0]["status"] == "failed" and "node 2 (node3)" in attempts[0]["ended_by"]
    assert attempts[-1]["status"] == "succeeded"
    last = attempts[-1]["job_id"]
    assert "tick rank=2 i=29" in (runs / last / "2-node3" / "console.log").read_text()
    assert left_over(lab3, last) == {}


def test_nodes_2_of_3_leaves_out_the_host_whose_data_link_is_cut(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    lab3.cut_link("node3", "data")
    p = fleetctl(*run_args(lab3, runs, code, "--nodes", "2", str(code / "tick.py"), "1"))
    assert p.exit_code == 0, p.stdout + p.stderr
    assert "node3: left out: data link down" in p.stderr
    assert "running on node1, node2" in p.stderr
    [rec] = runs_json(runs)
    [att] = json.loads((runs / rec["job_id"] / "attempts.json").read_text())["attempts"]
    assert att["nodes"] == ["node1", "node2"] and list(att["left_out"]) == ["node3"]
    job = job_json(runs, rec["job_id"])
    assert [n["host"] for n in job["nodes"]] == ["node1", "node2"]
    assert job["status"] == "succeeded"
    # who was left out, and why, is in the job's record and in `runs` and `status`
    assert list(job["left_out"]) == ["node3"] and "data link down" in job["left_out"]["node3"]
    assert rec["left_out"] == job["left_out"]
    table = fleetctl("runs", "--runs-dir", str(runs)).stdout
    assert "2 (+1 left out)" in table, table
    said = fleetctl("status", "--runs-dir", str(runs), rec["job_id"]).stdout
    assert "[- node3] left out: " in said and "data link down" in said, said


@pytest.mark.login
@pytest.mark.shared_home
def test_a_host_lost_mid_run_is_replaced_by_the_spare_on_the_retry(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    args = run_args(
        lab3, runs, code, "--nodes", "2", "--max-retries", "1", "--retry-backoff", "0.5"
    )
    args += ["--lost-timeout", "3", str(code / "tick.py"), "4"]
    code, err = run_and_crash(lab3, runs, args, 1, boot=False)
    assert code == 0, err
    [rec] = runs_json(runs)
    attempts = json.loads((runs / rec["job_id"] / "attempts.json").read_text())["attempts"]
    assert [a["nodes"] for a in attempts] == [["node1", "node2"], ["node1", "node3"]]
    assert attempts[0]["status"] == "failed" and attempts[1]["status"] == "succeeded"
    assert "node2" in attempts[1]["left_out"]
    last = attempts[1]["job_id"]
    assert "node2" in job_json(runs, last)["left_out"] and "node2" in rec["left_out"]
    said = fleetctl("status", "--runs-dir", str(runs), rec["job_id"]).stdout
    assert "(attempt 2)" in said and "[- node2] left out: " in said, said
    assert "tick rank=1" in (runs / last / "1-node3" / "console.log").read_text()


def test_a_python_exception_is_not_retried(lab3: Lab, tmp_path: Path, code: Path) -> None:
    runs = tmp_path / "runs"
    marker = f"/tmp/fleet-retry-{uuid.uuid4().hex}"
    p = fleetctl(
        *run_args(
            lab3,
            runs,
            code,
            "--max-retries",
            "2",
            "--retry-backoff",
            "0.2",
            str(code / "flaky.py"),
            "bug",
            marker,
        )
    )
    assert p.exit_code == 3, p.stdout + p.stderr
    [rec] = runs_json(runs)
    assert rec["status"] == "failed" and rec["attempts"] == 1
    assert "node 1 (node2): exit code 1" in rec["first_failure"]
    attempts = json.loads((runs / rec["job_id"] / "attempts.json").read_text())["attempts"]
    assert len(attempts) == 1 and not attempts[0]["retried"]
    assert "not retried: " in attempts[0]["decision"] and "Traceback" in attempts[0]["decision"]
    assert not (runs / f"{rec['job_id']}.2").exists()


# ------------------------------------------------------------------------------- roles


def test_after_a_failure_a_fresh_probe_names_the_host_whose_data_link_is_down(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """Rank 1 (node2) fails first; the post-mortem check finds node3 cut off the training
    network and says so next to it, in the summary and in job.json."""
    runs = tmp_path / "runs"
    lab3.cut_link("node3", "data")
    p = fleetctl(*run_args(lab3, runs, code, str(code / "fail_on_1.py")))
    assert p.exit_code == 3, p.stdout + p.stderr
    assert "failed first" in p.stderr and "node 1 (node2" in p.stderr
    assert "likely cause: node3: data link down" in p.stderr
    [rec] = runs_json(runs)
    job = job_json(runs, rec["job_id"])
    assert job["first_failure"]["host"] == "node2"
    assert job["culprits"] == ["node3: data link down (no peer reaches it on the training network)"]


@pytest.mark.login
def test_a_plain_roles_master_port_is_claimed_and_a_held_one_is_skipped(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """The workers (a plain role, 2 tasks) meet at MASTER_PORT on their first task's host:
    another fleetctl job holds 29500 there, so this job claims the next port."""
    claim = '{"job": "other-job", "pid": 1}'  # pid 1 of the lab host: alive
    lab3.exec("node2", ["sh", "-c", claims_folder(lab3) +
                        f"echo '{claim}' > \"$d/29500\""], check=True)  # fmt: skip
    runs = tmp_path / "runs"
    try:
        p = fleetctl("run", "-i", str(lab3.inventory_path), "--no-check", "--grace", "2",
                     "--runs-dir", str(runs), "--code-dir", str(code), "--job",
                     str(code / "job.yml"))  # fmt: skip
    finally:
        lab3.exec("node2", ["sh", "-c", "rm -f /tmp/fleetctl-ports-*/29500"], check=True)
    assert p.exit_code == 0, p.stdout + p.stderr
    [rec] = runs_json(runs)
    plan = json.loads((runs / rec["job_id"] / "plan.json").read_text())
    workers = [n for n in plan["nodes"] if n["host"] in ("node2", "node3")]
    [port] = {n["env"]["MASTER_PORT"] for n in workers}  # one rendezvous for the role
    assert 29500 < int(port) < 29564, workers  # the next free one (29501 may be in TIME_WAIT)
    # the job's claim on node2 was released with the job: nothing of it is left there
    left = lab3.exec("node2", ["sh", "-c", "ls /tmp/fleetctl-ports-*"], check=True).stdout
    assert port not in left.split()


def test_a_two_role_job_ends_when_the_workers_succeed(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    p = fleetctl(
        "run",
        "-i",
        str(lab3.inventory_path),
        "--no-check",
        "--grace",
        "2",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        "--job",
        str(code / "job.yml"),
    )
    assert p.exit_code == 0, p.stdout + p.stderr
    [rec] = runs_json(runs)
    job_id = rec["job_id"]
    job = job_json(runs, job_id)
    assert job["status"] == "succeeded"
    assert [(n["host"], n["state"]) for n in job["nodes"]] == [
        ("node1", "stopped"),  # the server never exits by itself: stopped cleanly
        ("node2", "succeeded"),
        ("node3", "succeeded"),
    ]
    assert job["teardown"]["verified"] is True
    roles = json.loads((runs / job_id / "roles.json").read_text())
    tasks = {(t["role"], t["index"]): t for t in roles["tasks"]}
    http = tasks[("server", 0)]["ports"]["http"][0]
    inv = {n.name: n for n in load_inventory(str(lab3.inventory_path)).nodes}
    server_ip = inv["node1"].address
    out = "\n".join(p.stdout.splitlines())
    assert f"[0 node1] server listening on {http}" in out
    for i, host in ((0, "node2"), (1, "node3")):
        data = tasks[("worker", i)]["ports"]["data"][0]
        mine = f"worker_{i} at {inv[host].address}:{data}"
        assert f"[{i + 1} {host}] worker_{i} reply 'ack {mine}'" in out, out
        assert f"[0 node1] server got '{mine}'" in out
        assert f"[{i + 1} {host}] worker_{i} connected to {server_ip}:{http}" in out
        env_line = next(x for x in out.splitlines() if x.startswith(f"[{i + 1} {host}] env "))
        assert "PAI_CURRENT_TASK_ROLE_NAME=worker" in env_line
        assert f"PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX={i}" in env_line
        assert "PAI_TASK_ROLE_TASK_COUNT_worker=2" in env_line
        assert "PAI_TASK_ROLE_LIST=server,worker" in env_line
        assert f"FLEET_ROLE_INDEX={i}" in env_line
    assert left_over(lab3, job_id) == {}


# ---------------------------------------------------------------------- shared home (NFS)


def test_nodes_on_one_shared_home_are_told_apart_and_each_keeps_its_own_run_folder(
    make_lab: Any, tmp_path: Path, code: Path
) -> None:
    """Non-root logins whose home (and so ~/.fleetctl) every host shares, as with NFS homes:
    the check says so, each node runs in its own run folder, and each node's collected log
    holds its own lines only; the job's work folder is one, shared, as on Slurm."""
    lab = make_lab(3, user="fleetsh", shared_home=True)
    runs = tmp_path / "runs"
    check = fleetctl("check", "-i", str(lab.inventory_path), "--json")
    report = json.loads(check.stdout)
    assert report["shared_workdirs"] == [["node1", "node2", "node3"]], check.stdout
    assert any("share /home/fleetsh/.fleetctl" in w for w in report["warnings"])
    # One folder, one transfer: the first node pushes, the others find its snapshot there.
    push = fleetctl("push", "-i", str(lab.inventory_path), "--code", str(code), "--json")
    assert push.exit_code == 0, push.stdout + push.stderr
    pushed = json.loads(push.stdout)["nodes"]
    assert pushed["node1"]["code_method"] in ("rsync", "sftp") and pushed["node1"]["bytes_sent"]
    for host in ("node2", "node3"):
        assert pushed[host]["code_method"] == "shared with node1", pushed[host]
        assert pushed[host]["bytes_sent"] == 0
    assert len({n["code_dir"] for n in pushed.values()}) == 1
    args = [a for a in run_args(lab, runs, code) if a != "--no-check"]
    p = fleetctl(*args, str(code / "tick.py"), "1")
    assert p.exit_code == 0, p.stdout + p.stderr
    [rec] = runs_json(runs)
    plan = json.loads((runs / rec["job_id"] / "plan.json").read_text())
    dirs = [n["run_dir"] for n in plan["nodes"]]
    assert dirs == [f"~/.fleetctl/runs/{rec['job_id']}/{i}-node{i + 1}" for i in range(3)]
    for i in range(3):
        console = (runs / rec["job_id"] / f"{i}-node{i + 1}" / "console.log").read_text()
        ranks = set(re.findall(r"tick rank=(\d+)", console))
        assert ranks == {str(i)}, console  # its own lines, nobody else's


# ----------------------------------------------------------------------- the login's home


@pytest.mark.login
def test_modules_in_the_logins_home_never_replace_the_stdlib_of_fleetctls_node_programs(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """Every node program starts in the login's home, and ``python -c`` searches the current
    folder first: a user's ~/json.py or ~/queue.py must not break the check, a run, its
    teardown or exec's time limit."""
    if lab3.user is None:  # not a missing tool: root's lab home is this machine's own /root
        pytest.skip("needs a lab login of its own (FLEETCTL_LAB_USER): /root is this machine's")
    names = ("json", "queue", "socket", "subprocess", "base64", "zlib", "hashlib")
    shadow = [f"{lab3.home}/{n}.py" for n in names]
    body = "raise SystemExit('the login home shadowed the stdlib')\n"
    for h in lab3.hosts:
        for path in shadow:
            lab3.exec(h.name, ["sh", "-c", f'printf "%s" "$1" > {path}', "sh", body], check=True)
            lab3.exec(h.name, ["chown", f"--reference={lab3.home}", path], check=True)
    try:
        # what those files do to a plain python -c in that folder
        python = load_inventory(lab3.inventory_path).nodes[0].python
        plain = lab3.exec("node1", ["sh", "-c", f"cd {lab3.home} && {python} -c 'import json'"])
        assert "shadowed the stdlib" in plain.stderr, plain
        runs = tmp_path / "runs"
        args = run_args(lab3, runs, code, str(code / "tick.py"), "1")
        args.remove("--no-check")  # the check's probe too, not a cached pass
        p = run_cli(*args, cwd=ROOT, env={"FLEETCTL_CACHE_DIR": str(tmp_path / "cache")})
        assert p.exit_code == 0, p.stdout + p.stderr
        assert "checking nodes" in p.stderr
        assert "tick rank=2 i=4" in p.stdout
        limited = fleetctl("exec", "-i", str(lab3.inventory_path), "--timeout", "30", "--", "true")
        assert limited.exit_code == 0, limited.stdout + limited.stderr
    finally:
        for h in lab3.hosts:
            lab3.exec(h.name, ["rm", "-f", *shadow])


@pytest.mark.login
@pytest.mark.shared_home
def test_status_after_the_controller_was_killed_says_it_is_gone_and_what_to_do(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """SIGKILL to an attached `fleetctl run`: job.json still says running. `status` says the
    controller is gone, that no node runs the job (the dead-man switch stopped it) and to
    collect; `stacks` has nothing to dump and says so with a non-zero exit."""
    runs = tmp_path / "runs"
    proc = start_cli_process(*run_args(lab3, runs, code, str(code / "tick.py"), "60"),
                             cwd=ROOT, start_new_session=True)  # fmt: skip
    try:

        def all_running() -> str | None:
            for job in runs.glob("*/job.json"):
                with contextlib.suppress(ValueError, OSError, KeyError):
                    data = json.loads(job.read_text())
                    if [n["state"] for n in data["nodes"]] == ["running"] * 3:
                        return str(data["job_id"])
            return None

        job_id = wait_for(all_running, 60, what="the job running on every node", interval=0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    pid = proc.pid

    def nothing_runs() -> CliResult | None:
        st = fleetctl("status", "--runs-dir", str(runs), job_id)
        return st if st.exit_code == 0 and "0 of 3 node(s) running" in st.stdout else None

    st = wait_for(nothing_runs, 30, what="the dead-man switch ended the job on every node")
    assert f"job {job_id}: running per job.json, but its controller (fleetctl run, pid {pid}" in (
        st.stdout
    )
    assert "is gone; 0 of 3 node(s) running" in st.stdout, st.stdout
    hint = f"no node runs the job (their dead-man switch stopped it): `fleetctl collect {job_id}`"
    assert hint in st.stderr, st.stderr
    data = fleetctl("status", "--runs-dir", str(runs), job_id, "--json").json
    assert data["controller"]["pid"] == pid and data["controller"]["alive"] is False
    sk = fleetctl("stacks", "--runs-dir", str(runs), job_id)
    assert sk.exit_code == 1, sk.stderr
    assert f"fleetctl: error: job {job_id}: no stack dumped on any of 3 node(s)" in sk.stderr
    done = fleetctl("collect", "--runs-dir", str(runs), job_id)
    assert done.exit_code == 0, done.stderr
    assert job_json(runs, job_id)["status"] != "running"
    assert left_over(lab3, job_id) == {}
