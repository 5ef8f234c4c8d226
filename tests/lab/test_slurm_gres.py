"""GPUs from Slurm's gres (lab: ``lab up N --slurm --gpus K``, each fake GPU a ``gres/gpu``
backed by a device node the lab makes): ``run --slurm --gres gpu:1`` plans one GPU per node from
the allocation, and its ranks see the ``CUDA_VISIBLE_DEVICES`` Slurm gave each step. The run
itself is gloo/CPU; the lab's fake nvidia-smi answers the check.
"""

from __future__ import annotations

import json
import shutil
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
print("GPUS", e["RANK"], e.get("CUDA_VISIBLE_DEVICES"), e.get("SLURM_JOB_GPUS"), flush=True)
"""


@pytest.fixture(scope="module")
def slurm(make_lab_module: Callable[..., Lab]) -> Iterator[dict[str, Any]]:
    why = installed()
    if why:
        skip_or_fail(f"Slurm {why} (.ci/run installs slurm-wlm and munge)")
    lab = make_lab_module(2, user=None, shared_home=False, gpus=1)
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
    assert out.count("Gres=gpu:1") == 2, out


def test_gres_gpu_is_in_the_batch_script(slurm: dict[str, Any]) -> None:
    res = _submit(slurm, "--gres", "gpu:1", "--dry-run", "gpus.py")
    assert res.exit_code == 0, res.stderr
    assert "#SBATCH --gres=gpu:1" in res.stdout.splitlines()


def test_ranks_see_the_gpus_slurm_allocated(slurm: dict[str, Any]) -> None:
    res = _submit(slurm, "--gres", "gpu:1", "gpus.py")
    assert res.exit_code == 0, res.stdout + res.stderr
    seen = sorted(ln.split("GPUS", 1)[1].split() for ln in res.stdout.splitlines() if "GPUS" in ln)
    assert seen == [["0", "0", "0"], ["1", "0", "0"]], res.stdout  # rank, CUDA_VISIBLE_DEVICES
    folder = next(p for p in (slurm["lab"].dir / "gres-runs").iterdir() if p.is_dir())
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["gpus_per_node"] == 1, plan


def test_more_gpus_than_a_node_has_is_refused_in_one_line(slurm: dict[str, Any]) -> None:
    res = _submit(slurm, "--gres", "gpu:9", "gpus.py")
    assert res.exit_code == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines() == [
        "fleetctl: error: Slurm refused the job: Requested node configuration is not available"
    ]
