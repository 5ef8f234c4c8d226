"""The fleet as a Fabric group: ``fabric.Connection`` objects that reach each node the way
fleetctl does, for fabfiles and ad-hoc ``run``/``put``/``sudo``.

Imported only by ``Fleet.group()`` and ``run --before``: fabric and invoke cost ~50 ms of
imports that no other command pays. Each node's route comes from ``fleetctl.transport.dial.route``
(ssh_config's answer, the inventory's user, port, key and ProxyJump): the node's Connection
has the last hop's host, port, user and keys, and each jump host is its ``gateway`` Connection
(one chain per node: fabric opens a gateway without a lock, so threads never share one).
Host keys: fabric sets ``AutoAddPolicy`` in ``Connection.__init__``; :class:`FleetConnection`
replaces it with fleetctl's (``hostkeys.strict``: known_hosts is the only trust source,
unknown and changed keys refused, ``accept_new`` records unknown ones), on every hop.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import fabric
import fabric.runners
import paramiko

from fleetctl.errors import UsageError
from fleetctl.transport import dial, hostkeys

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings


class LinearRemote(fabric.runners.Remote):
    """fabric's runner, linear in a command's output. invoke joins everything captured so far
    on every 1000-byte read so that watchers can scan it: quadratic, a command printing 20 MB
    took minutes (~90 KB/s). With no watcher (sudo's password prompt is one) there is nothing
    to scan; and reads are 64 KiB."""

    read_chunk_size = 64 * 1024

    def respond(self, buffer_: list[str]) -> None:
        if self.watchers:
            super().respond(buffer_)


class FleetConnection(fabric.Connection):
    """A ``fabric.Connection`` with fleetctl's host-key policy; refusals are HostKeyError
    (with the ``ssh-keygen -R`` / ``ssh-keyscan`` hint), and ``close()`` closes its gateway."""

    # declared on the class: invoke's Context turns sets of unknown attributes into config keys
    known_hosts: str = ""
    label: str = ""
    where: str = ""
    #: the node's inventory name: a group call's results are keyed by Connection, whose
    #: ``host`` is the address (``{c.inventory_name: r for c, r in results.items()}``)
    inventory_name: str = ""
    #: its place in the group (rank order): threads fill a GroupResult as they end
    index: int = -1
    #: set when fleetctl stops what a task started (``run --before``): no command runs after
    refused: str = ""

    def __init__(
        self,
        host: str,
        *,
        known_hosts: str,
        accept_new: bool,
        label: str,
        where: str,
        **kwargs: Any,
    ) -> None:
        super().__init__(host, **kwargs)
        # fabric's AutoAddPolicy would take any key silently: known_hosts decides instead
        hostkeys.strict(self.client, known_hosts, accept_new=accept_new, label=label)
        self.known_hosts, self.label, self.where = known_hosts, label, where

    def open(self) -> Any:
        try:
            return super().open()
        except Exception as e:
            key_name = self.host if int(self.port) == 22 else f"[{self.host}]:{self.port}"
            refused = hostkeys.key_error(
                e, self.label, self.where, self.host, int(self.port), key_name, self.known_hosts
            )
            if refused is not None:
                raise refused from e
            raise

    def _run(self, runner: Any, command: str, **kwargs: Any) -> Any:
        if self.refused:  # run, sudo and local all come here
            raise ConnectionRefusedError(self.refused)
        return super()._run(runner, command, **kwargs)

    def close(self) -> None:
        super().close()
        if isinstance(self.gateway, fabric.Connection):
            self.gateway.close()


def connection(
    node: Node, settings: SSHSettings, config: fabric.Config | None = None
) -> FleetConnection:
    """``node``'s Connection, its jump hosts chained as gateways. Raises ConnectError for a
    missing key file, SSHConfigError for a broken ssh_config (as ``fleetctl`` would)."""
    if node.local:
        raise UsageError(
            f"{node.name} is this machine without SSH (no inventory): a Fabric group needs "
            "SSH hosts; use Fleet.from_inventory"
        )
    hops = dial.route(node, settings)
    known_hosts = settings.known_hosts_for(node)
    agent = settings.use_agent and bool(os.environ.get("SSH_AUTH_SOCK"))
    timeout = max(1, math.ceil(settings.connect_timeout))
    gateway: FleetConnection | str | bool = False
    conn: FleetConnection | None = None
    for i, hop in enumerate(hops):
        last = i == len(hops) - 1
        if i == 0 and hop.proxy_command:
            gateway = hop.proxy_command  # fabric's ProxyCommand gateway
        connect_kwargs: dict[str, Any] = {
            "look_for_keys": hop.look_for_keys,
            "allow_agent": agent,
            "banner_timeout": settings.connect_timeout,
            "auth_timeout": settings.connect_timeout,
        }
        if hop.keys:
            connect_kwargs["key_filename"] = list(hop.keys)
        conn = FleetConnection(
            hop.host,
            known_hosts=known_hosts,
            accept_new=settings.accept_new,
            label=node.label,
            where=hop.where if last else f"jump host {hop.where}",
            user=hop.user,
            port=hop.port,
            config=_config(config),
            gateway=gateway,
            connect_timeout=timeout,
            connect_kwargs=connect_kwargs,
        )
        gateway = conn
    assert conn is not None
    conn.inventory_name = node.name
    if conn.config.runners.remote is fabric.runners.Remote:  # a config's own runner is kept
        conn.config.runners.remote = LinearRemote
    return conn


def group(
    nodes: Sequence[Node], settings: SSHSettings, config: fabric.Config | None = None
) -> fabric.ThreadingGroup:
    """The nodes' Connections, in rank order, as one ``ThreadingGroup``."""
    conns = [connection(n, settings, config) for n in nodes]
    for i, c in enumerate(conns):
        c.index = i
    return fabric.ThreadingGroup.from_connections(conns)


def by_name(results: Mapping[Any, Any]) -> dict[str, Any]:
    """A group call's results (a ``GroupResult``, or a ``GroupException.result``) keyed by
    inventory name instead of Connection, in the group's order (threads fill a GroupResult in
    the order they end)."""
    ordered = sorted(results.items(), key=lambda cr: getattr(cr[0], "index", -1))
    return {getattr(c, "inventory_name", "") or c.host: r for c, r in ordered}


def _config(base: fabric.Config | None) -> fabric.Config:
    """The Config each Connection gets: ``base`` as given, else one whose ssh_config is empty
    (fleetctl's resolution already gave host, port, user, keys and gateway; fabric looking the
    resolved name up again could add to them)."""
    if base is not None:
        return base
    return fabric.Config(ssh_config=paramiko.SSHConfig())
