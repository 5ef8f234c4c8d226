"""Issue 40: ``--launcher accelerate`` on CPU hosts (no GPUs, no nvidia-smi) runs one world.

An unchanged ``Accelerator()``, as in accelerate's own examples, sees every rank of the plan
(``num_processes`` = the world, a sum over ranks by ``accelerator.reduce``, ``gather``): before,
each rank ran alone and the job "succeeded". A rank that raises is named in the summary with its
own error line (its own file), not torch's ``ChildFailedError``. The real accelerate launcher
(``accelerate==1.15.0``, the ``train`` extra) on the lab's python, checked by the real check.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli_process
from fleetctl.testing.jobs import assert_nothing_left, launched_job_id
from fleetctl.testing.pytest_plugin import skip_or_fail

pytestmark = [pytest.mark.lab, pytest.mark.e2e]

JOB_TIMEOUT = 300

# accelerate's examples/cpu-style: Accelerator() unchanged, no cpu=True
WORLD = """\
import sys
import torch
from accelerate import Accelerator

accelerator = Accelerator()
want = int(sys.argv[1])
assert accelerator.num_processes == want, (accelerator.num_processes, want)
total = accelerator.reduce(torch.tensor([accelerator.process_index + 1.0]), reduction="sum")
ranks = accelerator.gather(torch.tensor([accelerator.process_index]))
print(
    f"world={accelerator.num_processes} index={accelerator.process_index} "
    f"type={accelerator.distributed_type.value} device={accelerator.device.type} "
    f"sum={total.item():g} gathered={ranks.tolist()}",
    flush=True,
)
# the process group ended before the interpreter: gloo's threads torn down at exit otherwise
# can abort the process ("terminate called without an active exception", seen under load)
accelerator.wait_for_everyone()
accelerator.end_training()
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
"""

RAISE = """\
from accelerate import Accelerator

accelerator = Accelerator()
if accelerator.process_index == 1:
    raise RuntimeError(f"shard 7 is missing on rank {accelerator.process_index}")
accelerator.wait_for_everyone()  # the others wait for it: ended by fleetctl's teardown
"""


@pytest.fixture(scope="module")
def cpu_lab(make_lab_module: Callable[..., Lab]) -> Lab:
    if importlib.util.find_spec("accelerate") is None:
        skip_or_fail("accelerate is not installed (pip install -e '.[train]')")
    return make_lab_module(3, gpus=0)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("accelerate-code")
    (d / "run_me.py").write_text(WORLD)
    (d / "raise.py").write_text(RAISE)
    return d


def run(lab: Lab, code: Path, runs: Path, *args: str) -> CliResult:
    return run_cli_process(
        "run", "--inventory", str(lab.inventory_path), "--launcher", "accelerate",
        "--runs-dir", str(runs), "--code-dir", str(code), "--grace", "3", *args,
        cwd=code, timeout=JOB_TIMEOUT,
    )  # fmt: skip


def job_id(stderr: str) -> str:
    return launched_job_id(stderr)


def assert_clean(lab: Lab, job: str) -> None:
    assert_nothing_left(lab.inventory_path, job)


def test_an_unchanged_accelerator_on_three_cpu_hosts_is_one_world(
    cpu_lab: Lab, code: Path, tmp_path: Path
) -> None:
    r = run(cpu_lab, code, tmp_path / "runs", "--nproc-per-node", "1", "run_me.py", "3")
    assert r.exit_code == 0, r.stdout + r.stderr
    for index in range(3):
        line = next((x for x in r.stdout.splitlines() if f" index={index} " in x), None)
        assert line is not None, r.stdout + r.stderr
        assert f"world=3 index={index} type=MULTI_CPU device=cpu sum=6 gathered=[0, 1, 2]" in line
    plan = json.loads((tmp_path / "runs" / job_id(r.stderr) / "plan.json").read_text())
    assert plan["gpus_per_node"] == 0
    assert {n["env"]["ACCELERATE_USE_CPU"] for n in plan["nodes"]} == {"true"}


def test_two_ranks_per_cpu_host_join_the_same_world(
    cpu_lab: Lab, code: Path, tmp_path: Path
) -> None:
    """torch's agent starts both local ranks; each one's output comes home in its own file."""
    r = run(cpu_lab, code, tmp_path / "runs", "--nodes", "2", "--nproc-per-node", "2",
            "run_me.py", "4")  # fmt: skip
    assert r.exit_code == 0, r.stdout + r.stderr
    for index in range(4):
        assert f"world=4 index={index} type=MULTI_CPU device=cpu sum=10" in r.stdout, r.stdout
    folder = tmp_path / "runs" / job_id(r.stderr)
    own = sorted(folder.glob("1-*/torchrun/*/attempt_0/1/stdout.log"))
    assert len(own) == 1 and "index=3 " in own[0].read_text(), own


def test_an_accelerate_ranks_own_error_is_in_the_summary(
    cpu_lab: Lab, code: Path, tmp_path: Path
) -> None:
    r = run(cpu_lab, code, tmp_path / "runs", "--no-check", "--nproc-per-node", "1", "raise.py")
    assert r.exit_code == 3, r.stdout + r.stderr
    said = r.stderr.splitlines()
    start = next(i for i, x in enumerate(said) if x.startswith("Out of all 3 nodes"))
    summary = said[start:]
    at = next(i for i, x in enumerate(summary) if x.startswith("--- rank 1 (node2), from "))
    assert summary[at].endswith("/attempt_0/0/stderr.log ---"), "\n".join(summary)
    shown = summary[at + 1 : summary.index("---", at + 1)]
    assert shown[-1].endswith("RuntimeError: shard 7 is missing on rank 1"), "\n".join(summary)
    assert not any("ChildFailedError" in x for x in shown), "\n".join(summary)
    assert_clean(cpu_lab, job_id(r.stderr))


def test_accelerates_own_launcher_runs_as_an_installed_module(
    cpu_lab: Lab, code: Path, tmp_path: Path
) -> None:
    """``-m`` of a module not in the pushed code, installed on the nodes: the check finds it
    there (it was refused for not being in the code). Under plain, each node's accelerate
    ``--cpu`` is one process with plain's RANK/WORLD_SIZE: one world of the 3 nodes."""
    r = run(cpu_lab, code, tmp_path / "runs", "--launcher", "plain",
            "-m", "accelerate.commands.launch", "--cpu", "run_me.py", "3")  # fmt: skip
    assert r.exit_code == 0, r.stdout + r.stderr
    for index in range(3):
        assert f"world=3 index={index} type=MULTI_CPU device=cpu sum=6" in r.stdout, r.stdout


def test_a_module_neither_in_the_code_nor_installed_fails_the_check_naming_it(
    cpu_lab: Lab, code: Path, tmp_path: Path
) -> None:
    r = run(cpu_lab, code, tmp_path / "runs", "--launcher", "plain", "-m", "no_such_module_q7")
    assert r.exit_code == 3, r.stdout + r.stderr
    said = (
        "-m no_such_module_q7: not in the pushed code, and this python cannot find it "
        "installed (ImportError: No module named 'no_such_module_q7')"
    )
    assert said in r.stderr, r.stderr
    assert "launching" not in r.stderr, r.stderr
