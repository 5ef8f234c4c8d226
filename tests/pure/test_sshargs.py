"""Inventory ssh arguments (``ansible_ssh_common_args``/``_extra_args``): mapped, accepted or
refused by name — never silently ignored."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import InventoryError
from fleetctl.node import Node
from fleetctl.plan.inventory import load_inventory
from fleetctl.plan.inventory.sshargs import SSHArgs, parse_ssh_args
from fleetctl.transport import sshconfig
from fleetctl.transport.connection import SSHSettings
from fleetctl.transport.openssh import ssh_argv

MAPPED = [
    ("-o ProxyJump=admin@bastion:2222", SSHArgs(proxy_jump="admin@bastion:2222")),
    ("-J a@b,c", SSHArgs(proxy_jump="a@b,c")),
    ("-o 'ProxyJump bastion'", SSHArgs(proxy_jump="bastion")),
    ("-oProxyJump=none", SSHArgs()),
    ("-p 2200 -l ops -i ~/.ssh/k", SSHArgs(port=2200, user="ops", key_file="~/.ssh/k")),
    ("-p2200 -lops", SSHArgs(port=2200, user="ops")),
    ("-o Port=2201 -o User=u -o IdentityFile=/k", SSHArgs(port=2201, user="u", key_file="/k")),
    ("-F /dev/null -o UserKnownHostsFile=/kh", SSHArgs(ssh_config="/dev/null", known_hosts="/kh")),
    ("-o Port=1 -p 2", SSHArgs(port=1)),  # the first value wins, as in OpenSSH
    (
        "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes -o BatchMode=yes -q",
        SSHArgs(accepted=("StrictHostKeyChecking", "IdentitiesOnly", "BatchMode")),
    ),
    (
        "-o ControlMaster=auto -o ControlPersist=60s -o ServerAliveInterval=30",
        SSHArgs(accepted=("ControlMaster", "ControlPersist", "ServerAliveInterval")),
    ),
]


@pytest.mark.parametrize(("text", "expected"), MAPPED)
def test_options_fleetctl_can_honour_are_mapped_or_accepted(text: str, expected: SSHArgs) -> None:
    assert parse_ssh_args(text) == expected


REFUSED = [
    ("-o StrictHostKeyChecking=no", "-o StrictHostKeyChecking=no is not supported"),
    ("-o StrictHostKeyChecking=accept-new", "--accept-new adds unknown ones"),
    ("-o ProxyCommand='nc %h %p'", "-o ProxyCommand is not supported by fleetctl; use ProxyJump"),
    ("-o ForwardAgent=yes", "-o ForwardAgent=yes is not supported"),
    ("-o SendEnv=LANG", "-o SendEnv is not supported"),
    ("-L 8080:localhost:80", "'-L' is not supported"),
    ("-o", "'-o' needs a value"),
    ("-p http", "'http' is not a port number"),
    ("-o Port=", "has no value"),
    ("-o 'ProxyJump=a b'", "is not [user@]host[:port]"),
    ("-o 'unterminated", "cannot be split"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED)
def test_other_options_are_refused_naming_them(text: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_ssh_args(text)
    assert message in str(e.value)


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hosts.yml"
    p.write_text(text)
    return p


def test_inventory_ssh_args_fill_what_the_host_does_not_say_itself(tmp_path: Path) -> None:
    inv = write(
        tmp_path,
        """all:
  vars:
    ansible_ssh_common_args: -o ProxyJump=ops@bastion -p 2222 -l common
  hosts:
    a: {ansible_host: 10.0.0.1}
    b: {ansible_host: 10.0.0.2, ansible_port: 22, ansible_user: own,
        ansible_ssh_extra_args: -i /keys/b -o UserKnownHostsFile=/kh/b}
""",
    )
    a, b = load_inventory(inv).nodes
    assert (a.proxy_jump, a.port, a.user, a.key_file) == ("ops@bastion", 2222, "common", None)
    # ansible_port/ansible_user win over the args (Ansible puts them first on ssh's line)
    assert (b.proxy_jump, b.port, b.user, b.key_file) == ("ops@bastion", 22, "own", "/keys/b")
    assert b.known_hosts == "/kh/b"


def test_an_unsupported_option_is_a_one_line_error_naming_file_line_host_and_option(
    tmp_path: Path,
) -> None:
    inv = write(
        tmp_path,
        """all:
  hosts:
    gpu1: {ansible_host: 10.0.0.1}
    gpu2:
      ansible_host: 10.0.0.2
      ansible_ssh_common_args: -o ProxyJump=b -o StrictHostKeyChecking=no
""",
    )
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    msg = e.value.one_line()
    assert msg.startswith(f"{inv}:")
    assert "host gpu2: ansible_ssh_common_args: ssh option -o StrictHostKeyChecking=no" in msg
    assert "\n" not in msg and e.value.exit_code == 2


def test_the_inventory_jump_host_beats_ssh_config_and_reaches_the_dialler_and_rsync(
    tmp_path: Path,
) -> None:
    from fleetctl.transport import dial

    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host 10.0.0.9\n  ProxyJump other\n  User fromconfig\nHost jump\n  Port 2022\n")
    node = Node("n9", "10.0.0.9", proxy_jump="ops@jump", ssh_config=str(cfg))
    settings = SSHSettings(known_hosts=str(tmp_path / "kh"))
    target = sshconfig.resolve(node, settings)
    assert target.proxy_jump == "ops@jump" and target.proxied and target.user == "fromconfig"
    jump, last = dial.route(node, settings)  # the inventory's hop, with ssh_config's Port
    assert (jump.host, jump.port, jump.user) == ("jump", 2022, "ops")
    assert (last.host, last.port, last.user) == ("10.0.0.9", 22, "fromconfig")
    argv = ssh_argv(node, settings)
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    # the hop is checked against fleetctl's known_hosts too, not ~/.ssh/known_hosts
    assert f"UserKnownHostsFile={tmp_path / 'kh'}" in proxy
    assert proxy.endswith("-W %h:%p -l ops jump") and "StrictHostKeyChecking=yes" in proxy
