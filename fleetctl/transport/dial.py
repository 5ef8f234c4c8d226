"""Dial a node: authenticated paramiko clients from here to it, through its jump hosts.

What fabric's ``Connection`` did for fleetctl, without importing fabric and invoke (~50 ms of
every command's start-up, before its first connection): ssh_config's answer for the node
(``sshconfig.resolve``); a ProxyJump's hops in OpenSSH's order (the first dialled from here,
each next one through a ``direct-tcpip`` channel of the one before, the node through the
last), or a ProxyCommand; every hop's host key verified against known_hosts
(``hostkeys.strict``); every step bounded by the connect timeout.
"""

from __future__ import annotations

import contextlib
import errno
import getpass
import os
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetctl.errors import ConnectError, SSHConfigError
from fleetctl.transport import hostkeys, sshconfig
from fleetctl.transport.tuning import no_delay, record_exit_signals, transport_factory

if TYPE_CHECKING:
    import paramiko

    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings

MAX_HOPS = 8


@dataclass(frozen=True)
class Hop:
    """One SSH server on the way to a node; the node itself is the last."""

    host: str  # the address dialled (ssh_config's HostName)
    port: int
    user: str
    keys: tuple[str, ...]  # identity files to offer, those that exist
    look_for_keys: bool  # also ~/.ssh/id_* (not when the inventory names the node's key)
    proxy_command: str | None = None  # how this (first) hop is reached, when not directly

    @property
    def where(self) -> str:
        return f"{self.host}:{self.port}"


