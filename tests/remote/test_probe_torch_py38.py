"""The check probe (Python 3.8) learns the node python's torch version where no launcher
import says it (plain: looked up without importing torch; deepspeed: the torch its import
brought), so the plan names the flight recorder's buffer as that torch reads it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import node_tree

from fleetctl.phases.check.preflight import probe_command
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


# The version from the dist-info folder's name, in the job python's own search order, with no
# second interpreter (~60 ms of CPU on every node, every run, before this): a venv (under the
# probe's -S, sys.prefix is still the base's), PYTHONPATH first, and two dist-infos in one
# folder left to importlib.metadata.
FOLDERS = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import facts
facts.run = lambda *a, **k: (_ for _ in ()).throw(AssertionError("second interpreter"))
print(json.dumps({"dirs": facts.site_dirs(), "torch": facts.torch_facts()}))
"""


def folders(python: str, remote_dir: Path, env: dict | None = None) -> dict:
    out = subprocess.run(
        [python, "-S", "-c", FOLDERS, str(remote_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONNOUSERSITE": "1", **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    import json

    return json.loads(out.stdout)


def dist(folder: Path, version: str) -> None:
    (folder / f"torch-{version}.dist-info").mkdir(parents=True)


def test_a_venvs_torch_is_read_from_its_folder_with_no_second_interpreter(
    py38: str, tmp_path: Path
) -> None:
    remote_dir = Path(node_tree())
    venv = tmp_path / "venv"
    subprocess.run([py38, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site_pkgs = venv / "lib" / "python3.8" / "site-packages"
    dist(site_pkgs, "2.9.1")
    got = folders(str(venv / "bin" / "python"), remote_dir)
    assert got["torch"] == {"version": "2.9.1"}
    assert got["dirs"][0] == str(site_pkgs)  # no system site: the venv's folder alone
    assert len(got["dirs"]) == 1

    # PYTHONPATH comes first, as it does for the job
    first = tmp_path / "pp"
    dist(first, "2.13.0")
    got = folders(str(venv / "bin" / "python"), remote_dir, {"PYTHONPATH": str(first)})
    assert got["torch"] == {"version": "2.13.0"}


def test_two_dist_infos_in_one_folder_go_to_importlib(py38: str, tmp_path: Path) -> None:
    """A broken install (two versions side by side) is not guessed at: the full lookup runs."""
    remote_dir = Path(node_tree())
    pp = tmp_path / "pp"
    dist(pp, "2.9.1")
    dist(pp, "2.13.0")
    out = subprocess.run(
        [py38, "-S", "-c", FOLDERS, str(remote_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONNOUSERSITE": "1", "PYTHONPATH": str(pp)},
    )
    assert out.returncode != 0 and "second interpreter" in out.stderr


def test_an_installed_dash_m_module_is_found_without_being_run(py38: str, tmp_path: Path) -> None:
    """``run -m MODULE`` of a module not in the code: looked up as ``python -m`` would (a
    package by its ``__main__``), never imported: its ``__main__`` would start the job."""
    s = site(tmp_path, dist=False)
    (s / "tool").mkdir()
    (s / "tool" / "__init__.py").write_text("")
    (s / "tool" / "__main__.py").write_text("open('RAN', 'w').write('ran')\n")
    facts = probe(py38, tmp_path, s, script_module="tool")
    assert facts["script_module"] == {"module": "tool", "origin": str(s / "tool" / "__main__.py")}
    assert not list(tmp_path.rglob("RAN")) and not (Path.home() / "RAN").exists()
    said = {
        "fakeds.runner": {"origin": str(s / "fakeds" / "runner.py")},
        "fakeds": {"error": "ImportError: fakeds is a package with no __main__"},
        "nope.x": {"error": "ModuleNotFoundError: No module named 'nope'"},
        "nope": {"error": "ImportError: No module named 'nope'"},
    }
    for module, want in said.items():
        got = probe(py38, tmp_path, s, script_module=module)["script_module"]
        assert got == {"module": module, **want}, module
