"""The preflight's python probe waits ``--probe-timeout`` seconds (30 by default) on `check` and
`run`: bounded, validated, and named in the error of a host that did not answer in time."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.api import Fleet
from fleetctl.errors import UsageError
from fleetctl.node import Node
from fleetctl.testing.cli_runner import run_cli


@pytest.mark.parametrize("value", ["0", "-5", "601", "nan", "inf", "soon"])
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_probe_timeout_out_of_range_is_refused_in_one_line(
    tmp_path: Path, command: str, value: str
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    args = ("--probe-timeout", value) + (("--dry-run", "train.py") if command == "run" else ())
    res = run_cli(command, *args, cwd=tmp_path)
    assert res.exit_code == 2, res.stderr
    assert "--probe-timeout" in res.stderr.strip().splitlines()[-1]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("value", [0, 601, float("nan"), True])
def test_the_library_refuses_the_same_probe_timeouts(value: float) -> None:
    fleet = Fleet([Node.localhost()])
    with pytest.raises(UsageError, match="--probe-timeout"):
        fleet.check(probe_timeout=value)
    with pytest.raises(UsageError, match="--probe-timeout"):
        fleet.run("train.py", probe_timeout=value, dry_run=True)


def _slow_python(tmp_path: Path, delay: float) -> str:
    """A node python that takes ``delay`` s to start (a loaded host)."""
    import sys

    path = tmp_path / "slowpython"
    path.write_text(f'#!/bin/sh\nsleep {delay}\nexec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_a_host_slower_than_the_probe_timeout_fails_naming_the_option(tmp_path: Path) -> None:
    node = Node.localhost(python=_slow_python(tmp_path, 3), workdir=str(tmp_path / "w"))
    report = Fleet([node]).check(probe_timeout=1, mesh="off", recheck=True)
    assert [(check, why) for _h, check, why in report.failures] == [
        ("python", "python probe did not answer in 1 s; raise --probe-timeout")
    ]


def test_the_same_host_passes_with_a_longer_probe_timeout(tmp_path: Path) -> None:
    node = Node.localhost(python=_slow_python(tmp_path, 3), workdir=str(tmp_path / "w"))
    report = Fleet([node]).check(probe_timeout=20, mesh="off", recheck=True)
    assert not [f for f in report.failures if f[1] == "python"], report.failures
