"""Log collection on real lab hosts: a file over the per-node cap stays on its node and is
listed, the logs come home whole, the run keeps the job's status, and ``fleetctl collect``
with a larger cap fetches only what is missing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli
from fleetctl.testing.files import tree

pytestmark = [pytest.mark.lab, pytest.mark.login, pytest.mark.shared_home]

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("node1", "node2", "node3")
BIG = 3 << 20

WRITE_BIG = """\
import os
rank = int(os.environ["FLEET_NODE_RANK"])
os.chdir(os.environ["FLEET_RUN_DIR"])  # files the job wants collected: in the node run folder
os.makedirs("log", exist_ok=True)
with open("log/worker.log", "w") as f:
    f.write(f"worker log of rank {rank}\\n")
if rank == 2:  # a checkpoint next to them
    with open("checkpoint.pt", "wb") as f:
        f.write(os.urandom(BIG))
for i in range(500):
    print(f"line {i} of rank {rank}", flush=True)
""".replace("BIG", str(BIG))


def fleetctl(*args: str) -> CliResult:
    return run_cli(*args, cwd=ROOT)


def run_args(lab: Lab, runs: Path, code: Path, script: str, *extra: str) -> list[str]:
    """``fleetctl run`` of ``code/script``: plain launcher, no check, no live tail."""
    return [
        "run", "-i", str(lab.inventory_path), "--launcher", "plain", "--no-check",
        "--runs-dir", str(runs), "--code-dir", str(code), "--tail", "none", *extra,
        str(code / script),
    ]  # fmt: skip


def job_json(runs: Path, job_id: str) -> dict[str, Any]:
    return json.loads((runs / job_id / "job.json").read_text())


def test_a_file_over_the_cap_is_listed_not_copied_and_collect_fetches_only_it_later(
    lab3: Lab, tmp_path: Path
) -> None:
    code = tree(tmp_path / "code", {"write_big.py": WRITE_BIG})
    runs = tmp_path / "runs"
    p = fleetctl(*run_args(lab3, runs, code, "write_big.py", "--collect-max", "1M"))
    assert p.exit_code == 0, p.stderr  # the job's status: a cap is not a failure
    job_id = next(d.name for d in runs.iterdir())
    job = job_json(runs, job_id)
    assert job["status"] == "succeeded"
    by_rank = {c["rank"]: c for c in job["collected"]}
    for rank, host in enumerate(HOSTS):
        c = by_rank[rank]
        assert c["complete"] is True and c["error"] is None, c
        assert {"console.log", "supervisor.json", "log/worker.log"} <= set(c["files"])
        folder = runs / job_id / f"{rank}-{host}"
        lines = (folder / "console.log").read_text().splitlines()
        assert lines == [f"line {i} of rank {rank}" for i in range(500)]
        assert json.loads((folder / "supervisor.json").read_text())["exit_code"] == 0
    assert by_rank[2]["not_collected"] == [
        {
            "path": "checkpoint.pt",
            "size": BIG,
            "reason": "over cap",
            "detail": "over the 1.0 MiB cap",
        }
    ]
    assert by_rank[0]["not_collected"] == [] and by_rank[1]["not_collected"] == []
    assert not (runs / job_id / "2-node3" / "checkpoint.pt").exists()
    assert "checkpoint.pt (3.0 MiB, over the 1.0 MiB cap)" in p.stderr
    assert f"fleetctl collect {job_id} --collect-max SIZE" in p.stderr
    assert "LOGS INCOMPLETE" not in p.stderr

    again = fleetctl("collect", "--runs-dir", str(runs), "--collect-max", "10M", "--json", job_id)
    assert again.exit_code == 0, again.stderr
    got = {c["rank"]: c for c in json.loads(again.stdout)["collected"]}
    assert got[0]["bytes"] == 0 and got[1]["bytes"] == 0  # nothing copied twice
    assert got[2]["bytes"] == BIG and got[2]["not_collected"] == []
    assert "checkpoint.pt" in got[2]["files"]
    assert (runs / job_id / "2-node3" / "checkpoint.pt").stat().st_size == BIG
    final = job_json(runs, job_id)
    assert final["status"] == "succeeded"
    assert [c["not_collected"] for c in final["collected"]] == [[], [], []]


CHATTY = """\
import os
rank = int(os.environ["FLEET_NODE_RANK"])
for i in range(20000):
    print(f"line {i:05d} of rank {rank} " + "x" * 40, flush=True)
