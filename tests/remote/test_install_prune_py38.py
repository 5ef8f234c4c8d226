"""Installed program folders of older hashes (``W/bin/<name>_<sha12>/``) do not pile up: the
installer, run by Python 3.8 as a node runs it, removes them when it installs a new hash, once
they are older than ``PRUNE_DAYS`` and are not among the newest ``PRUNE_KEEP``."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from fleetctl import remote

DAY = 86400.0


def _folder(bin_dir: Path, name: str, age_days: float) -> Path:
    path = bin_dir / name
    path.mkdir(parents=True)
    (path / "stacks.py").write_text("# an older version\n")
    then = time.time() - age_days * DAY
    os.utime(path, (then, then))
    return path


def _install(py38: str, workdir: Path) -> None:
    argv = remote.cached_argv(py38, str(workdir), "stacks.py", "--install-only")
    res = subprocess.run(argv, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr.decode()


def test_installing_a_new_hash_removes_old_folders_of_that_program_only(
    py38: str, tmp_path: Path
) -> None:
    assert (remote.PRUNE_DAYS, remote.PRUNE_KEEP) == (7, 2)
    bin_dir = tmp_path / "w" / "bin"
    ages = {"aaaaaaaaaaa1": 30, "aaaaaaaaaaa2": 20, "aaaaaaaaaaa3": 3, "aaaaaaaaaaa4": 2}
    ages["aaaaaaaaaaa5"] = 1
    old = {h: _folder(bin_dir, f"stacks_{h}", age) for h, age in ages.items()}
    other = _folder(bin_dir, "supervisor_bbbbbbbbbbbb", 30)  # another program's
    odd = _folder(bin_dir, "stacks_backup", 30)  # not a hash: not the installer's
    part = _folder(bin_dir, "stacks_cccccccccccc.123.abcd.part", 30)  # an install cut short

    _install(py38, tmp_path / "w")

    new = Path(remote.installed_path(str(tmp_path / "w"), "stacks.py"))
    assert new.is_dir()
    # the newest two others are kept whatever their age; of the rest, only the young one
    kept = sorted(h for h, path in old.items() if path.exists())
    assert kept == ["aaaaaaaaaaa3", "aaaaaaaaaaa4", "aaaaaaaaaaa5"]
    assert other.is_dir() and odd.is_dir() and part.is_dir()

    # an install that finds its folder there prunes nothing (no listing on a start)
    again = _folder(bin_dir, "stacks_aaaaaaaaaaa0", 40)
    _install(py38, tmp_path / "w")
    assert again.is_dir()
