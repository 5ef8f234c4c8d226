"""The shipped playbooks parse (ansible-playbook --syntax-check) and pass ansible-lint.

Needs ansible-core / ansible-lint (both in the ``test`` extra) but no hosts and no network:
ansible-lint runs with ``--offline`` (no collection downloads; the playbooks use only
ansible.builtin modules).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl.provision import playbooks_dir, shipped_playbooks
from fleetctl.testing.pytest_plugin import skip_or_fail

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    exe = shutil.which(name)
    if exe is None:
        skip_or_fail(f"{name} is not installed (pip install -e '.[test]')")
    return exe


def _env(tmp_path: Path) -> dict[str, str]:
    # Keep Ansible's and ansible-lint's caches out of the developer's home.
    return {
        **os.environ,
        "ANSIBLE_HOME": str(tmp_path / "ansible"),
        "XDG_CACHE_HOME": str(tmp_path),
    }


@pytest.mark.parametrize("name", shipped_playbooks())
def test_playbook_passes_ansible_syntax_check(name: str, tmp_path: Path) -> None:
    exe = _tool("ansible-playbook")
    p = subprocess.run(
        [exe, "--syntax-check", "-i", "localhost,", str(playbooks_dir() / f"{name}.yml")],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=_env(tmp_path),
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_playbooks_pass_ansible_lint_production_profile(tmp_path: Path) -> None:
    exe = _tool("ansible-lint")
    books = [str(playbooks_dir() / f"{n}.yml") for n in shipped_playbooks()]
    p = subprocess.run(
        [exe, "--offline", "--nocolor", "--profile", "production", *books],
        capture_output=True, text=True, timeout=300, cwd=REPO, env=_env(tmp_path),
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
