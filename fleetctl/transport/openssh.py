"""The OpenSSH client's command line with fleetctl's exact trust settings, for the tools that
run ``ssh`` themselves (rsync's ``-e``): the same known_hosts, ssh_config, key and jump hosts
the paramiko connection uses (``sshconfig.resolve``), so the two never disagree about a node.
Pure: builds argv, runs nothing.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings


@dataclass(frozen=True)
class RsyncTarget:
    """How rsync reaches a folder of a node: its options (the remote shell) and the destination
    argument, as ``Connection.rsync_target`` answers for its transport."""

    options: tuple[str, ...]
    dest: str


def rsync_target(node: Node, settings: SSHSettings, path: str) -> RsyncTarget:
    """``path`` on ``node`` over OpenSSH with fleetctl's trust settings (``ssh_argv``).
    ``--protect-args``: the remote path travels inside the rsync protocol, never re-split by a
    shell."""
    host = f"[{node.address}]" if ":" in node.address else node.address
    shell = shlex.join(ssh_argv(node, settings))
    return RsyncTarget(("-e", shell, "--protect-args"), f"{host}:{path}")


def ssh_argv(node: Node, settings: SSHSettings) -> list[str]:
    """The OpenSSH client with fleetctl's exact trust settings (same keys, known_hosts, config).

    Strict host-key checking against the same known_hosts file paramiko used; batch mode so it
    never prompts; only the inventory's key when one is set. The same ssh_config file (``-F``)
    and the port and user the connection resolved from it (``sshconfig.resolve``).
    """
    from fleetctl.transport import sshconfig

    target = sshconfig.resolve(node, settings)
    config = target.config or "/dev/null"
    known = settings.known_hosts_for(node)
    argv = ["ssh", *_trust_options(config, known, settings)]
    if settings.keepalive:
        argv += [
            "-o",
            f"ServerAliveInterval={max(1, int(settings.keepalive))}",
            "-o",
            "ServerAliveCountMax=5",
        ]
    if node.key_file:
        argv += ["-o", "IdentitiesOnly=yes", "-i", os.path.expanduser(node.key_file)]
    if not (settings.use_agent and os.environ.get("SSH_AUTH_SOCK")):
        argv += ["-o", "IdentityAgent=none"]
    if target.proxy_jump and not target.proxy_command:
        # OpenSSH's own ProxyJump would run the jump's ssh without our -o options, checking
        # the bastion's key against ~/.ssh/known_hosts: spell the hop out with the same trust.
        hop = _jump_argv(target.proxy_jump, config, known, settings)
        argv += ["-o", "ProxyCommand=" + shlex.join(hop)]
    return [*argv, "-p", str(target.port), "-l", target.user]


def _trust_options(config: str, known_hosts: str, settings: SSHSettings) -> list[str]:
    return [
        "-F",
        config,
        "-o",
        f"UserKnownHostsFile={known_hosts}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-o",
        "StrictHostKeyChecking=" + ("accept-new" if settings.accept_new else "yes"),
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={max(1, int(settings.connect_timeout))}",
        "-o",
        "LogLevel=ERROR",
    ]


def _jump_argv(jump: str, config: str, known_hosts: str, settings: SSHSettings) -> list[str]:
    """``ssh -W %h:%p`` through the last hop of ``jump`` (earlier hops as ``-J``)."""
    *before, last = jump.split(",")
    spec = last.removeprefix("ssh://")
    user, _, hostport = spec.rpartition("@")
    host, port = hostport, None
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] or None
    elif hostport.count(":") == 1:
        host, port = hostport.split(":")
    argv = ["ssh", *_trust_options(config, known_hosts, settings)]
    if not (settings.use_agent and os.environ.get("SSH_AUTH_SOCK")):
        argv += ["-o", "IdentityAgent=none"]
    if before:
        argv += ["-J", ",".join(before)]
    argv += ["-W", "%h:%p"]
    if port:
        argv += ["-p", port]
    if user:
        argv += ["-l", user]
    return [*argv, host]
