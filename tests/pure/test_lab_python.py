"""The lab writes the interpreter its hosts run: a venv's own python, never the base one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def test_lab_up_from_a_venv_names_the_venvs_python(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
    )
    code = "from fleetctl.lab.core import _real_python; print(_real_python())"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        capture_output=True, text=True, check=True, cwd=root,
    )  # fmt: skip
    assert out.stdout.strip() == str(venv / "bin" / "python")


def test_outside_a_venv_the_real_interpreter_not_a_shim() -> None:
    from fleetctl.lab.core import _real_python

    if sys.prefix != sys.base_prefix:
        pytest.skip("this test process runs in a venv: the other test covers that case")
    assert _real_python() == str(Path(sys.executable).resolve())
