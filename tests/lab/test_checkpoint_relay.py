"""A retry resumes every rank from rank 0's checkpoint (issue 28): a third-party-shaped script
(pytorch/examples' multinode DDP habit: global rank 0 saves ``snapshot.pt`` in its cwd, every
rank loads it when it finds it) fails on a non-zero node after the snapshot is written; on the
retry every node of the job, a spare that replaces a crashed host included, resumes from it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli, start_cli_process

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]

# Rank 0 saves epoch 12 to snapshot.pt in its cwd, then tells the other ranks over the
# training network (they wait for its word, so the save happens before anything fails);
# node rank 1 then dies (``kill``) or waits for its host to crash (``wait``). A rank that finds
# a snapshot resumes from it and is done.
CKPT = """\
import os, socket, sys, time
mode, rank = sys.argv[1], int(os.environ["RANK"])
epoch = 0
if os.path.exists("snapshot.pt"):
    with open("snapshot.pt", "rb") as f:
        epoch = int(f.read().split(b"=")[1])
print(f"resume rank={rank} epoch={epoch}", flush=True)
if epoch:
    print(f"done rank={rank}", flush=True)
    sys.exit(0)
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if rank == 0:
    with open("snapshot.pt.tmp", "wb") as f:
        f.write(b"epoch=12")
    os.replace("snapshot.pt.tmp", "snapshot.pt")
    print("saved epoch=12", flush=True)
    srv = socket.create_server(("", port))
    while True:
        c, _ = srv.accept()
        c.sendall(b"saved")
        c.close()
deadline = time.time() + 30
while True:
    try:
        socket.create_connection((addr, port), timeout=5).recv(8)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.2)
if rank == 1 and mode == "kill":
    print("rank 1 dies after the save", flush=True)
    sys.exit(137)
time.sleep(600)
"""


# Rank 0 saves the snapshot once (when it has none), tells the others, and is done; node rank 1
# dies on its first two tries (a count kept in its own work folder, which is not relayed).
TWICE = """\
import os, socket, sys, time
rank = int(os.environ["RANK"])
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
print(f"resume rank={rank} snapshot={os.path.exists('snapshot.pt')}", flush=True)
if rank == 0:
    if not os.path.exists("snapshot.pt"):
        with open("snapshot.pt.tmp", "wb") as f:
            f.write(b"epoch=12")
        os.replace("snapshot.pt.tmp", "snapshot.pt")
    srv = socket.create_server(("", port))
    for _ in range(int(os.environ["NNODES"]) - 1):
        c, _ = srv.accept()
        c.sendall(b"saved")
        c.close()
    sys.exit(0)
deadline = time.time() + 30
while True:
    try:
        socket.create_connection((addr, port), timeout=5).recv(8)
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.2)
if rank == 1:
    tries = int(open("tries").read()) + 1 if os.path.exists("tries") else 1
    with open("tries", "w") as f:
        f.write(str(tries))
    if tries <= 2:
        print(f"rank 1 dies on try {tries}", flush=True)
        sys.exit(137)
