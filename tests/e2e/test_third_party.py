"""Issue 28: third-party scripts run as ``python train.py`` would run them — in the script's own
folder (``data/`` beside it is found) on every lab host and on this machine alone, shell
scripts with bash — and a torchrun rank's own ``RuntimeError`` is in the closing summary, not
only torchrun's ``ChildFailedError`` boilerplate."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli_process
from fleetctl.testing.jobs import assert_nothing_left, launched_job_id

pytestmark = [pytest.mark.lab, pytest.mark.e2e]

JOB_TIMEOUT = 240

TRAIN = """\
import os
with open("data/x.txt") as f:
    print(f"data={f.read().strip()} rank={os.environ['RANK']} cwd={os.getcwd()}", flush=True)
"""

RUN_SH = """\
echo "shell rank=$RANK data=$(cat data/x.txt) bash=${BASH_VERSION:+yes}"
"""

RAISE = """\
import os, time
rank = int(os.environ["RANK"])
if rank == 1:
    time.sleep(1)
    raise RuntimeError(f"shard 7 is missing on rank {rank}")
time.sleep(120)
"""


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("repo")
    (d / "sub" / "data").mkdir(parents=True)
    (d / "sub" / "data" / "x.txt").write_text("beside\n")
    (d / "sub" / "train.py").write_text(TRAIN)
    (d / "sub" / "run.sh").write_text(RUN_SH)
    (d / "sub" / "raise.py").write_text(RAISE)
    yield d


def run(lab: Lab | None, code: Path, runs: Path, *args: str, launcher: str = "plain") -> CliResult:
    inv = ("--inventory", str(lab.inventory_path), "--no-check") if lab else ()
    return run_cli_process(
        "run", *inv, "--launcher", launcher, "--nproc-per-node", "1",
        "--runs-dir", str(runs), "--code-dir", str(code), *args,
        cwd=code / "sub", timeout=JOB_TIMEOUT,
    )  # fmt: skip


def job_id(stderr: str) -> str:
    return launched_job_id(stderr)


def assert_clean(lab: Lab, job: str) -> None:
    assert_nothing_left(lab.inventory_path, job)


def test_a_sub_folder_script_reads_data_beside_it_on_every_node(
    lab3: Lab, code: Path, tmp_path: Path
) -> None:
    r = run(lab3, code, tmp_path / "runs", "train.py")
    assert r.exit_code == 0, r.stdout + r.stderr
    job = job_id(r.stderr)
    for rank in range(3):
        line = next(x for x in r.stdout.splitlines() if f"rank={rank} " in x)
        assert "data=beside" in line and line.endswith(f"/.fleetctl/work/{job}/sub"), line
    assert_clean(lab3, job)


def test_a_checked_plain_job_names_the_flight_recorder_as_the_nodes_torch_reads_it(
    lab3: Lab, code: Path, tmp_path: Path
) -> None:
    """The lab's fake GPUs turn the flight recorder on; the check finds torch 2.13 on the
    nodes without a launcher import, so plain gets the new name and no rank warns."""
    r = run_cli_process(
        "run", "--inventory", str(lab3.inventory_path), "--launcher", "plain",
        "--runs-dir", str(tmp_path / "runs"), "--code-dir", str(code), "train.py",
        cwd=code / "sub", timeout=JOB_TIMEOUT,
    )  # fmt: skip
    assert r.exit_code == 0, r.stdout + r.stderr
    plan = json.loads((tmp_path / "runs" / job_id(r.stderr) / "plan.json").read_text())
    for node in plan["nodes"]:
        assert node["env"]["TORCH_FR_BUFFER_SIZE"] == "2000", node["env"]
        assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in node["env"]


def test_a_shell_script_runs_with_bash_in_its_folder(lab3: Lab, code: Path, tmp_path: Path) -> None:
    r = run(lab3, code, tmp_path / "runs", "run.sh")
    assert r.exit_code == 0, r.stdout + r.stderr
    for rank in range(3):
        assert f"shell rank={rank} data=beside bash=yes" in r.stdout, r.stdout


def test_a_torchrun_ranks_runtime_error_is_in_the_summary(
    lab3: Lab, code: Path, tmp_path: Path
) -> None:
    r = run(lab3, code, tmp_path / "runs", "raise.py", launcher="torchrun")
    assert r.exit_code == 3, r.stdout + r.stderr
    said = r.stderr.splitlines()
    start = next(i for i, x in enumerate(said) if x.startswith("Out of all 3 nodes"))
    summary = said[start:]
    error = "RuntimeError: shard 7 is missing on rank 1"
    at = next(i for i, x in enumerate(summary) if x.startswith("--- rank 1 (node2), from "))
    assert summary[at].endswith("/attempt_0/0/stderr.log ---"), summary[at]
    assert error in summary[at + 1 : summary.index("---", at + 1)], "\n".join(summary)
    assert_clean(lab3, job_id(r.stderr))


def test_a_sub_folder_script_on_this_machine_alone(code: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    r = run_cli_process(
        "run", "--launcher", "plain", "--runs-dir", str(tmp_path / "runs"),
        "--code-dir", str(code), "train.py",
        cwd=code / "sub", env={"HOME": str(home)}, timeout=JOB_TIMEOUT,
    )  # fmt: skip
    assert r.exit_code == 0, r.stdout + r.stderr
    job = job_id(r.stderr)
    assert f"data=beside rank=0 cwd={home}/.fleetctl/work/{job}/sub" in r.stdout, r.stdout
