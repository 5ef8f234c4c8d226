"""The type checker passes: ``python -m mypy`` over the files ``[tool.mypy]`` in pyproject.toml
names (the API, the plan, the run records). CI installs mypy with the ``test`` extra and sets
``FLEETCTL_REQUIRE_TOOLS=1``, so there a missing mypy fails instead of skipping."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_type_checker_passes() -> None:
    if importlib.util.find_spec("mypy") is None:
        if os.environ.get("FLEETCTL_REQUIRE_TOOLS"):
            pytest.fail("FLEETCTL_REQUIRE_TOOLS is set and mypy is not installed (the test extra)")
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    # the incremental cache of the checkout (.mypy_cache, git-ignored): a rerun takes seconds
    proc = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mypy failed:\n{proc.stdout}{proc.stderr}"
    assert "Success" in proc.stdout, proc.stdout
