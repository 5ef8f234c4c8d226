"""examples/ddp_train.py really trains: standalone, and as two gloo ranks under torchrun.

Local only (loopback): the multi-host runs through ``fleetctl run`` live in the lab e2e tests.
Skipped without torch, except in CI (FLEETCTL_REQUIRE_LAB=1) where a missing torch is a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.testing.pytest_plugin import skip_or_fail

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "ddp_train.py"
TIMEOUT = 180

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False

if not HAVE_TORCH:
    skip_or_fail("torch is not installed (the e2e tests need it)", allow_module_level=True)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=ROOT
    )


def _torchrun2(*args: str) -> subprocess.CompletedProcess[str]:
    """Two local ranks under torchrun's standalone (single-node) rendezvous."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return _run([*launcher, "--nproc-per-node=2", str(SCRIPT), *args])


def test_standalone_single_process() -> None:
    r = _run([sys.executable, str(SCRIPT), "--epochs", "2", "--steps", "4"])
    assert r.returncode == 0, r.stderr
    losses = [float(x) for x in re.findall(r"^epoch=\d+ loss=([0-9.]+)$", r.stdout, re.M)]
    assert len(losses) == 2 and losses[1] < losses[0]  # it learns
    assert re.search(r"^done rank=0 world=1 loss=[0-9.]+$", r.stdout, re.M)


def test_torchrun_two_ranks_and_literal_args() -> None:
    odd = ["two words", 'it\'s "q"', "a;b", "$(hostname)"]
    r = _torchrun2("--epochs", "1", "--steps", "3", "--print-args", *odd)
    assert r.returncode == 0, r.stdout[-3000:] + "\n--- stderr ---\n" + r.stderr[-5000:]
    assert sorted(re.findall(r"^done rank=(\d) world=2 ", r.stdout, re.M)) == ["0", "1"]
    assert len(re.findall(r"^epoch=0 loss=", r.stdout, re.M)) == 1  # rank 0 only
    printed = [json.loads(m) for m in re.findall(r"^argv-json: (.*)$", r.stdout, re.M)]
    assert printed == [["--epochs", "1", "--steps", "3", "--print-args", *odd]] * 2


def test_fail_rank_fails_the_job() -> None:
    fail = ("--fail-rank", "1", "--fail-step", "1", "--timeout", "30")
    r = _torchrun2("--epochs", "2", "--steps", "3", *fail)
    assert r.returncode != 0
    assert "intentional failure at rank 1 step 1" in r.stdout + r.stderr
    assert "done rank=" not in r.stdout


def test_readmes_first_command_runs_on_a_machine_without_rsync(tmp_path: Path) -> None:
    """README's first command on a fresh machine: the embedded local node needs neither ssh
    nor rsync. rsync is hidden in a private mount namespace (this machine is not touched)."""
    import shutil

    rsync = shutil.which("rsync")
    if os.geteuid() != 0 or rsync is None or shutil.which("unshare") is None:
        skip_or_fail("hiding rsync needs root, unshare and an rsync to hide")
    hide = f'mount --bind /dev/null {rsync} && ! command -v rsync >/dev/null && exec "$@"'
    fleetctl = [sys.executable, "-m", "fleetctl", "run", "--runs-dir", str(tmp_path / "runs")]
    r = _run(["unshare", "-m", "sh", "-c", hide, "sh", *fleetctl, str(SCRIPT), "--epochs", "2"])
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"^Node 0 \(\S+\) succeeded in ", r.stderr, re.M), r.stderr[-2000:]
    assert re.search(r"^\[0 \S+\] done rank=0 world=1 ", r.stdout, re.M), r.stdout[-2000:]
    # the `train` extra pins numpy beside torch, which warns twice per process without it
    assert "Failed to initialize NumPy" not in r.stdout, "numpy missing: pip install -e '.[train]'"


def test_launcher_args_reach_torchrun_a_restart_budget_recovers_a_failed_worker(
    tmp_path: Path,
) -> None:
    """``--launcher-arg=--max-restarts=1`` really reaches torchrun: the worker fails in its
    first life (TORCHELASTIC_RESTART_COUNT=0) and torchrun restarts it; the job succeeds."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "flaky.py").write_text(
        "import os, sys\n"
        "n = os.environ['TORCHELASTIC_RESTART_COUNT']\n"
        "print('life', n, flush=True)\n"
        "sys.exit(1 if n == '0' else 0)\n"
    )
    r = _run(
        [
            sys.executable,
            "-m",
            "fleetctl",
            "run",
            "--launcher",
            "torchrun",
            "--launcher-arg=--max-restarts=1",
            "--launcher-arg",
            "--monitor-interval=0.2",
            "--runs-dir",
            str(tmp_path / "runs"),
            "--code",
            str(code),
            str(code / "flaky.py"),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "life 0" in r.stdout and "life 1" in r.stdout
    [folder] = (tmp_path / "runs").iterdir()
    argv = json.loads((folder / "plan.json").read_text())["nodes"][0]["argv"]
    i = argv.index("--redirects=3")  # fleetctl's own flags first, then the user's, then SCRIPT
    assert argv[i + 1 : i + 3] == ["--max-restarts=1", "--monitor-interval=0.2"]
    assert argv[i + 3].endswith("flaky.py")
