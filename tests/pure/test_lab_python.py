"""The lab writes the interpreter its hosts run: a venv's own python, never the base one."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest


def make_venv(venv: Path) -> None:
    """A venv of this interpreter that sees this test run's packages. ``--system-site-packages``
    does that only from a base interpreter: from inside a venv (CI's) it gives the base's site,
    where click is not."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [inner] = (venv / "lib").glob("python3*/site-packages")
    outer = [d for d in site.getsitepackages() if os.path.isdir(d)]
    adds = "; ".join(f"site.addsitedir({d!r})" for d in outer)
    (inner / "_test_run_site.pth").write_text(f"import site; {adds}\n")


def test_lab_up_from_a_venv_names_the_venvs_python(tmp_path: Path) -> None:
    venv = tmp_path / "v"
    make_venv(venv)
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


@pytest.mark.parametrize(
    "python,hidden",
    [
        ("/tmp/v/bin/python", "/tmp"),
        ("/dev/shm/env/bin/python3", "/dev/shm"),
        ("/root/.fleetctl/envs/x/bin/python", "/root/.fleetctl"),
    ],
)
def test_a_python_in_a_host_private_folder_is_refused_naming_it(python: str, hidden: str) -> None:
    from fleetctl.errors import LabInputError
    from fleetctl.lab.core import _check_python_visible

    with pytest.raises(LabInputError) as e:
        _check_python_visible(python)
    msg = e.value.one_line()
    assert msg.startswith(f"the lab hosts cannot run {python}: each host has its own private ")
    assert hidden in msg and e.value.exit_code == 2


def test_a_link_into_tmp_is_refused_by_where_it_points(tmp_path: Path) -> None:
    from fleetctl.errors import LabInputError
    from fleetctl.lab.core import _check_python_visible

    link = Path("/var/tmp") / f"fleetctl-test-python-{tmp_path.name}"
    link.symlink_to(tmp_path / "python3")
    try:
        with pytest.raises(LabInputError, match=rf"{link} \(-> {tmp_path}/python3\)"):
            _check_python_visible(str(link))
    finally:
        link.unlink()
    assert _check_python_visible("/usr/bin/python3") == "/usr/bin/python3"


def test_lab_up_from_a_venv_under_tmp_says_so_and_creates_nothing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("fleetctl lab up checks root first")
    venv = tmp_path / "v"
    make_venv(venv)
    root = Path(__file__).resolve().parents[2]
    lab_dir = Path("/var/tmp") / f"fleetctl-test-lab-{tmp_path.name}"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "fleetctl", "lab", "up", "1", "--dir", str(lab_dir)],
        capture_output=True, text=True, cwd=root, timeout=60,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith(
        f"fleetctl: error: the lab hosts cannot run {venv}/bin/python: each host has its own "
        "private /tmp"
    ), out.stderr
    assert out.stderr.count("\n") == 1 and "[ok]" not in out.stdout + out.stderr
    assert not lab_dir.exists()
