"""A login user whose shell is tcsh (common on older HPC sites) or fish: sshd hands every
command fleetctl sends to ``tcsh -c`` / ``fish -c``. Declared as Ansible wants it
(``ansible_shell_type: csh`` / ``fish``), check, run (push, supervisor start, collect) and exec
with a time limit work; undeclared, the check fails naming the cause instead of a page of
shell errors."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.pytest_plugin import skip_or_fail

pytestmark = pytest.mark.lab


def inventory(lab: Lab, tmp_path: Path, shell_type: str | None) -> Path:
    data = yaml.safe_load(lab.inventory_path.read_text())
    for v in data["all"]["children"]["nodes"]["hosts"].values():
        if shell_type:
            v["ansible_shell_type"] = shell_type
    path = tmp_path / f"hosts-{shell_type}.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(("shell", "shell_type"), [("tcsh", "csh"), ("fish", "fish")])
def test_a_csh_or_fish_login_runs_check_run_and_exec_once_declared(
    make_lab: Callable[..., Lab], tmp_path: Path, shell: str, shell_type: str
) -> None:
    exe = shutil.which(shell)
    if exe is None:
        skip_or_fail(f"{shell} is not installed (.ci/run installs it)")
    user = f"fleet{shell}"
    lab = make_lab(2, networks=2, user=user)
    subprocess.run(["usermod", "-s", exe, user], check=True, timeout=30)  # removed by down
    said = lab.exec("node1", ["getent", "passwd", user], check=True).stdout
    assert said.strip().endswith(f":{exe}")
    env = {"FLEETCTL_CACHE_DIR": str(tmp_path / "cache")}

    bare = run_cli("check", "-i", str(inventory(lab, tmp_path, None)), env=env)
    assert bare.exit_code == 3
    hint = "csh (or fish)" if shell == "tcsh" else "fish"  # tcsh cannot even run the probe
    assert f"set ansible_shell_type: {hint} for this host" in bare.stdout + bare.stderr

    inv = inventory(lab, tmp_path, shell_type)
    ok = run_cli("check", "-i", str(inv), env=env)
    assert ok.exit_code == 0, ok.stdout + ok.stderr

    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(
        "import os, sys\nprint('rank', os.environ['RANK'], 'argv', sys.argv[1:])\n"
    )
    runs = tmp_path / "runs"
    args = ["it's", 'a "b"', "!x", "c\\d"]  # what csh would mangle on its own
    job = run_cli(
        "run", "-i", str(inv), "--launcher", "plain", "--runs-dir", str(runs),
        "--code", str(code), str(code / "job.py"), *args, env=env,
    )  # fmt: skip
    assert job.exit_code == 0, job.stdout + job.stderr
    for rank in (0, 1):
        assert f"rank {rank} argv {args!r}" in job.stdout, job.stdout

    limited = run_cli(
        "exec", "-i", str(inv), "--timeout", "1", "--", "echo started; sleep 30", env=env
    )
    assert limited.exit_code == 124, limited.stdout + limited.stderr
    assert limited.stdout.count("started") == 2
