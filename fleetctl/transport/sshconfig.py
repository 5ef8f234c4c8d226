"""Where a node really is under ssh_config: the one resolver every SSH client of fleetctl uses.

The paramiko connection (``dial``), the controller ping in ``check`` and the OpenSSH
command line rsync runs all take host, port, user, identities and jump hosts from here, so they
cannot disagree about where a node is. Each ssh_config file is parsed once per content version
and shared by every node and thread (parsing is the costly part; lookups only read it). A file
that cannot be read or parsed is an ``SSHConfigError`` naming it, never silently ignored.

Precedence (fabric's, which fleetctl used to dial with): the inventory's user and key file win
over the file's; the inventory's port wins unless it is 22, which cannot be told apart from "not
set", so ssh_config's ``Port`` then applies.
"""

from __future__ import annotations

import getpass
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetctl.errors import SSHConfigError
from fleetctl.transport.filecache import FileCache

if TYPE_CHECKING:
    import paramiko

    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings

_lock = threading.Lock()
_import_lock = threading.Lock()


def import_ssh_stack() -> None:
    """Import paramiko once, under a lock, without invoke.

    Connects and pings fan out in threads; first imports of paramiko racing in several of them
    fail inside its circular imports ("partially initialized module"). Later calls cost a lock.

    paramiko.config imports invoke, when installed, for ssh_config's ``Match exec`` alone:
    ~50 ms (invoke brings unittest.mock, asyncio and a YAML copy) before every command's first
    connection. It is held back while paramiko loads and handed to paramiko.config lazily, so
    a ``Match exec`` still runs its command.

    paramiko's ``__init__`` reads its own version with ``importlib.metadata`` (its import and a
    scan of every ``sys.path`` entry: ~15 ms per command, for the SSH banner): it gets
    :class:`_OwnVersion` instead, which reads paramiko's own ``*.dist-info/METADATA``.
    """
    with _import_lock:
        if "paramiko" in sys.modules:
            return
        held = "invoke" not in sys.modules and importlib.util.find_spec("invoke") is not None
        if held:
            sys.modules["invoke"] = None  # type: ignore[assignment]  # import of invoke fails
        meta = None if "importlib.metadata" in sys.modules else _OwnVersion()
        if meta is not None:
            sys.modules["importlib.metadata"] = meta  # type: ignore[assignment]
        try:
            import paramiko.config
        finally:
            if held and sys.modules.get("invoke", False) is None:
                del sys.modules["invoke"]
            if meta is not None and sys.modules.get("importlib.metadata") is meta:
                del sys.modules["importlib.metadata"]
        if held:
            paramiko.config.invoke = _LazyInvoke()  # type: ignore[attr-defined]


class _OwnVersion(types.ModuleType):
    """Stands for ``importlib.metadata`` while paramiko loads: ``version(name)`` from the
    package's own ``<name>-<version>.dist-info`` beside it; anything else, or a package laid
    out otherwise, goes to the real module."""

    def __init__(self) -> None:
        super().__init__("importlib.metadata")

    def version(self, name: str) -> str:
        from pathlib import Path

        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            site = Path(spec.origin).parent.parent
            for d in sorted(site.glob(f"{name}-*.dist-info")):
                try:
                    with open(d / "METADATA", encoding="utf-8") as f:
                        for line in f:
                            if line.startswith("Version:"):
                                return line.split(":", 1)[1].strip()
                            if not line.strip():
                                break
                except OSError:
                    continue
        return self._real().version(name)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):  # the import system's questions (__spec__, __path__, ...)
            raise AttributeError(name)
        return getattr(self._real(), name)

    def _real(self) -> Any:
        if sys.modules.get("importlib.metadata") is self:
            del sys.modules["importlib.metadata"]
        import importlib.metadata

        return importlib.metadata


class _LazyInvoke:
    """Stands for the invoke module in paramiko.config until ``Match exec`` uses it."""

    def __getattr__(self, name: str) -> object:
        import invoke
        import paramiko.config

        paramiko.config.invoke = invoke  # type: ignore[attr-defined]
        return getattr(invoke, name)


@dataclass(frozen=True)
class SSHTarget:
    """A node's SSH endpoint as OpenSSH would compute it (``ssh -G``)."""

    alias: str  # what the inventory names (node.address): the name ssh_config is matched on
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]  # the inventory's key first, then ssh_config's IdentityFile
    proxy_jump: str | None
    proxy_command: str | None
    config: str | None  # the ssh_config file read, None when none is

    @property
    def proxied(self) -> bool:
        """Reached through a jump host or proxy command: not dialled from here directly."""
        return bool(self.proxy_jump or self.proxy_command)


