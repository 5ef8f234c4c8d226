"""A node is ready for fleetctl: what playbooks/bootstrap.yml sets up is there and in effect.

pytest tests/infra/test_node_ready.py --hosts=ssh://ubuntu@gpu01,ssh://ubuntu@gpu02
"""

from __future__ import annotations

import shlex

import pytest

from fleetctl.testing.infra import READY_MAX_SESSIONS, READY_MAX_STARTUPS, sshd_effective


def test_python3_runs_and_is_recent_enough(host, node_python: str) -> None:
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    r = host.run(shlex.join([node_python, "-c", code]))
    assert r.rc == 0, f"{node_python} does not run: {r.stderr.strip()}"
    version = tuple(int(x) for x in r.stdout.strip().split("."))
    assert version >= (3, 8), f"{node_python} is {r.stdout.strip()}, fleetctl needs >= 3.8"


@pytest.mark.parametrize("command", ["rsync", "ps", "ip", "tar"])
def test_command_fleetctl_uses_is_installed(host, command: str) -> None:
    # find_command also looks in /sbin and /usr/sbin, which a plain user's PATH may lack
    try:
        host.find_command(command)
    except ValueError:
        pytest.fail(f"{command} is not installed (run playbooks/bootstrap.yml)")


def test_rsync_runs(host) -> None:
    r = host.run("rsync --version")
    assert r.rc == 0 and "rsync" in r.stdout, r.stderr


def test_workdir_is_a_private_directory_of_the_ssh_user(host, workdir: str) -> None:
    # One command (user, expanded path, type|owner|mode): each SSH round trip costs.
    r = host.run(
        'u=$(id -un); d=%s; case "$d" in "~") d=$HOME;; "~/"*) d="$HOME/${d#"~/"}";; esac; '
        'printf "%%s\\n%%s\\n" "$u" "$d"; stat -c "%%F|%%U|%%a" -- "$d"',
        workdir,
    )
    user, path, *rest = [*r.stdout.splitlines(), "", ""]
    assert r.rc == 0 and rest[0], f"{path or workdir} is missing (run playbooks/bootstrap.yml)"
    kind, owner, mode = rest[0].split("|")
    assert kind == "directory", f"{path} is a {kind}, not a directory"
    assert owner == user, f"{path} is owned by {owner}, not the SSH user {user}"
    assert int(mode, 8) == 0o700, f"{path} has mode {int(mode, 8):04o}, want 0700"


def test_sshd_allows_many_parallel_sessions(host, sshd_config: str, sshd_binary: str) -> None:
    settings = sshd_effective(host, sshd_config, sshd_binary)
    sessions = int(settings["maxsessions"])
    startups = int(settings["maxstartups"].split(":")[0])
    assert sessions >= READY_MAX_SESSIONS, f"MaxSessions {sessions} < {READY_MAX_SESSIONS}"
    assert startups >= READY_MAX_STARTUPS, f"MaxStartups {startups} < {READY_MAX_STARTUPS}"
