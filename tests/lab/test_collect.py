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

pytestmark = pytest.mark.lab

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


def job_json(runs: Path, job_id: str) -> dict[str, Any]:
    return json.loads((runs / job_id / "job.json").read_text())


def test_a_file_over_the_cap_is_listed_not_copied_and_collect_fetches_only_it_later(
    lab3: Lab, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "write_big.py").write_text(WRITE_BIG)
    runs = tmp_path / "runs"
    p = fleetctl(
        "run",
        "-i",
        str(lab3.inventory_path),
        "--launcher",
        "plain",
        "--no-check",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        "--collect-max",
        "1M",
        "--tail",
        "none",
        str(code / "write_big.py"),
    )
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
    code = tmp_path / "code"
    code.mkdir()
    (code / "chatty.py").write_text(CHATTY)
    runs = tmp_path / "runs"
    lab3.disk_full("node2", f"{lab3.workdir}/runs", "256k")  # undone after the test (lab3)
    p = fleetctl(
        "run",
        "-i",
        str(lab3.inventory_path),
        "--launcher",
        "plain",
        "--no-check",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        "--tail",
        "none",
        str(code / "chatty.py"),
    )
    job_id = next(d.name for d in runs.iterdir())
    full = f"disk full on {lab3.workdir}/runs/{job_id}/1-node2"
    assert p.exit_code == 0, p.stderr  # the job itself went on and succeeded
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
    code = tmp_path / "code"
    code.mkdir()
    (code / "chatty.py").write_text(CHATTY)
    runs = tmp_path / "runs"
    runs_dir = f"{lab3.workdir}/runs"
    lab3.disk_full("node3", runs_dir, "4k")
    lab3.exec("node3", ["sh", "-c", f"head -c 8192 /dev/zero > {runs_dir}/fill || true"])
    p = fleetctl(
        "run",
        "-i",
        str(lab3.inventory_path),
        "--launcher",
        "plain",
        "--no-check",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        "--tail",
        "none",
        str(code / "chatty.py"),
    )
    job_id = next(d.name for d in runs.iterdir())
    assert p.exit_code == 3, p.stderr
    node = job_json(runs, job_id)["nodes"][2]
    assert node["state"] == "start_failed"
    assert (
        node["reason"]
        == f"cannot start job on this node: disk full on {lab3.workdir}/runs/{job_id}/2-node3"
    )
