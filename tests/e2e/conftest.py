"""End-to-end fixtures: the real paddle and deepspeed launchers, each in its own venv."""

from __future__ import annotations

import os
import subprocess

import pytest

from fleetctl.testing.pytest_plugin import skip_or_fail


def _launcher_python(variable: str, venv: str, module: str, what: str) -> str:
    """A python that can import ``module`` (.ci/run builds it in ``venv``, or ``variable``
    names it). Missing: a skip on a developer's machine, a failure in CI
    (FLEETCTL_REQUIRE_LAB=1)."""
    python = os.environ.get(variable, f"/var/cache/fleetctl-ci/{venv}/bin/python")
    ok = os.path.exists(python) and (
        subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, timeout=120
        ).returncode
        == 0
    )
    if not ok:
        skip_or_fail(f"{what} not importable by {python} (.ci/run installs it)")
    return python


@pytest.fixture(scope="session")
def paddle_python() -> str:
    return _launcher_python(
        "FLEETCTL_PADDLE_PYTHON", "paddle-venv", "paddle.distributed.launch", "paddlepaddle"
    )


@pytest.fixture(scope="session")
def deepspeed_python() -> str:
    return _launcher_python(
        "FLEETCTL_DEEPSPEED_PYTHON", "deepspeed-venv", "deepspeed.launcher.launch", "deepspeed"
    )