"""


def test_a_node_whose_run_folder_fills_says_disk_full_and_every_streamed_line_is_kept(
    lab3: Lab, tmp_path: Path
) -> None:
    code = tree(tmp_path / "code", {"chatty.py": CHATTY})
    runs = tmp_path / "runs"
    lab3.disk_full("node2", f"{lab3.workdir}/runs", "256k")  # undone after the test (lab3)
    p = fleetctl(*run_args(lab3, runs, code, "chatty.py"))
    job_id = next(d.name for d in runs.iterdir())
    full = f"disk full on {lab3.workdir}/runs/{job_id}/1-node2"
    # the job itself went on and succeeded; its logs did not all come home: exit 4
    assert p.exit_code == 4, p.stderr
    assert "All 3 nodes succeeded" in p.stderr, p.stderr
    job = job_json(runs, job_id)
    node = job["nodes"][1]
    assert node["state"] == "succeeded" and node["reason"] == full and node["problem"] == full
    assert f"[1 node2] {full}: console.log on the node misses output" in p.stderr, p.stderr
    assert f"node 1 (node2): {full}; its console.log misses output" in p.stderr
    for rank, host in enumerate(HOSTS):
        want = [f"line {i:05d} of rank {rank} " + "x" * 40 for i in range(20000)]
        folder = runs / job_id / f"{rank}-{host}"
        if rank == 1:  # the node's log stopped when its disk filled; fleetctl's copy did not
            assert len((folder / "console.log").read_bytes()) < 256 << 10
            assert (folder / "console.streamed.log").read_text().splitlines() == want
        else:  # whole logs came home: no second copy
            assert (folder / "console.log").read_text().splitlines() == want
            assert not (folder / "console.streamed.log").exists()


def test_a_node_whose_run_folders_are_full_before_the_start_says_disk_full(
    lab3: Lab, tmp_path: Path
) -> None:
    code = tree(tmp_path / "code", {"chatty.py": CHATTY})
    runs = tmp_path / "runs"
    runs_dir = f"{lab3.workdir}/runs"
    lab3.disk_full("node3", runs_dir, "4k")
    lab3.exec("node3", ["sh", "-c", f"head -c 8192 /dev/zero > {runs_dir}/fill || true"])
    p = fleetctl(*run_args(lab3, runs, code, "chatty.py"))
    job_id = next(d.name for d in runs.iterdir())
    assert p.exit_code == 3, p.stderr
    node = job_json(runs, job_id)["nodes"][2]
    assert node["state"] == "start_failed"
    assert (
        node["reason"]
        == f"cannot start job on this node: disk full on {lab3.workdir}/runs/{job_id}/2-node3"
    )


WRITE_BIG_FILE = """\
import os
rank = int(os.environ["FLEET_NODE_RANK"])
if rank == 2:  # a file big enough that its transfer can be cut half-way
    with open(os.path.join(os.environ["FLEET_RUN_DIR"], "big.bin"), "wb") as f:
        f.write(os.urandom(8 << 20))
for i in range(100):
    print(f"line {i} of rank {rank}", flush=True)
