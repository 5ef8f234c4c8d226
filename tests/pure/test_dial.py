"""The route ``dial`` takes to a node: hops in OpenSSH's ProxyJump order, each resolved
through ssh_config, keys that exist, loops refused. Pure: nothing is dialled."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import ConnectError
from fleetctl.node import Node
from fleetctl.transport import dial
from fleetctl.transport.connection import SSHSettings


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("jump", (None, "jump", None)),
        ("ops@jump:2022", ("ops", "jump", 2022)),
        ("ssh://ops@jump:2022/", ("ops", "jump", 2022)),
        ("[fd00::1]:2200", (None, "fd00::1", 2200)),
        ("a@b@host", ("a@b", "host", None)),
        ("fd00::1", (None, "fd00::1", None)),  # a bare IPv6 address: no port in it
    ],
)
def test_a_jump_spec_parses_like_openssh(spec: str, want: tuple) -> None:
    assert dial._parse_hop(spec) == want


def _route(tmp_path: Path, config: str, **node: object) -> list[dial.Hop]:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(config)
    st = SSHSettings(known_hosts=str(tmp_path / "kh"), ssh_config=str(cfg))
    return dial.route(Node("n", "target", **node), st)  # type: ignore[arg-type]


def test_hops_are_dialled_in_proxyjump_order_each_resolved_through_ssh_config(
    tmp_path: Path,
) -> None:
    key = tmp_path / "bastion_key"
    key.write_text("k")
    hops = _route(
        tmp_path,
        "Host target\n  HostName 10.0.0.9\n  ProxyJump first,ops@second:2200\n"
        f"Host first\n  HostName 192.0.2.1\n  User gate\n  IdentityFile {key}\n"
        "  IdentityFile /no/such/key\n"
        "Host second\n  HostName 192.0.2.2\n  User ignored\n  ProxyJump elsewhere\n",
        user="root",
    )
    assert [(h.host, h.port, h.user) for h in hops] == [
        ("192.0.2.1", 22, "gate"),  # dialled from here
        ("192.0.2.2", 2200, "ops"),  # through first; its own ProxyJump is the chain's business
        ("10.0.0.9", 22, "root"),  # the node, through second
    ]
    assert hops[0].keys == (str(key),)  # only the IdentityFile that exists


def test_the_first_hops_own_proxyjump_and_proxycommand_apply(tmp_path: Path) -> None:
    hops = _route(
        tmp_path,
        "Host target\n  ProxyJump mid\nHost mid\n  ProxyJump outer\n"
        "Host outer\n  ProxyCommand nc %h %p\n",
    )
    assert [h.host for h in hops] == ["outer", "mid", "target"]
    assert hops[0].proxy_command == "nc outer 22" and hops[1].proxy_command is None


def test_a_proxycommand_reaches_the_node_without_hops(tmp_path: Path) -> None:
    (only,) = _route(tmp_path, "Host target\n  ProxyCommand ssh -W %h:%p gw\n")
    assert only.proxy_command == "ssh -W target:22 gw"


def test_a_jump_loop_is_refused_naming_the_host(tmp_path: Path) -> None:
    with pytest.raises(ConnectError, match="ProxyJump loops through 'a'"):
        _route(tmp_path, "Host target\n  ProxyJump a\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a")


def test_a_missing_inventory_key_is_named_before_dialling(tmp_path: Path) -> None:
    with pytest.raises(ConnectError, match=r"private key file .*/nokey not found"):
        _route(tmp_path, "", key_file=str(tmp_path / "nokey"))


def test_tcp_connect_opens_a_socket_without_nagle_and_folds_refusals_as_paramiko_does() -> None:
    import socket

    import paramiko

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        s = dial.tcp_connect("localhost", port, 5.0)
        try:
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert s.getpeername()[1] == port and s.gettimeout() == 5.0
        finally:
            s.close()
    with pytest.raises(paramiko.ssh_exception.NoValidConnectionsError):
        dial.tcp_connect("127.0.0.1", port, 5.0)  # closed now: refused
