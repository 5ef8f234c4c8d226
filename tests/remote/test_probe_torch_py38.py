"""The check probe (Python 3.8) learns the node python's torch version where no launcher
import says it (plain: looked up without importing torch; deepspeed: the torch its import
brought), so the plan names the flight recorder's buffer as that torch reads it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fleetctl.phases.check import probe_command
from fleetctl.phases.frames import last_data


def site(tmp_path: Path, *, dist: bool) -> Path:
    """A stand-in torch 2.11.0 (a package, and with ``dist`` its installed metadata) and a
    launcher module that imports it, as deepspeed's does."""
    s = tmp_path / "site"
    (s / "torch").mkdir(parents=True)
    (s / "torch" / "__init__.py").write_text("__version__ = '2.11.0'\n")
    (s / "fakeds").mkdir()
    (s / "fakeds" / "__init__.py").write_text("__version__ = '0.19.8'\nimport torch\n")
    (s / "fakeds" / "runner.py").write_text("")
    if dist:
        (s / "torch-2.11.0.dist-info").mkdir()
        meta = "Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n"
        (s / "torch-2.11.0.dist-info" / "METADATA").write_text(meta)
    return s


def probe(py38: str, tmp_path: Path, path: Path, **extra: object) -> dict:
    args = {
        "address": "127.0.0.1",
        "nic": "lo",
        "workdir": str(tmp_path / "w"),
        "allow_loopback": True,
        **extra,
    }
    env = {**os.environ, "PYTHONPATH": str(path)}
    out = subprocess.run(
        probe_command(py38, args), shell=True, capture_output=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    facts = last_data(out.stdout.decode())
    assert facts is not None, out.stdout
    return facts


def test_a_plain_jobs_probe_finds_torchs_version_without_importing_it(
    py38: str, tmp_path: Path
) -> None:
    facts = probe(py38, tmp_path, site(tmp_path, dist=True), torch_version=True)
    assert facts["torch"] == {"version": "2.11.0"} and facts["launcher"] is None


def test_no_torch_installed_is_an_empty_version_not_a_failure(py38: str, tmp_path: Path) -> None:
    facts = probe(py38, tmp_path, site(tmp_path, dist=False), torch_version=True)
    assert facts["torch"] == {"version": ""}
    assert "torch" not in probe(py38, tmp_path, tmp_path)  # not asked: not looked up


def test_the_launcher_import_reports_the_torch_it_brought(py38: str, tmp_path: Path) -> None:
    facts = probe(py38, tmp_path, site(tmp_path, dist=False), launcher_module="fakeds.runner")
    assert facts["launcher"] == {"module": "fakeds.runner", "version": "0.19.8", "torch": "2.11.0"}
