"""fleetctl provision: how the ansible-playbook command is built (no network, nothing runs)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

from fleetctl.errors import InventoryError, ProvisionError, UsageError
from fleetctl.provision import (
    FORCED_ENV,
    PlaybookCommand,
    exit_error,
    parse_recap,
    playbook_command,
    playbooks_dir,
    resolve_playbook,
    run_playbook,
    shipped_playbooks,
)
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.infra import READY_MAX_SESSIONS, READY_MAX_STARTUPS
from fleetctl.transport.connection import SSHSettings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has an `ansible-playbook` (found, never executed here)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "ansible-playbook"
    exe.write_text("#!/bin/sh\nexit 99\n")
    exe.chmod(0o755)
    return {"PATH": str(bindir), "HOME": str(tmp_path), "ANSIBLE_HOST_KEY_CHECKING": "False"}


def write_inventory(tmp_path: Path, hosts: dict[str, dict[str, object]]) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return path


def common_args(argv: list[str]) -> list[str]:
    return shlex.split(argv[argv.index("--ssh-common-args") + 1])


def test_shipped_playbooks_are_found_by_short_name_in_the_repository_copy() -> None:
    assert shipped_playbooks() == ["bootstrap", "conda-env", "gpu-facts"]
    assert playbooks_dir() == (REPO / "playbooks").resolve()
    assert resolve_playbook("bootstrap") == REPO / "playbooks" / "bootstrap.yml"
    assert resolve_playbook("gpu-facts.yml") == REPO / "playbooks" / "gpu-facts.yml"


def test_an_existing_playbook_path_wins_over_a_shipped_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = tmp_path / "bootstrap.yml"
    mine.write_text("- hosts: all\n  tasks: []\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_playbook("bootstrap.yml") == mine
    assert resolve_playbook("bootstrap") == REPO / "playbooks" / "bootstrap.yml"


def test_an_unknown_playbook_is_a_usage_error_naming_the_shipped_ones() -> None:
    with pytest.raises(UsageError, match=r"playbook not found: nope .*bootstrap, conda-env"):
        resolve_playbook("nope")
    with pytest.raises(UsageError):
        resolve_playbook("some/dir/bootstrap.yml")


def test_without_ansible_playbook_on_path_the_error_is_one_line_with_exit_code_1(
    tmp_path: Path,
) -> None:
    inv = write_inventory(tmp_path, {"n1": {"ansible_host": "10.0.0.1"}})
    with (
        pytest.raises(ProvisionError) as err,
        playbook_command("bootstrap", inv, environ={"PATH": str(tmp_path)}),
    ):
        pass
    assert err.value.exit_code == 1
    assert "\n" not in str(err.value)
    assert "ansible-playbook not found on PATH" in err.value.one_line()
    assert "fleetctl[ansible]" in str(err.value)


def test_hosts_without_ssh_args_get_fleetctls_known_hosts_and_strict_checking(
    tmp_path: Path, fake_path: dict[str, str]
) -> None:
    kh = tmp_path / "kh"
    inv = write_inventory(
        tmp_path,
        {
            "n1": {"ansible_host": "10.0.0.1", "fleetctl_known_hosts": str(kh)},
            "n2": {"ansible_host": "10.0.0.2", "fleetctl_known_hosts": str(kh)},
        },
    )
    with playbook_command("bootstrap", inv, environ=fake_path) as cmd:
        assert cmd.argv[0] == str(Path(fake_path["PATH"]) / "ansible-playbook")
        assert cmd.argv[1:3] == ["-i", str(inv)]
        assert common_args(cmd.argv) == [
            "-o", f"UserKnownHostsFile={kh}", "-o", "StrictHostKeyChecking=yes",
        ]  # fmt: skip
        assert cmd.argv[-1] == str(REPO / "playbooks" / "bootstrap.yml")
        assert cmd.overlay is None
        assert cmd.hosts == ("n1", "n2")
        # forced on, whatever the caller's environment said
        assert cmd.env["ANSIBLE_HOST_KEY_CHECKING"] == "True"
        assert FORCED_ENV["ANSIBLE_HOST_KEY_CHECKING"] == "True"


def test_known_hosts_option_and_accept_new_and_hidden_ssh_config_are_passed_on(
    tmp_path: Path, fake_path: dict[str, str]
) -> None:
    inv = write_inventory(tmp_path, {"n1": {"ansible_host": "10.0.0.1"}})
    settings = SSHSettings(known_hosts="/x/known", accept_new=True)
    env = {**fake_path, "FLEETCTL_SSH_CONFIG": "/dev/null"}
    with playbook_command("gpu-facts", inv, settings=settings, environ=env) as cmd:
        assert common_args(cmd.argv) == [
            "-F", "/dev/null",
            "-o", "UserKnownHostsFile=/x/known", "-o", "StrictHostKeyChecking=accept-new",
        ]  # fmt: skip


def test_hosts_whose_inventory_already_sets_ssh_args_are_left_alone(
    tmp_path: Path, fake_path: dict[str, str]
) -> None:
    args = "-F /dev/null -o UserKnownHostsFile=/lab/kh -o StrictHostKeyChecking=yes"
    inv = write_inventory(
        tmp_path, {"n1": {"ansible_host": "10.0.0.1", "ansible_ssh_common_args": args}}
    )
    env = {**fake_path, "FLEETCTL_SSH_CONFIG": "/dev/null"}
    with playbook_command("bootstrap", inv, environ=env) as cmd:
        assert "--ssh-common-args" not in cmd.argv
        assert cmd.overlay is None
        assert cmd.argv.count("-i") == 1


def test_different_known_hosts_per_host_go_into_a_temporary_overlay_inventory(
    tmp_path: Path, fake_path: dict[str, str]
) -> None:
    inv = write_inventory(
        tmp_path,
        {
            "n1": {"ansible_host": "10.0.0.1", "fleetctl_known_hosts": "/k/one"},
            "n2": {"ansible_host": "10.0.0.2", "fleetctl_known_hosts": "/k/two"},
            # own args without a known_hosts file: ours are appended, theirs kept first
            "n3": {"ansible_host": "10.0.0.3", "ansible_ssh_common_args": "-o Compression=yes"},
            "n4": {
                "ansible_host": "10.0.0.4",
                "ansible_ssh_common_args": "-o UserKnownHostsFile=/k/4 "
                "-o StrictHostKeyChecking=yes",
            },
        },
    )
    with playbook_command("bootstrap", inv, environ=fake_path) as cmd:
        assert "--ssh-common-args" not in cmd.argv
        assert cmd.overlay is not None
        assert cmd.argv[1:5] == ["-i", str(inv), "-i", str(cmd.overlay)]
        hosts = yaml.safe_load(cmd.overlay.read_text())["all"]["hosts"]
        overlay_path = cmd.overlay
        assert shlex.split(hosts["n1"]["ansible_ssh_common_args"]) == [
            "-o", "UserKnownHostsFile=/k/one", "-o", "StrictHostKeyChecking=yes",
        ]  # fmt: skip
        assert "UserKnownHostsFile=/k/two" in hosts["n2"]["ansible_ssh_common_args"]
        assert shlex.split(hosts["n3"]["ansible_ssh_common_args"]) == [
            "-o", "Compression=yes",
            "-o", "UserKnownHostsFile=" + os.path.expanduser("~/.ssh/known_hosts"),
            "-o", "StrictHostKeyChecking=yes",
        ]  # fmt: skip
        assert "n4" not in hosts  # says both itself
        assert cmd.warnings == []
    assert not overlay_path.exists()


def test_limit_is_checked_by_fleetctl_and_passed_to_ansible_verbatim(
    tmp_path: Path, fake_path: dict[str, str]
) -> None:
    inv = write_inventory(tmp_path, {f"gpu{i}": {"ansible_host": f"10.0.0.{i}"} for i in (1, 2, 3)})
    with playbook_command(
        "bootstrap", inv, limit="gpu*:!gpu2", extra_args=["--check", "-e", "a=b"], environ=fake_path
    ) as cmd:
        assert cmd.hosts == ("gpu1", "gpu3")
        i = cmd.argv.index("--limit")
        assert cmd.argv[i + 1] == "gpu*:!gpu2"
        assert cmd.argv[-4:] == [str(REPO / "playbooks" / "bootstrap.yml"), "--check", "-e", "a=b"]
    with pytest.raises(InventoryError, match="matches no hosts") as err:  # noqa: SIM117
        with playbook_command("bootstrap", inv, limit="nothere", environ=fake_path):
            pass
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    ("ansible_rc", "fleetctl_code", "meaning"),
    [
        (1, 1, "error"),
        (2, 3, "one or more hosts failed"),
        (4, 2, "parser error: bad playbook or inventory"),  # no PLAY RECAP: never ran
        (5, 2, "bad or incomplete options"),
        (6, 3, "hosts failed and hosts unreachable"),
        (99, 130, "interrupted"),
        (250, 1, "unexpected error"),
        (7, 1, "error"),
        (-9, 1, "killed by signal 9"),
    ],
)
def test_ansible_exit_codes_map_to_fleetctl_exit_codes(
    ansible_rc: int, fleetctl_code: int, meaning: str
) -> None:
    err = exit_error(ansible_rc)
    assert err is not None
    assert err.exit_code == fleetctl_code
    assert err.returncode == ansible_rc
    assert (
        err.one_line() == f"ansible-playbook exited {ansible_rc}: {meaning} (see its output above)"
    )


RECAP_OUTPUT = (
    b"TASK [x] ****\nok: [n1]\n\nPLAY RECAP ****\n"
    b"\x1b[0;32mn1\x1b[0m                 : \x1b[0;32mok=9   \x1b[0m changed=0    unreachable=0    "
    b"failed=0    skipped=3    rescued=0    ignored=0\n"
    b"n2                         : ok=1    changed=0    unreachable=1    failed=0    skipped=0\n"
    b"n3                         : ok=4    changed=2    unreachable=0    failed=1    skipped=0\n"
)


def test_the_play_recap_is_read_even_in_colour() -> None:
    assert parse_recap(RECAP_OUTPUT) == {
        "n1": {"ok": 9, "changed": 0, "unreachable": 0, "failed": 0},
        "n2": {"ok": 1, "changed": 0, "unreachable": 1, "failed": 0},
        "n3": {"ok": 4, "changed": 2, "unreachable": 0, "failed": 1},
    }
    assert parse_recap(b"ERROR! the playbook could not be found\n") == {}


def test_with_a_recap_the_error_names_failed_and_unreachable_hosts() -> None:
    err = exit_error(4, parse_recap(RECAP_OUTPUT))
    assert err is not None and err.exit_code == 3
    assert err.one_line() == (
        "ansible-playbook exited 4: failed on n3; unreachable: n2 (see its output above)"
    )


def _script_command(tmp_path: Path, body: str) -> PlaybookCommand:
    script = tmp_path / "fake-ansible"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return PlaybookCommand(
        argv=[str(script)], env=dict(os.environ), playbook=tmp_path / "p.yml", hosts=("n1",)
    )


def test_run_streams_output_as_it_comes_and_keeps_the_recap(tmp_path: Path) -> None:
    body = (
        "printf 'PLAY [x]\\n'\n"
        + "".join(
            f"printf '%s\\n' {shlex.quote(line)}\n" for line in RECAP_OUTPUT.decode().splitlines()
        )
        + "exit 4\n"
    )
    chunks: list[bytes] = []
    run = run_playbook(_script_command(tmp_path, body), chunks.append, timeout=60)
    assert b"".join(chunks).startswith(b"PLAY [x]\n")
    assert run.returncode == 4
    assert run.recap["n2"]["unreachable"] == 1


def test_run_past_its_timeout_stops_the_process(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    cmd = _script_command(tmp_path, f"echo $$ > {pidfile}\nexec sleep 60\n")
    with pytest.raises(ProvisionError, match=r"still running after 0\.5s") as err:
        run_playbook(cmd, lambda _: None, timeout=0.5)
    assert err.value.exit_code == 1
    pid = int(pidfile.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_success_is_no_error() -> None:
    assert exit_error(0) is None


def test_bootstrap_defaults_meet_what_the_readiness_checks_require() -> None:
    play = yaml.safe_load((REPO / "playbooks" / "bootstrap.yml").read_text())[0]
    sessions = re.search(r"default\((\d+)\)", play["vars"]["_fc_sshd_max_sessions"])
    startups = re.search(r"default\('(\d+):", play["vars"]["_fc_sshd_max_startups"])
    assert sessions and int(sessions.group(1)) >= READY_MAX_SESSIONS
    assert startups and int(startups.group(1)) >= READY_MAX_STARTUPS


def test_cli_without_ansible_playbook_on_path_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    inv = write_inventory(tmp_path, {"n1": {"ansible_host": "10.0.0.1"}})
    r = run_cli("provision", "bootstrap", "-i", str(inv), env={**os.environ, "PATH": str(tmp_path)})
    assert r.exit_code == 1, r.stderr
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "fleetctl: error: ansible-playbook not found on PATH; install ansible-core with "
        "`pip install 'fleetctl[ansible]'` (or your distribution's ansible package)"
    ]


def test_cli_print_command_shows_the_ansible_command_and_runs_nothing(
    tmp_path: Path, fake_path: dict[str, str]
) -> None:
    inv = write_inventory(tmp_path, {"n1": {"ansible_host": "10.0.0.1"}})
    env = {**os.environ, "PATH": fake_path["PATH"], "FLEETCTL_SSH_CONFIG": "/dev/null"}
    r = run_cli(
        "provision", "gpu-facts", "-i", str(inv), "--known-hosts", "/k", "--print-command",
        "--", "-e", "x=1",
        env=env,
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    words = shlex.split(r.stdout)
    assert words[:2] == ["ANSIBLE_HOST_KEY_CHECKING=True", "ANSIBLE_RETRY_FILES_ENABLED=False"]
    assert words[2:] == [
        str(Path(fake_path["PATH"]) / "ansible-playbook"), "-i", str(inv),
        "--ssh-common-args",
        "-F /dev/null -o UserKnownHostsFile=/k -o StrictHostKeyChecking=yes",
        str(REPO / "playbooks" / "gpu-facts.yml"), "-e", "x=1",
    ]  # fmt: skip


def test_cli_unknown_playbook_is_a_usage_error(tmp_path: Path, fake_path: dict[str, str]) -> None:
    inv = write_inventory(tmp_path, {"n1": {"ansible_host": "10.0.0.1"}})
    r = run_cli("provision", "nope", "-i", str(inv), env={**os.environ, **fake_path})
    assert r.exit_code == 2
    assert r.stderr.startswith("fleetctl: error: playbook not found: nope (shipped playbooks:")


@pytest.mark.parametrize("name", ["example.yml", "example.ini"])
def test_the_example_inventory_gives_ansible_its_known_hosts_file(
    name: str, fake_path: dict[str, str]
) -> None:
    inv = REPO / "inventories" / name
    env = {**fake_path, "FLEETCTL_SSH_CONFIG": "/dev/null"}
    with playbook_command("bootstrap", inv, environ=env) as cmd:
        assert cmd.hosts == ("gpu01", "gpu02", "gpu03", "gpu04")
        assert common_args(cmd.argv) == [
            "-F", "/dev/null",
            "-o", "UserKnownHostsFile=" + os.path.expanduser("~/.ssh/known_hosts.fleet"),
            "-o", "StrictHostKeyChecking=yes",
        ]  # fmt: skip
