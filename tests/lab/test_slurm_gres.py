"""GPUs from Slurm's gres (lab: ``lab up N --slurm --gpus K``, each fake GPU a ``gres/gpu``
backed by a device node the lab makes): ``run --slurm --gres gpu:1`` on 2-GPU nodes plans one
GPU per node from the allocation, and its ranks see the ``CUDA_VISIBLE_DEVICES`` Slurm gave each
step. The run itself is gloo/CPU; the lab's fake nvidia-smi answers the check (in a step, with
the step's GPUs, as ``ConstrainDevices=yes`` makes the real one).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.lab.core import Lab
from fleetctl.lab.slurm import SlurmLab, installed
from fleetctl.testing.cli_runner import run_cli_process
from fleetctl.testing.pytest_plugin import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
GPU_SCRIPT = """\
import os
e = os.environ
print("GPUS", e["RANK"], e["LOCAL_WORLD_SIZE"], e.get("CUDA_VISIBLE_DEVICES"), flush=True)
"""


@pytest.fixture(scope="module")
def slurm(make_lab_module: Callable[..., Lab]) -> Iterator[dict[str, Any]]:
    why = installed()
    if why:
        skip_or_fail(f"Slurm {why} (.ci/run installs slurm-wlm and munge)")
    # 2 GPUs a node, the partition exclusive: the batch step gets both, a step what --gres says
    lab = make_lab_module(2, user=None, shared_home=False, gpus=2)
    s = SlurmLab.start(lab)  # stopped by lab.down by PID
    code = lab.dir / "gres-code"
    code.mkdir()
    (code / "gpus.py").write_text(GPU_SCRIPT)
    env = {"SLURM_CONF": str(s.conf), "PYTHONPATH": str(ROOT)}
    try:
        yield {"lab": lab, "slurm": s, "code": code, "env": env}
    finally:
        shutil.rmtree(code, ignore_errors=True)
        shutil.rmtree(lab.dir / "gres-runs", ignore_errors=True)


def _submit(slurm: dict[str, Any], *args: str) -> Any:
    return run_cli_process(
        "run", "--slurm", "--nodes", "2", "--launcher", "plain",
        "--runs-dir", str(slurm["lab"].dir / "gres-runs"), *args,
        env=slurm["env"], cwd=slurm["code"], timeout=120,
    )  # fmt: skip


def test_the_lab_registers_its_fake_gpus_as_gres(slurm: dict[str, Any]) -> None:
    out = slurm["slurm"].scontrol("show", "node", "-o")
    assert out.count("Gres=gpu:2") == 2, out


def test_gres_gpu_is_in_the_batch_script(slurm: dict[str, Any]) -> None:
    res = _submit(slurm, "--gres", "gpu:1", "--dry-run", "gpus.py")
    assert res.exit_code == 0, res.stderr
    assert "#SBATCH --gres=gpu:1" in res.stdout.splitlines()


def test_ranks_see_the_gpus_slurm_allocated(slurm: dict[str, Any]) -> None:
    res = _submit(slurm, "--gres", "gpu:1", "gpus.py")
    assert res.exit_code == 0, res.stdout + res.stderr
    seen = sorted(ln.split("GPUS", 1)[1].split() for ln in res.stdout.splitlines() if "GPUS" in ln)
    assert seen == [["0", "1", "0"], ["1", "1", "0"]], res.stdout  # rank, -, CUDA_VISIBLE_DEVICES
    folder = next(p for p in (slurm["lab"].dir / "gres-runs").iterdir() if p.is_dir())
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["gpus_per_node"] == 1, plan


def test_a_gres_of_one_gpu_on_two_gpu_nodes_starts_one_rank_per_node(
    slurm: dict[str, Any],
) -> None:
    """The batch step's SLURM_GPUS_ON_NODE is 2 (the exclusive node's), each srun step's 1:
    nproc auto follows --gres, not the batch step (issue 40)."""
    res = _submit(slurm, "--gres", "gpu:1", "--launcher", "torchrun", "gpus.py")
    assert res.exit_code == 0, res.stdout + res.stderr
    seen = sorted(ln.split("GPUS", 1)[1].split() for ln in res.stdout.splitlines() if "GPUS" in ln)
    # rank, LOCAL_WORLD_SIZE, CUDA_VISIBLE_DEVICES: one rank a node, on the GPU of its step
    assert seen == [["0", "1", "0"], ["1", "1", "0"]], res.stdout


def test_a_dry_run_refuses_a_gres_slurm_refuses_as_a_submission_does(
    slurm: dict[str, Any],
) -> None:
    dry = _submit(slurm, "--gres", "bogus", "--dry-run", "gpus.py")
    real = _submit(slurm, "--gres", "bogus", "gpus.py")
    line = "fleetctl: error: Slurm refused the job: Invalid generic resource (gres) specification"
    assert (dry.exit_code, dry.stderr.strip()) == (2, line), dry.stdout + dry.stderr
    assert (real.exit_code, real.stderr.strip()) == (2, line), real.stdout + real.stderr
    ok = _submit(slurm, "--gres", "gpu:1", "--dry-run", "gpus.py")
    assert ok.exit_code == 0 and "Slurm would take it" in ok.stderr, ok.stderr


def test_more_gpus_than_a_node_has_is_refused_in_one_line(slurm: dict[str, Any]) -> None:
    res = _submit(slurm, "--gres", "gpu:9", "gpus.py")
    assert res.exit_code == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "fleetctl: error: Slurm refused the job: Requested node configuration is not available"
    ]


HAND_WRITTEN = """\
#!/bin/sh
#SBATCH --nodes=2
#SBATCH --gres=gpu:1
#SBATCH --output={out}
echo "batch step: SLURM_GPUS_ON_NODE=$SLURM_GPUS_ON_NODE" >&2
cd {code} && exec {python} -m fleetctl run --launcher torchrun --runs-dir {runs} gpus.py
"""


def test_a_hand_written_sbatch_with_gres_starts_one_rank_per_node(
    slurm: dict[str, Any],
) -> None:
    """A user's own sbatch script (``#SBATCH --gres=gpu:1``, then ``fleetctl run``): the batch
    step sees the exclusive node's 2 GPUs, each srun step 1; the plan follows the steps', as
    ``run --slurm`` does (issue 40)."""
    lab = slurm["lab"]
    out = slurm["code"] / "hand-written.out"  # in the code folder: the fixture removes it
    script = slurm["code"] / "hand-written.sh"
    script.write_text(
        HAND_WRITTEN.format(
            out=out, code=slurm["code"], python=sys.executable, runs=lab.dir / "gres-runs"
        )
    )
    env = {**slurm["slurm"].env(), **slurm["env"]}
    p = subprocess.run(
        ["sbatch", "--wait", str(script)], capture_output=True, text=True, env=env, timeout=150
    )
    text = out.read_text() if out.exists() else ""
    assert p.returncode == 0, p.stdout + p.stderr + text
    assert "batch step: SLURM_GPUS_ON_NODE=2" in text, text  # what misled the plan
    seen = sorted(ln.split("GPUS", 1)[1].split() for ln in text.splitlines() if "GPUS " in ln)
    assert seen == [["0", "1", "0"], ["1", "1", "0"]], text  # one rank a node, its step's GPU