"""


def test_ctrl_c_while_collecting_exits_130_says_logs_incomplete_and_collect_resumes(
    lab3: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C arrives while node3's big file is half home (the pause point: its transfer,
    after 2 MiB, sends this process SIGINT and ends). The run exits 130 saying LOGS
    INCOMPLETE with the hint; the plain `fleetctl collect` then resumes from the partial copy."""
    import os
    import signal

    from fleetctl.phases import unpack

    real = unpack._receive_file

    def cut_at_2_mib(fobj, part, target, mtime, offset):  # type: ignore[no-untyped-def]
        if target.name != "big.bin":
            return real(fobj, part, target, mtime, offset)

        class Half:
            got = 0

            def read(self, n: int) -> bytes:
                if self.got >= 2 << 20:
                    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, to the run's main thread
                    raise KeyboardInterrupt  # and this transfer stops here
                data = fobj.read(min(n, (2 << 20) - self.got))
                self.got += len(data)
                return data

        return real(Half(), part, target, mtime, offset)

    code = tree(tmp_path / "code", {"big.py": WRITE_BIG_FILE})
    runs = tmp_path / "runs"
    monkeypatch.setattr(unpack, "_receive_file", cut_at_2_mib)
    p = fleetctl(*run_args(lab3, runs, code, "big.py"))
    monkeypatch.undo()
    job_id = next(d.name for d in runs.iterdir())
    assert p.exit_code == 130, p.stderr
    assert "All 3 nodes succeeded" in p.stderr
    assert "LOGS INCOMPLETE for node 2 (node3): log collection interrupted (Ctrl-C)" in p.stderr
    assert f"`fleetctl collect {job_id}` fetches what is missing" in p.stderr
    job = job_json(runs, job_id)
    assert job["status"] == "succeeded"  # the job's own outcome stands
    assert job["collected"][2]["complete"] is False
    folder = runs / job_id / "2-node3"
    [part] = folder.glob(".fleetctl-part-big.bin.*.part")
    assert part.stat().st_size == 2 << 20  # the resume state
    # the documented recovery, as a user types it (not --json)
    c = fleetctl("collect", "--runs-dir", str(runs), job_id)
    assert c.exit_code == 0, c.stderr
    assert "[2 node3] " in c.stderr and "6.0 MiB copied now" in c.stderr, c.stderr
    assert f"fleetctl: job {job_id}: succeeded" in c.stderr
    assert (folder / "big.bin").stat().st_size == 8 << 20
    assert not list(folder.glob(".fleetctl-part-*"))
    assert all(n["complete"] for n in job_json(runs, job_id)["collected"])


PAUSED = """\
import os, time
rank = int(os.environ["FLEET_NODE_RANK"])
for i in range(1001):
    print(f"line {i:04d} of rank {rank}", flush=True)
deadline = time.time() + 120
while not os.path.exists("/tmp/fleetctl-test-go") and time.time() < deadline:
    time.sleep(0.05)  # the pause point: the test hides node2's run folder meanwhile
for i in range(1001, 2002):
    print(f"line {i:04d} of rank {rank}", flush=True)
"""


def test_a_run_folder_hidden_mid_run_keeps_the_streamed_log_and_says_logs_incomplete(
    lab3: Lab, tmp_path: Path
) -> None:
    import contextlib
    import os
    import signal

    from fleetctl.testing.cli_runner import start_cli_process
    from fleetctl.testing.wait import wait_for

    code = tree(tmp_path / "code", {"paused.py": PAUSED})
    runs = tmp_path / "runs"
    for host in HOSTS:
        lab3.exec(host, ["rm", "-f", "/tmp/fleetctl-test-go"], check=True)
    argv = run_args(lab3, runs, code, "paused.py")
    proc = start_cli_process(*argv, cwd=ROOT, start_new_session=True)
    try:

        def paused_on_node2() -> str | None:
            ids = [d.name for d in runs.iterdir()] if runs.is_dir() else []
            if not ids:
                return None
            log = f"{lab3.workdir}/runs/{ids[0]}/1-node2/console.log"
            n = lab3.exec("node2", ["sh", "-c", f"cat {log} 2>/dev/null | wc -l"]).stdout
            return ids[0] if n.strip() == "1001" else None

        job_id = wait_for(paused_on_node2, 60, what="node2 at the pause point", interval=0.2)
        lab3.disk_full("node2", f"{lab3.workdir}/runs/{job_id}/1-node2", "1m")
        for host in HOSTS:
            lab3.exec(host, ["touch", "/tmp/fleetctl-test-go"], check=True)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        for host in HOSTS:
            with contextlib.suppress(Exception):
                lab3.exec(host, ["rm", "-f", "/tmp/fleetctl-test-go"])
    assert proc.returncode == 4, err  # the job itself succeeded, its logs are incomplete
    assert "All 3 nodes succeeded" in err, err
    assert "LOGS INCOMPLETE for node 1 (node2): console.log: not in the node's run folder" in err
    folder = runs / job_id / "1-node2"
    assert f"every line that streamed is in {folder}/console.streamed.log" in err
    job = job_json(runs, job_id)
    node2 = job["collected"][1]
    assert node2["complete"] is False and node2["not_collected"][0]["reason"] == "missing"
    want = [f"line {i:04d} of rank 1" for i in range(2002)]
    assert (folder / "console.streamed.log").read_text().splitlines() == want
    for rank, host in ((0, "node1"), (2, "node3")):  # whole logs home: no second copy
        assert job["collected"][rank]["complete"] is True
        assert not (runs / job_id / f"{rank}-{host}" / "console.streamed.log").exists()