"""


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ckpt-code")
    (d / "multinode.py").write_text(CKPT)
    (d / "twice.py").write_text(TWICE)
    return d


def run_args(lab: Lab, runs: Path, code: Path, *extra: str) -> list[str]:
    return [
        "run",
        "-i",
        str(lab.inventory_path),
        "--launcher",
        "plain",
        "--no-check",
        "--grace",
        "2",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        "--retry-backoff",
        "0.2",
        *extra,
    ]


def attempts(runs: Path) -> list[dict]:
    [base] = [d for d in runs.iterdir() if (d / "attempts.json").is_file()]
    return json.loads((base / "attempts.json").read_text())["attempts"]


def console(runs: Path, job_id: str, rank: int, host: str) -> str:
    return (runs / job_id / f"{rank}-{host}" / "console.log").read_text()


def test_every_rank_of_the_retry_resumes_from_rank_0s_snapshot(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    args = run_args(lab3, runs, code, "--max-retries", "1", str(code / "multinode.py"), "kill")
    p = run_cli(*args, cwd=ROOT)
    assert p.exit_code == 0, p.stdout + p.stderr
    first, second = attempts(runs)
    assert first["retried"] and "node 1 (node2)" in first["ended_by"]
    assert first["checkpoints"] is None and second["status"] == "succeeded"
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert f"resume rank={rank} epoch=0" in console(runs, first["job_id"], rank, host)
        assert f"resume rank={rank} epoch=12" in console(runs, second["job_id"], rank, host)
    relayed = second["checkpoints"]
    assert relayed["from"] == "node1" and relayed["attempt"] == 1
    assert (relayed["files"], relayed["count"], relayed["bytes"]) == (["snapshot.pt"], 1, 8)
    assert relayed["method"] == "controller" and relayed["skipped"] is None
    assert relayed["nodes"] == {"node1": "the source", "node2": "copied", "node3": "copied"}
    said = "checkpoints: 1 file(s), 8 bytes from node1 (rank 0 of attempt 1) to node2, node3"
    assert said in p.stderr
    assert said in (runs / second["job_id"] / "events.log").read_text()


def test_a_spare_replacing_a_crashed_host_resumes_from_rank_0s_snapshot(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """The issue's run: ``--nodes 2 --max-retries 1``, node2 crashes mid-run after the save;
    attempt 2 runs on node1 and the spare node3, which starts from a fresh work folder."""
    runs = tmp_path / "runs"
    args = run_args(lab3, runs, code, "--nodes", "2", "--max-retries", "1", "--lost-timeout", "3")
    args += [str(code / "multinode.py"), "wait"]
    proc = start_cli_process(*args, cwd=ROOT, start_new_session=True, stderr=subprocess.STDOUT)
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:  # the live view: rank 0's line says the snapshot is on disk
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "saved epoch=12" in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(60), "".join(lines[-20:])
        lab3.crash_host("node2")
        proc.wait(180)
        reader.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.wait(5)
    err = "".join(lines)
    assert proc.returncode == 0, err
    first, second = attempts(runs)
    assert first["nodes"] == ["node1", "node2"] and second["nodes"] == ["node1", "node3"]
    assert "resume rank=1 epoch=12" in console(runs, second["job_id"], 1, "node3")
    assert "resume rank=0 epoch=12" in console(runs, second["job_id"], 0, "node1")
    assert second["checkpoints"]["nodes"] == {"node1": "the source", "node3": "copied"}


def test_the_second_retry_sends_nothing_to_nodes_that_hold_the_snapshot(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """Attempt 2 copies rank 0's snapshot to node2 and node3; rank 1 fails again, and attempt
    3's relay asks them first: both hold it byte for byte, so 0 bytes go to either."""
    runs = tmp_path / "runs"
    p = run_cli(*run_args(lab3, runs, code, "--max-retries", "2", str(code / "twice.py")), cwd=ROOT)
    assert p.exit_code == 0, p.stdout + p.stderr
    first, second, third = attempts(runs)
    assert first["retried"] and second["retried"] and third["status"] == "succeeded"
    relayed, again = second["checkpoints"], third["checkpoints"]
    assert (relayed["files"], relayed["bytes"], relayed["attempt"]) == (["snapshot.pt"], 8, 1)
    assert relayed["nodes"] == {"node1": "the source", "node2": "copied", "node3": "copied"}
    assert relayed["sent"] == {"node2": 8, "node3": 8}
    assert (again["files"], again["bytes"], again["attempt"]) == (["snapshot.pt"], 8, 2)
    assert again["sent"] == {"node2": 0, "node3": 0} and again["method"] is None
    assert again["nodes"] == {
        "node1": "the source",
        "node2": "up to date (1 file(s) there)",
        "node3": "up to date (1 file(s) there)",
    }
    assert "node2, node3 already hold them, nothing sent" in p.stderr
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert f"resume rank={rank} snapshot=True" in console(runs, third["job_id"], rank, host)