def named_path(
    node: Node, settings: SSHSettings, environ: Mapping[str, str] | None = None
) -> str | None:
    """The ssh_config file fleetctl was told to use for ``node``, as given (``~`` unexpanded,
    ``/dev/null`` kept): ``--ssh-config``, else the inventory's, else ``FLEETCTL_SSH_CONFIG``;
    None when none was named. Connections fall back to ``~/.ssh/config`` after it
    (``SSHSettings.ssh_config_for``); Ansible's ``-F`` is passed only for a named one."""
    env = os.environ if environ is None else environ
    return settings.ssh_config or node.ssh_config or env.get("FLEETCTL_SSH_CONFIG")


def load(path: str | None, label: str) -> paramiko.SSHConfig:
    """The parsed ssh_config at ``path`` (empty for None), cached until the file changes."""
    import_ssh_stack()
    import paramiko

    if path is None:
        return paramiko.SSHConfig()
    try:
        return _CONFIGS.get(path)
    except OSError as e:
        raise SSHConfigError(label, path, e.strerror or str(e)) from e
    except Exception as e:  # paramiko's ConfigParseError and whatever a bad line trips
        raise SSHConfigError(label, path, str(e) or type(e).__name__) from e


def _read(path: str) -> str:
    """The file's text through the bounded user-file reader: a regular file of at most 32 MiB
    (a FIFO would hang the read, ``/dev/zero`` eat memory); ``ValueError`` naming why not."""
    from fleetctl.plan.userinput import read_user_file

    return read_user_file(path, "the file", ValueError).decode("utf-8")


def _parse(path: str) -> paramiko.SSHConfig:
    import paramiko

    return paramiko.SSHConfig.from_text(_read(path))


_CONFIGS: FileCache[paramiko.SSHConfig] = FileCache(_parse)


_derived: dict[tuple[int, str, str], paramiko.SSHConfig] = {}


def config_for(node: Node, settings: SSHSettings) -> paramiko.SSHConfig:
    """The parsed ssh_config for ``node``, with the inventory's ProxyJump in front of it.

    ``ansible_ssh_common_args: -o ProxyJump=…`` must mean to ``dial`` (which reads the jump
    hops from ssh_config) what it means to ``ssh``: a command-line option beats the file. So
    the jump goes in as the first ``Host`` block for the node's alias, where it wins.
    """
    path = settings.ssh_config_for(node)
    base = load(path, node.label)  # imports the SSH stack under its lock first
    import paramiko

    if not node.proxy_jump:
        return base
    key = (id(base), node.address, node.proxy_jump)
    with _lock:
        hit = _derived.get(key)
    if hit is not None:
        return hit
    text = ""
    if path is not None:
        try:
            text = _read(path)
        except ValueError as e:  # UnicodeDecodeError is one
            raise SSHConfigError(node.label, path, str(e)) from e
    # the inventory's block first: paramiko, like ssh, takes the first value of each option
    first = f"Host {node.address}\n  ProxyJump {node.proxy_jump}\n"
    cfg = paramiko.SSHConfig.from_text(first + text)
    with _lock:
        _derived[key] = cfg
    return cfg


def resolve(node: Node, settings: SSHSettings) -> SSHTarget:
    """Where ``node`` is, under the ssh_config fleetctl uses for it (see the module doc)."""
    path = settings.ssh_config_for(node)
    cfg = config_for(node, settings)
    try:
        found = cfg.lookup(node.address)  # Match/tokens are evaluated here and can fail too
    except Exception as e:
        raise SSHConfigError(node.label, path or "ssh_config", str(e)) from e
    port = node.port
    if port == 22 and "port" in found:
        try:
            port = int(found["port"])
        except ValueError as e:
            raise SSHConfigError(
                node.label, path or "ssh_config", f"Port {found['port']!r} is not a number"
            ) from e
    keys = (os.path.expanduser(node.key_file),) if node.key_file else ()
    jump = found.get("proxyjump")
    return SSHTarget(
        alias=node.address,
        hostname=found.get("hostname", node.address),
        port=port,
        user=node.user or found.get("user") or getpass.getuser(),
        identity_files=keys + tuple(found.get("identityfile", ())),
        proxy_jump=None if jump is None or jump.lower() == "none" else jump,
        proxy_command=found.get("proxycommand"),
        config=path,
    )
