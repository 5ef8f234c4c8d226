"""Bad input the hostile tester found (issue 40), refused at once in one line, exit 2: a code
folder that is ``/``, a home folder or far too big to be code (``--code /`` walked the whole
disk, silently); a SCRIPT that is a symlink loop (a traceback); ``--env-var`` names with a
trailing newline (accepted: ``$`` matches before it)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleetctl.api import Fleet
from fleetctl.errors import UsageError
from fleetctl.node import Node
from fleetctl.phases.codesync import check_code_folder, list_files
from fleetctl.testing.cli_runner import run_cli


def one_line(res) -> str:  # type: ignore[no-untyped-def]
    assert res.exit_code == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    [line] = res.stderr.strip().splitlines()
    return line


@pytest.mark.parametrize("dry", [True, False])
def test_the_whole_filesystem_as_code_is_refused_at_once(tmp_path: Path, dry: bool) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    t0 = time.monotonic()
    res = run_cli("run", *(["--dry-run"] if dry else []), "--code", "/", "train.py", cwd=tmp_path)
    assert one_line(res) == (
        "fleetctl: error: code directory / is the whole filesystem; pass --code PROJECT_DIR"
    )
    assert time.monotonic() - t0 < 10


def test_a_home_folder_as_code_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "train.py").write_text("print('hi')\n")
    monkeypatch.setenv("HOME", str(home))
    res = run_cli("run", "--dry-run", "--code", str(home), "train.py", cwd=home)
    assert "is a home folder" in one_line(res)
    with pytest.raises(UsageError, match="is a home folder"):
        Fleet([Node.localhost()]).push(code=home)


def test_a_folder_with_more_files_than_code_has_stops_the_walk_early(tmp_path: Path) -> None:
    for i in range(3):
        sub = tmp_path / f"d{i}"
        sub.mkdir()
        for j in range(4):
            (sub / f"f{j}").write_text("x")
    with pytest.raises(UsageError, match=r"has 8 files or more \(more than 5\)"):
        list_files(tmp_path, limit=5)
    with pytest.raises(UsageError, match="more than 5"):
        check_code_folder(tmp_path, max_files=5)
    assert len(list_files(tmp_path, limit=12)) == 12


def test_a_script_that_is_a_symlink_loop_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    res = run_cli("run", "--dry-run", "a.py", cwd=tmp_path)
    assert one_line(res).startswith("fleetctl: error: script a.py: a symlink loop")


def test_a_code_folder_that_is_a_symlink_loop_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "code").symlink_to(tmp_path / "code")
    with pytest.raises(UsageError, match="cannot be read \\(a symlink loop\\)"):
        check_code_folder(tmp_path / "code")


@pytest.mark.parametrize("item", ["A\n=1", "PATH\n=x"])
def test_an_env_var_name_with_a_line_break_is_refused(tmp_path: Path, item: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    res = run_cli("run", "--dry-run", "--env-var", item, "train.py", cwd=tmp_path)
    assert "--env-var" in one_line(res)
    with pytest.raises(UsageError, match="not a valid variable name"):
        Fleet([Node.localhost()]).run(
            str(tmp_path / "train.py"), env={item.split("=")[0]: "1"}, dry_run=True
        )
