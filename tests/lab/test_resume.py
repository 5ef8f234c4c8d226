"""``run --resume JOB`` continues an earlier job (issue 40): each job has its own work folder on
every node, so a second ``fleetctl run`` of a script that resumes from a file in its folder
(pytorch/examples' ``snapshot.pt`` habit) started at epoch 0, unlike the same script
resubmitted with sbatch. With ``--resume`` the earlier job's rank 0 files reach every node of
the new job before launch, whatever the new node order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]

# Torch-free: starts from ckpt.txt in its folder when there is one; global rank 0 writes the
# epoch counter there after each epoch; runs up to the epoch given.
EPOCHS = """\
import os, sys
rank, last = int(os.environ["RANK"]), int(sys.argv[1])
epoch = int(open("ckpt.txt").read()) if os.path.exists("ckpt.txt") else 0
print(f"start rank={rank} epoch={epoch}", flush=True)
while epoch < last:
    epoch += 1
    if rank == 0:
        with open("ckpt.txt.tmp", "w") as f:
            f.write(str(epoch))
        os.replace("ckpt.txt.tmp", "ckpt.txt")
    print(f"rank={rank} epoch {epoch} done", flush=True)
"""


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("resume-code")
    (d / "epochs.py").write_text(EPOCHS)
    return d


def reversed_inventory(lab: Lab, path: Path) -> Path:
    """The lab's inventory with its hosts in the other order (node3 is rank 0)."""
    inv = yaml.safe_load(lab.inventory_path.read_text())
    group = inv["all"]["children"]["nodes"]
    group["hosts"] = {name: group["hosts"][name] for name in reversed(list(group["hosts"]))}
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def run(inventory: Path, runs: Path, code: Path, *extra: str) -> list[str]:
    return [
        "run",
        "-i",
        str(inventory),
        "--launcher",
        "plain",
        "--no-check",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        *extra,
    ]


def console(runs: Path, job_id: str, rank: int, host: str) -> str:
    return (runs / job_id / f"{rank}-{host}" / "console.log").read_text()


def test_a_resumed_job_starts_every_node_at_the_earlier_jobs_epoch(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    first = run_cli(*run(lab3.inventory_path, runs, code, str(code / "epochs.py"), "2"), cwd=ROOT)
    assert first.exit_code == 0, first.stdout + first.stderr
    [job1] = [d.name for d in runs.iterdir()]
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert f"start rank={rank} epoch=0" in console(runs, job1, rank, host)

    again = run(lab3.inventory_path, runs, code, str(code / "epochs.py"), "4")
    fresh = run_cli(*again, cwd=ROOT)  # without --resume: a new folder, epoch 0 (as before)
    assert fresh.exit_code == 0, fresh.stderr
    [job2] = [d.name for d in runs.iterdir() if d.name != job1]
    assert "start rank=0 epoch=0" in console(runs, job2, 0, "node1")

    order = reversed_inventory(lab3, tmp_path / "reversed.yml")
    args = run(order, runs, code, "--resume", job1, str(code / "epochs.py"), "4")
    resumed = run_cli(*args, cwd=ROOT)
    assert resumed.exit_code == 0, resumed.stdout + resumed.stderr
    [job3] = [d.name for d in runs.iterdir() if d.name not in (job1, job2)]
    for rank, host in enumerate(("node3", "node2", "node1")):
        log = console(runs, job3, rank, host)
        assert f"start rank={rank} epoch=2" in log, log
        assert f"rank={rank} epoch 3 done" in log and "epoch 1 done" not in log
    record = json.loads((runs / job3 / "job.json").read_text())
    came = record["resumed_from"]
    assert (came["job"], came["from"], came["files"], came["bytes"]) == (
        job1,
        "node1",
        ["ckpt.txt"],
        1,
    )
    # every node's new work folder is another than the earlier job's: the source's too
    assert came["nodes"] == {"node3": "copied", "node2": "copied", "node1": "copied"}
    said = (
        f"checkpoints: 1 file(s), 1 bytes from node1 (rank 0 of job {job1}) to node3, node2, node1"
    )
    assert said in resumed.stderr

    # `last` is the newest job: this one, at epoch 4 now (its rank 0 on node3)
    args = run(lab3.inventory_path, runs, code, "--resume", "last", str(code / "epochs.py"), "5")
    last = run_cli(*args, cwd=ROOT)
    assert last.exit_code == 0, last.stderr
    [job4] = [d.name for d in runs.iterdir() if d.name not in (job1, job2, job3)]
    assert json.loads((runs / job4 / "job.json").read_text())["resumed_from"]["job"] == job3
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert f"start rank={rank} epoch=4" in console(runs, job4, rank, host)


def test_resuming_a_job_without_checkpoint_files_is_refused_before_anything_starts(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    runs = tmp_path / "runs"
    none = run_cli(*run(lab3.inventory_path, runs, code, str(code / "epochs.py"), "0"), cwd=ROOT)
    assert none.exit_code == 0, none.stderr
    [job1] = [d.name for d in runs.iterdir()]
    args = run(lab3.inventory_path, runs, code, "--resume", job1, str(code / "epochs.py"), "2")
    refused = run_cli(*args, cwd=ROOT)
    assert refused.exit_code == 2, refused.stdout + refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith(f"fleetctl: error: --resume {job1}: no checkpoint files in ")
    assert "on node1 (rank 0 of job" in line
    assert [d.name for d in runs.iterdir()] == [job1]  # no run folder, nothing started

    unknown = run_cli(
        *run(
            lab3.inventory_path,
            runs,
            code,
            "--resume",
            "20200101-000000-abcdef",
            str(code / "epochs.py"),
            "2",
        ),
        cwd=ROOT,
    )
    assert unknown.exit_code == 2
    [line] = unknown.stderr.strip().splitlines()
    assert "--resume '20200101-000000-abcdef': no job 20200101-000000-abcdef in" in line