def _existing(paths: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """Like OpenSSH, skip IdentityFile entries that do not exist (paramiko would abort the whole
    login with FileNotFoundError at the first missing one)."""
    out: list[str] = []
    for p in paths:
        full = os.path.expanduser(p)
        if os.path.isfile(full) and full not in out:
            out.append(full)
    return tuple(out)


def _parse_hop(spec: str) -> tuple[str | None, str, int | None]:
    """``[ssh://][user@]host[:port]`` (``[v6addr]:port`` too) → (user, host, port)."""
    spec = spec.strip()
    if spec.startswith("ssh://"):
        spec = spec[len("ssh://") :].rstrip("/")
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = int(tail[1:]) if tail.startswith(":") and tail[1:].isdigit() else None
    elif rest.count(":") == 1:
        name, _, p = rest.partition(":")
        if p.isdigit():
            host, port = name, int(p)
    return (user or None), host, port


def route(node: Node, settings: SSHSettings) -> list[Hop]:
    """Every hop from here to ``node``, in dialling order, the node last. Raises
    SSHConfigError for a broken ssh_config, ConnectError for a missing key or a hop loop."""
    target = sshconfig.resolve(node, settings)
    if node.key_file:
        key = os.path.expanduser(node.key_file)
        if not os.path.isfile(key):
            raise ConnectError(node.label, f"private key file {key} not found")
    last = Hop(
        target.hostname,
        target.port,
        target.user,
        _existing(target.identity_files),
        look_for_keys=not node.key_file,
        proxy_command=None if target.proxy_jump else target.proxy_command,
    )
    jumps = _jumps(target.proxy_jump, node, settings, {node.address}) if target.proxy_jump else []
    return [*jumps, last]


def _jumps(spec: str, node: Node, settings: SSHSettings, seen: set[str]) -> list[Hop]:
    """The hops of one ProxyJump value; the first hop's own ProxyJump (or ProxyCommand)
    applies to it, as OpenSSH dials it with its own configuration."""
    cfg = sshconfig.config_for(node, settings)
    path = settings.ssh_config_for(node) or "ssh_config"
    hops: list[Hop] = []
    for i, part in enumerate(spec.split(",")):
        user, alias, port = _parse_hop(part)
        if alias in seen or len(seen) > MAX_HOPS:
            raise ConnectError(node.label, f"ProxyJump loops through {alias!r} (or is too long)")
        try:
            found = cfg.lookup(alias)
            hop_port = port or int(found.get("port", 22))
        except ValueError as e:
            raise SSHConfigError(node.label, path, f"jump host {alias}: bad Port") from e
        except Exception as e:  # Match/tokens are evaluated here and can fail too
            raise SSHConfigError(node.label, path, f"jump host {alias}: {e}") from e
        inner = found.get("proxyjump") if i == 0 else None
        inner = None if inner is None or inner.lower() == "none" else inner
        own = _jumps(inner, node, settings, seen | {alias}) if inner else []
        hops += own
        hops.append(
            Hop(
                found.get("hostname", alias),
                hop_port,
                user or found.get("user") or getpass.getuser(),
                _existing(found.get("identityfile", [])),
                look_for_keys=True,
                proxy_command=found.get("proxycommand") if i == 0 and not own else None,
            )
        )
        seen = seen | {alias}
    return hops


def dial(node: Node, settings: SSHSettings) -> list[paramiko.SSHClient]:
    """Connected clients, one per hop, the node's last. Raises ConnectError (HostKeyError for
    a key known_hosts does not vouch for) naming the hop that failed; nothing stays open."""
    sshconfig.import_ssh_stack()  # before any other paramiko import in this thread
    import paramiko

    hops = route(node, settings)
    known_hosts = settings.known_hosts_for(node)
    st = settings
    clients: list[paramiko.SSHClient] = []
    try:
        for i, hop in enumerate(hops):
            client = paramiko.SSHClient()
            hostkeys.strict(client, known_hosts, accept_new=st.accept_new, label=node.label)
            kwargs: dict[str, object] = {
                "hostname": hop.host,
                "port": hop.port,
                "username": hop.user,
                "timeout": st.connect_timeout,
                "banner_timeout": st.connect_timeout,
                "auth_timeout": st.connect_timeout,
                "allow_agent": st.use_agent and bool(os.environ.get("SSH_AUTH_SOCK")),
                "look_for_keys": hop.look_for_keys,
                "transport_factory": transport_factory,
            }
            if hop.keys:
                kwargs["key_filename"] = list(hop.keys)
            try:
                if clients:  # through the hop before: a channel of its transport
                    kwargs["sock"] = (
                        clients[-1]
                        .get_transport()
                        .open_channel(  # type: ignore[union-attr]
                            "direct-tcpip",
                            (hop.host, hop.port),
                            ("", 0),
                            timeout=st.connect_timeout,
                        )
                    )
                elif hop.proxy_command:
                    kwargs["sock"] = paramiko.ProxyCommand(hop.proxy_command)
                else:
                    kwargs["sock"] = tcp_connect(hop.host, hop.port, st.connect_timeout)
                client.connect(**kwargs)  # type: ignore[arg-type]
            except BaseException as e:
                client.close()
                via = hops[i - 1] if i else None
                raise translate(e, node, st, hop, via, i == len(hops) - 1, known_hosts) from e
            clients.append(client)
    except BaseException:
        close(clients)
        raise
    transport = clients[-1].get_transport()
    if transport is not None and st.keepalive:
        transport.set_keepalive(max(1, int(st.keepalive)))
    if transport is not None:
        record_exit_signals(transport)
    return clients


def tcp_connect(host: str, port: int, timeout: float) -> socket.socket:
    """The TCP connection paramiko would open (every address in getaddrinfo's order; refused
    or unreachable ones folded into its NoValidConnectionsError), without Nagle's delay from
    the first packet (``transport.no_delay``). An ASCII name is resolved as bytes: for a str,
    CPython's getaddrinfo imports the IDNA codec (stringprep, unicodedata: ~5 ms per command)."""
    import paramiko

    try:
        name: str | bytes = host.encode("ascii")
    except UnicodeEncodeError:
        name = host
    infos = socket.getaddrinfo(name, port, socket.AF_UNSPEC, socket.SOCK_STREAM)
    addrs = [(i[0], i[4]) for i in infos if i[1] == socket.SOCK_STREAM] or [
        (i[0], i[4]) for i in infos
    ]
    errors: dict[tuple[Any, ...], OSError] = {}
    for family, addr in addrs:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            no_delay(sock)
            sock.connect(addr)
            return sock
        except OSError as e:
            sock.close()
            if e.errno not in (errno.ECONNREFUSED, errno.EHOSTUNREACH):
                raise
            errors[addr] = e
    raise paramiko.ssh_exception.NoValidConnectionsError(errors)


def close(clients: list[paramiko.SSHClient]) -> None:
    """Close the node's client, then each jump host's, nearest first."""
    for c in reversed(clients):
        with contextlib.suppress(Exception):  # closing a dead link: nothing left to report
            c.close()


def translate(
    e: BaseException,
    node: Node,
    settings: SSHSettings,
    hop: Hop,
    via: Hop | None,
    is_node: bool,
    known_hosts: str,
) -> BaseException:
    """Why dialling ``hop`` failed, as one line naming it (a jump host as such)."""
    import paramiko

    host, port = hop.host, hop.port
    where = hop.where if is_node else f"jump host {hop.where}"
    if via is not None and is_node:
        where += f" (via {via.where})"
    key_name = host if port == 22 else f"[{host}]:{port}"
    refused = hostkeys.key_error(e, node.label, where, host, port, key_name, known_hosts)
    if refused is not None:
        return refused
    if isinstance(e, ConnectError):
        return e
    if isinstance(e, paramiko.PasswordRequiredException):
        return ConnectError(
            node.label,
            f"private key for {where} needs a passphrase; "
            "load it into ssh-agent (batch mode never prompts)",
        )
    if isinstance(e, paramiko.SSHException) and "No authentication methods" in str(e):
        return ConnectError(
            node.label,
            f"authentication failed for {hop.user}@{where}: no key to offer "
            "(no key file, no ssh-agent key, no IdentityFile that exists)",
        )
    if isinstance(e, paramiko.AuthenticationException):
        return ConnectError(node.label, f"authentication failed for {hop.user}@{where}: {e}")
    if isinstance(e, socket.gaierror):
        return ConnectError(node.label, f"cannot resolve host name {host!r}: {e.strerror}")
    if isinstance(e, UnicodeError):  # not a valid DNS name (empty or >63-char label)
        return ConnectError(node.label, f"cannot resolve host name {host!r}: invalid name")
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        # paramiko folds "no route to host" (nobody answers ARP: host down) into this too
        if any(x.errno == errno.EHOSTUNREACH for x in e.errors.values()):
            return ConnectError(node.label, f"no route to {where} (host unreachable)")
        return ConnectError(node.label, f"connection refused by {where}")
    if isinstance(e, paramiko.ChannelException):  # the hop before could not reach this one
        return ConnectError(node.label, f"cannot reach {where}: {e.text or e}")
    if isinstance(e, ConnectionRefusedError):
        return ConnectError(node.label, f"connection refused by {where}")
    if isinstance(e, (socket.timeout, TimeoutError)):
        return ConnectError(
            node.label, f"timed out after {settings.connect_timeout:g}s connecting to {where}"
        )
    if isinstance(e, OSError):
        return ConnectError(node.label, f"cannot connect to {where}: {e.strerror or e}")
    if isinstance(e, paramiko.SSHException):
        return ConnectError(node.label, f"SSH error with {where}: {e}")
    return e
