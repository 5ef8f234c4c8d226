"""The node-side tier: every program in ``fleetctl/remote/`` run by Python 3.8, the oldest
python a node may have, exactly as fleetctl ships it (``python -c SOURCE``, or installed).

The interpreter comes from ``FLEETCTL_PYTHON38`` (``.ci/run`` finds pyenv's). Without it these
tests skip; with ``FLEETCTL_REQUIRE_LAB=1`` (CI) a missing or wrong interpreter FAILS them.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from fleetctl import remote


def _python38() -> str:
    path = os.environ.get("FLEETCTL_PYTHON38", "")
    why = None
    if not path:
        why = "FLEETCTL_PYTHON38 is not set"
    elif not os.access(path, os.X_OK):
        why = f"FLEETCTL_PYTHON38={path} is not an executable"
    else:
        out = subprocess.run(
            [path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if out.stdout.strip() != "3.8":
            why = f"FLEETCTL_PYTHON38={path} is Python {out.stdout.strip() or '?'}, not 3.8"
    if why is not None:
        if os.environ.get("FLEETCTL_REQUIRE_LAB") == "1":
            pytest.fail(f"FLEETCTL_REQUIRE_LAB=1 but {why}", pytrace=False)
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def py38() -> str:
    """Path of a Python 3.8 interpreter (skips, or fails under FLEETCTL_REQUIRE_LAB=1)."""
    return _python38()


@pytest.fixture
def run38(py38: str):  # type: ignore[no-untyped-def]
    """``run38(name, args, stdin=…)``: a program of fleetctl/remote run by Python 3.8."""

    def run(
        name: str, args: Sequence[str] = (), **kw: object
    ) -> subprocess.CompletedProcess[bytes]:
        return run_program(py38, name, args, **kw)  # type: ignore[arg-type]

    return run


def run_program(
    python: str,
    name: str,
    args: Sequence[str] = (),
    *,
    stdin: bytes | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> subprocess.CompletedProcess[bytes]:
    """``python -S -c <fleetctl/remote/NAME> ARGS…``, as a node runs it."""
    return subprocess.run(
        [python, remote.NO_SITE, "-c", remote.inline(name), *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


@functools.cache
def node_tree() -> str:
    """A folder holding ``fleetctl/remote/`` as an install folder on a node holds it: the
    package ``remote`` (every node module; the installer stays home, its ``__init__`` empty).
    Put first on ``sys.path``, ``from remote.X import …`` imports a node module as nodes do."""
    root = Path(tempfile.mkdtemp(prefix="fleetctl-node-tree-"))
    atexit.register(shutil.rmtree, root, True)
    for src in remote.HERE.rglob("*.py"):
        rel = src.relative_to(remote.HERE)
        dest = root / remote.NODE_PACKAGE / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text("" if rel.name == "__init__.py" else src.read_text())
    return str(root)
