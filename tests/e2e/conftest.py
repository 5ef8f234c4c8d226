"""End-to-end fixtures shared by the paddle tests."""

from __future__ import annotations

import os
import subprocess

import pytest

from fleetctl.testing.pytest_plugin import skip_or_fail


@pytest.fixture(scope="session")
def paddle_python() -> str:
    """A python that can import paddle's real launcher (.ci/run builds it in its own venv).

    Missing: a skip on a developer's machine, a failure in CI (FLEETCTL_REQUIRE_LAB=1).
    """
    python = os.environ.get(
        "FLEETCTL_PADDLE_PYTHON", "/var/cache/fleetctl-ci/paddle-venv/bin/python"
    )
    ok = os.path.exists(python) and (
        subprocess.run(
            [python, "-c", "import paddle.distributed.launch"], capture_output=True, timeout=120
        ).returncode
        == 0
    )
    if not ok:
        skip_or_fail(f"paddlepaddle not importable by {python} (.ci/run installs it)")
    return python


@pytest.fixture(scope="session")
def deepspeed_python() -> str:
    """A python that can import deepspeed's real launcher (.ci/run builds it in its own venv);
    missing: a skip on a developer's machine, a failure in CI."""
    python = os.environ.get(
        "FLEETCTL_DEEPSPEED_PYTHON", "/var/cache/fleetctl-ci/deepspeed-venv/bin/python"
    )
    ok = os.path.exists(python) and (
        subprocess.run(
            [python, "-c", "import deepspeed.launcher.launch"], capture_output=True, timeout=120
        ).returncode
        == 0
    )
    if not ok:
        skip_or_fail(f"deepspeed not importable by {python} (.ci/run installs it)")
    return python
