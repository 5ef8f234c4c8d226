"""``run --metrics-addr``/``--metrics-textfile`` on a real 3-node job: scraped while it runs,
one series per node, checked by ``promtool check metrics``; ``--on-failure``/``--on-end``
hooks after a real failure: their env, their output in the run folder, a hanging hook killed
after ``--hook-timeout``, and the run's exit status theirs never; a detached job's monitor
serving the same and running the hooks."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli, run_cli_process
from fleetctl.testing.jobs import killed_at_exit, start_running, stop_job
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["node1", "node2", "node3"]

TICK = """\
import os, time
rank = os.environ["FLEET_NODE_RANK"]
for i in range(1500):
    print(f"tick rank={rank} i={i}", flush=True)
    time.sleep(0.2)
"""

# node rank 1 fails (exit 1) after sys.argv[1] ticks of 0.2 s; the others tick until stopped
FAIL_ON_1 = """\
import os, sys, time
rank = int(os.environ["FLEET_NODE_RANK"])
for i in range(int(sys.argv[1]) if rank == 1 else 1500):
    print(f"tick rank={rank} i={i}", flush=True)
    time.sleep(0.2)
sys.exit(1)
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    d = tmp_path / "code"
    d.mkdir()
    (d / "tick.py").write_text(TICK)
    (d / "fail_on_1.py").write_text(FAIL_ON_1)
    return d


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        skip_or_fail("no promtool (apt-get install prometheus; .ci/run installs it)")
    assert path is not None
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_args(lab: Lab, runs: Path, code: Path, *extra: str) -> list[str]:
    return [
        "run", "-i", str(lab.inventory_path), "--launcher", "plain", "--nproc-per-node", "1",
        "--no-check", "--grace", "1", "--runs-dir", str(runs), "--code-dir", str(code), *extra,
    ]  # fmt: skip


def series(text: str, name: str) -> list[dict[str, str]]:
    """The label sets of ``name``'s samples."""
    out = []
    for line in text.splitlines():
        m = re.match(rf"{name}\{{(.*)\}} \S+$", line)
        if m:
            out.append(dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))))
    return out


def check_metrics(text: str) -> None:
    p = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stdout + p.stderr + text


def node_states(text: str) -> list[str]:
    return [s["state"] for s in series(text, "fleetctl_node_state")]


def per_node(text: str, name: str) -> list[tuple[str, str]]:
    return sorted((s["host"], s["node_rank"]) for s in series(text, name))


