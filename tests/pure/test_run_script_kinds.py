"""``fleetctl run`` SCRIPT of any kind: a Python file (any name), ``-m MODULE``, a shell script;
where in the code the job runs (the script's own folder); and what is refused before any node
is reached (one line, exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.testing.cli_runner import CliResult, run_cli

# A host that cannot be reached (closed port on loopback): a refusal that came after the check
# would exit 3 (connect), not 2.
UNREACHABLE = "all:\n  hosts:\n    h1:\n      ansible_host: 127.0.0.1\n      ansible_port: 1\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "sub" / "data").mkdir(parents=True)
    (r / "sub" / "train.py").write_text("print(open('data/x.txt').read())\n")
    (r / "sub" / "data" / "x.txt").write_text("x\n")
    (r / "sub" / "run.sh").write_text("echo $RANK\n")
    (r / "pkg" / "train").mkdir(parents=True)
    (r / "pkg" / "__init__.py").write_text("")
    (r / "pkg" / "train" / "__main__.py").write_text("print('m')\n")
    (r / "sub" / "tool.py").write_text("print('t')\n")
    (r / "bin").mkdir()
    (r / "bin" / "trainer").write_text("#!/usr/bin/env python3\nprint('p')\n")
    (r / "bin" / "go").write_text("#!/bin/bash\necho go\n")
    (r / "bin" / "bare").write_text("import sys\nprint(sys.argv)\n")
    (r / "bin" / "notes.txt").write_text("these are notes, not a program\n")
    (r / "bin" / "blob.bin").write_bytes(b"\x7fELF\x00\x01\x02")
    (r / "bin" / "perl").write_text("#!/usr/bin/perl\nprint 1;\n")
    (r / "hosts.yml").write_text(UNREACHABLE)
    return r


def run(repo: Path, *args: str, cwd: Path | None = None) -> CliResult:
    return run_cli("run", "--code-dir", str(repo), *args, cwd=cwd or repo)


def plan(repo: Path, *args: str, cwd: Path | None = None) -> dict[str, Any]:
    r = run(repo, "--dry-run", "--json", "--full", *args, cwd=cwd)
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def refused(repo: Path, *args: str, cwd: Path | None = None) -> str:
    """Run for real against an unreachable host: refused before connecting, one line, exit 2."""
    r = run(repo, "-i", str(repo / "hosts.yml"), "--connect-timeout", "2", *args, cwd=cwd)
    assert r.exit_code == 2, (r.exit_code, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetctl: error: "), r.stderr
    return lines[0]


def test_a_script_in_a_sub_folder_runs_in_its_own_folder(repo: Path) -> None:
    p = plan(repo, "--launcher", "plain", "sub/train.py", "a")
    (node,) = p["nodes"]
    assert p["script"] == "sub/train.py" and p["folder"] == "sub"
    assert node["cwd"] == node["work_dir"] + "/sub"
    assert node["argv"][1:] == ["train.py", "a"]
    assert p == plan(repo, "--launcher", "plain", "train.py", "a", cwd=repo / "sub") | {
        "job_id": p["job_id"],
        "created": p["created"],
        "nodes": p["nodes"],
    }


def test_a_top_level_script_runs_in_the_work_folder_itself(repo: Path) -> None:
    (repo / "top.py").write_text("print(1)\n")
    p = plan(repo, "top.py")
    assert "folder" not in p and "work_dir" not in p["nodes"][0]
    assert p["nodes"][0]["cwd"].endswith("/work/" + p["job_id"])


def test_dash_m_runs_a_module_from_the_current_folder(repo: Path) -> None:
    p = plan(repo, "--launcher", "torchrun", "-m", "pkg.train", "--lr", "1")
    assert p["kind"] == "module" and p["script"] == "pkg.train" and "folder" not in p
    assert p["nodes"][0]["argv"][-4:] == ["-m", "pkg.train", "--lr", "1"]
    assert p["args"] == ["--lr", "1"]
    (repo / "sub" / "mod.py").write_text("print(2)\n")
    q = plan(repo, "--launcher", "plain", "-m", "mod", cwd=repo / "sub")
    assert q["folder"] == "sub" and q["nodes"][0]["argv"][1:] == ["-m", "mod"]
    assert q["nodes"][0]["cwd"].endswith("/sub")


def test_a_module_not_in_the_code_is_left_for_the_check_to_find_installed(repo: Path) -> None:
    """``-m accelerate.commands.launch``: planned as any module (the node python looks it up
    installed; the check asks it first), where it was refused for not being in the code."""
    from fleetctl.plan.script_arg import installed_module

    p = plan(repo, "--launcher", "plain", "-m", "accelerate.commands.launch", "--cpu", "t.py")
    assert p["nodes"][0]["argv"][1:] == ["-m", "accelerate.commands.launch", "--cpu", "t.py"]
    assert installed_module("module", "accelerate.commands.launch", str(repo), "") == (
        "accelerate.commands.launch"
    )
    assert installed_module("module", "pkg.train", str(repo), "") is None  # in the code
    (repo / "sub" / "mod.py").write_text("print(2)\n")
    assert installed_module("module", "mod", str(repo), "sub") is None
    assert installed_module("module", "mod", str(repo), "") == "mod"  # not from the top
    assert installed_module("python", "sub/train.py", str(repo), "sub") is None


def test_a_shell_script_runs_with_bash(repo: Path) -> None:
    p = plan(repo, "--launcher", "plain", "sub/run.sh", "x")
    assert p["kind"] == "shell" and p["nodes"][0]["argv"] == ["bash", "run.sh", "x"]
    t = plan(repo, "--launcher", "torchrun", "sub/run.sh")
    assert t["nodes"][0]["argv"][-3:] == ["--no-python", "bash", "run.sh"]


def test_files_without_py_are_read_for_what_they_are(repo: Path) -> None:
    assert "kind" not in plan(repo, "bin/trainer")  # #! python: Python
    assert "kind" not in plan(repo, "bin/bare")  # parses as Python
    assert plan(repo, "--launcher", "plain", "bin/go")["kind"] == "shell"  # #!/bin/bash


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--launcher", "paddle", "sub/run.sh"], "the paddle launcher cannot run a shell script"),
        (["--launcher", "paddle", "-m", "pkg.train"], "the paddle launcher cannot run a module"),
        (["--launcher", "paddle", "bin/trainer"], "paddle runs only *.py scripts"),
        (["bin/notes.txt"], "neither a Python file nor a shell script"),
        (["bin/blob.bin"], "it is a binary file"),
        (["bin/perl"], "its #! line runs /usr/bin/perl"),
        (["sub/missing.py"], "script not found: sub/missing.py"),
        (["-m"], "-m needs a MODULE"),
        (["-m", "pkg/train.py"], "not a module name"),
        (["--launcher-arg=-m", "sub/tool.py"], "fleetctl sets torchrun's -m from how SCRIPT"),
    ],
)
def test_what_cannot_run_is_refused_before_any_node_is_reached(
    repo: Path, args: list[str], says: str
) -> None:
    assert says in refused(repo, *args)