def test_a_running_job_serves_one_series_per_node_that_promtool_accepts(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    promtool()
    runs, port, textfile = tmp_path / "runs", free_port(), tmp_path / "fleetctl.prom"
    addr = f"127.0.0.1:{port}"
    argv = run_args(lab3, runs, code, "--metrics-addr", addr, "--metrics-textfile", str(textfile))
    proc, job_id = start_running([*argv, str(code / "tick.py")], runs, 3, cwd=ROOT)
    with killed_at_exit(proc):

        def scrape() -> str | None:
            with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as r:
                text = r.read().decode()
            counts = re.findall(r"^fleetctl_node_lines_total\{.*\} (\S+)$", text, re.M)
            return text if len(counts) == 3 and all(float(c) > 0 for c in counts) else None

        text = wait_for(scrape, 30, what="every node's lines counted", interval=0.3)
        check_metrics(text)
        want = [(h, str(i)) for i, h in enumerate(HOSTS)]
        for name in (
            "fleetctl_node_state",
            "fleetctl_node_lines_total",
            "fleetctl_node_slow_score",
        ):
            assert per_node(text, name) == want, name
        assert {s["state"] for s in series(text, "fleetctl_node_state")} == {"running"}
        assert {s["job_id"] for s in series(text, "fleetctl_node_state")} == {job_id}
        assert f'fleetctl_job_ranks_alive{{job_id="{job_id}"}} 3.0' in text
        assert f'fleetctl_job_phase{{job_id="{job_id}",phase="run"}} 1.0' in text

        # the textfile variant: the same families, rewritten while the job runs
        def written() -> str | None:
            text = textfile.read_text()
            return text if node_states(text) == ["running"] * 3 else None

        running = wait_for(written, 15, what="the textfile with 3 running nodes")
        check_metrics(running)
        assert per_node(running, "fleetctl_node_state") == want
        stop_job(runs, job_id)
        proc.communicate(timeout=60)
    assert proc.returncode == 130
    final = textfile.read_text()  # written a last time at the end
    check_metrics(final)
    assert f'fleetctl_job_status{{job_id="{job_id}",status="interrupted"}} 1.0' in final
    with pytest.raises(ConnectionRefusedError):  # the server stopped with the run
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    # an address in use stops the next run before any node is reached
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the scrapes' TIME_WAIT
        busy.bind(("127.0.0.1", port))
        busy.listen(1)
        again = run_cli(*argv, str(code / "tick.py"), cwd=ROOT)
    assert again.exit_code == 2, again.stderr
    assert again.stderr.splitlines() == [
        f"fleetctl: error: --metrics-addr {addr}: cannot listen there: Address already in use"
    ]
    assert sorted(p.name for p in runs.iterdir()) == [job_id]  # no new run folder


def test_hooks_tell_about_a_failure_keep_their_output_and_never_change_the_exit_status(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs, out = tmp_path / "runs", tmp_path / "hook"
    out.mkdir()
    argv = run_args(
        lab3, runs, code,
        "--on-failure", f"env | grep ^FLEETCTL_ | sort > {out}/env.txt; echo paging; exit 7",
        "--on-end", f"echo ending; sleep 300 & echo $! > {out}/sleep.pid; wait",
        "--hook-timeout", "2",
        str(code / "fail_on_1.py"), "10",
    )  # fmt: skip
    t0 = time.monotonic()
    r = run_cli(*argv, cwd=ROOT)
    assert r.exit_code == 3, r.stderr  # the job's failure, not the hook's 7
    # not held by the --on-end hook's 300 s sleep (its 2 s limit: the events below); the
    # launch and the 10 s job take a loaded machine a minute or more
    assert time.monotonic() - t0 < 200
    job_id = os.listdir(runs)[0]
    folder = (runs / job_id).resolve()
    env = dict(line.split("=", 1) for line in (out / "env.txt").read_text().splitlines())
    assert env["FLEETCTL_JOB_ID"] == job_id and env["FLEETCTL_STATUS"] == "failed"
    assert (env["FLEETCTL_CULPRIT_HOST"], env["FLEETCTL_CULPRIT_RANK"]) == ("node2", "1")
    assert env["FLEETCTL_CULPRIT_REASON"] == "exit code 1"
    assert (env["FLEETCTL_RUN_DIR"], env["FLEETCTL_EXIT_CODE"]) == (str(folder), "3")
    assert (folder / "hook-on-failure.log").read_text() == "paging\n"
    assert (folder / "hook-on-end.log").read_text() == "ending\n"
    events = (folder / "events.log").read_text()
    assert "hook --on-failure exited 7 after" in events
    assert "hook --on-end killed: timed out after 2." in events
    assert "--on-end killed: timed out" in r.stderr
    pid = int((out / "sleep.pid").read_text())  # what the hanging hook started went with it
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), 5, what="the hook's sleep gone")


def test_a_detached_jobs_monitor_serves_its_metrics_and_runs_its_hooks(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    promtool()
    runs, out, port = tmp_path / "runs", tmp_path / "hook", free_port()
    out.mkdir()
    addr = f"127.0.0.1:{port}"
    argv = run_args(
        lab3, runs, code, "--detach", "--metrics-addr", addr,
        "--on-failure", f"env | grep ^FLEETCTL_ | sort > {out}/env.txt",
        str(code / "fail_on_1.py"), "40",
    )  # fmt: skip
    r = run_cli_process(*argv, cwd=ROOT, timeout=120)
    assert r.exit_code == 0, r.stderr
    job_id = r.stdout.strip()

    def scrape() -> str | None:
        try:
            with urllib.request.urlopen(f"http://{addr}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            return None  # the monitor is still starting
        return text if node_states(text) == ["running"] * 3 else None

    text = wait_for(scrape, 20, what="the monitor serving 3 running nodes", interval=0.3)
    check_metrics(text)
    assert per_node(text, "fleetctl_node_state") == [(h, str(i)) for i, h in enumerate(HOSTS)]
    env_file = out / "env.txt"
    wait_for(env_file.exists, 60, what="the monitor's --on-failure hook")
    env = dict(line.split("=", 1) for line in wait_for(env_file.read_text, 5).splitlines())
    assert (env["FLEETCTL_JOB_ID"], env["FLEETCTL_STATUS"]) == (job_id, "failed")
    assert (env["FLEETCTL_CULPRIT_HOST"], env["FLEETCTL_CULPRIT_RANK"]) == ("node2", "1")
    # the hook wrote env.txt before it exited; the monitor logs its end just after
    events = runs / job_id / "events.log"
    wait_for(lambda: "hook --on-failure exited 0" in events.read_text(), 30, what="the hook's end")

    def monitor_phase() -> object:
        return json.loads((runs / job_id / "job.json").read_text())["monitor"]["phase"]

    wait_for(lambda: monitor_phase() == "exited", 30, what="the monitor's exit")
    with pytest.raises(ConnectionRefusedError):  # its server went with it
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
