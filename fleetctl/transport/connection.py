"""One node: run commands, stream a long-running command, copy files. SSH, local or srun.

``Connection`` is the protocol every phase uses; what differs between transports (how rsync
reaches the node, where the controller pings, a home a probe reported, a push's upload with
progress, a reconnect's settings, a health source beside the connection, what a run folder
keeps to reach the node again) is asked of it, never tested by kind outside ``transport/``
(``tests/pure/test_transport_guard.py``). Here: that interface, the settings and stream types
every transport shares, and ``transport(node)``, the one place that picks a node's transport.
The transports: ``SSHConnection`` (``ssh.py``: one paramiko transport per node, the default),
``LocalConnection`` (``local.py``: this machine without SSH, the embedded default fleet) and
``SrunConnection`` (``srun.py``: a node of the Slurm allocation fleetctl runs in).
"""

from __future__ import annotations

import os
import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from fleetctl.errors import RemoteCommandError
from fleetctl.results import CommandResult

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.openssh import RsyncTarget

Command = str | Sequence[str]


def to_shell(command: Command) -> str:
    """A command line for the remote shell. Sequences are quoted argument by argument."""
    return command if isinstance(command, str) else shlex.join(command)


def expand_home(path: str, home: str) -> str:
    """Resolve a leading ``~`` against the node's home, since quoted ``~`` never expands."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + path[1:]
    return path


@dataclass(frozen=True)
class SSHSettings:
    """How to reach nodes; shared by every phase and by rsync/ansible so they verify keys alike.

    ``known_hosts`` overrides the node's ``fleetctl_known_hosts`` and ``~/.ssh/known_hosts``.
    ``ssh_config`` None means ``~/.ssh/config`` (or ``$FLEETCTL_SSH_CONFIG`` when set; tests set
    it to /dev/null to hide the developer's config).
    """

    known_hosts: str | None = None
    accept_new: bool = False
    connect_timeout: float = 10.0
    ssh_config: str | None = None
    keepalive: float = 2.0
    use_agent: bool = True

    def known_hosts_for(self, node: Node) -> str:
        path = self.known_hosts or node.known_hosts or "~/.ssh/known_hosts"
        return os.path.expanduser(path)

    def ssh_config_for(self, node: Node) -> str | None:
        from fleetctl.transport.sshconfig import named_path

        path = named_path(node, self)
        if path is None:
            default = os.path.expanduser("~/.ssh/config")
            return default if os.path.exists(default) else None
        return None if path == "/dev/null" else os.path.expanduser(path)


class Stream(ABC):
    """A long-running command (the node supervisor): stdout+stderr merged, stdin writable."""

    @abstractmethod
    def recv(self, timeout: float) -> bytes | None:
        """Next chunk of output; ``b""`` at end of output; ``None`` when nothing came in time."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write to the command's stdin. Raises OSError when the peer is gone."""

    @abstractmethod
    def close_stdin(self) -> None: ...

    @abstractmethod
    def exit_code(self, timeout: float) -> int | None:
        """The exit status once the command ended, else None after ``timeout``."""

    @abstractmethod
    def close(self) -> None: ...

    def fileno(self) -> int | None:
        """A descriptor that selects readable when ``recv`` has something (data or EOF), so
        one thread can follow many streams; None when there is none."""
        return None


@dataclass(frozen=True)
class PingTarget:
    """Where the controller pings a node (``host``, ``port`` for the TCP fallback), or why it
    does not (``skip``: the node is this machine, behind a jump host, reached by slurmd)."""

    host: str = ""
    port: int = 0
    skip: str = ""


class HealthWatch(Protocol):
    """A started watcher of nodes' health from a source beside their connections."""

    def stop(self) -> None: ...


class Connection(ABC):
    """One node's command and file channel. Thread-safe: phases fan out over it.

    Besides the channel, a transport answers the questions its callers would otherwise settle
    by testing its kind; the defaults here are a transport's that has none of the extras.
    """

    node: Node

    #: a push may send code with rsync (``rsync_target``); otherwise it sends files with
    #: ``upload`` (a Slurm node: no SSH for rsync's shell)
    can_rsync: ClassVar[bool] = False
    #: a lost node's slot may be given to a spare inside the same job (``run --elastic``):
    #: not a Slurm allocation's node, whose membership is Slurm's
    can_join_elastic: ClassVar[bool] = True
    #: after a failure, the post-mortem's own collective may prove the culprit; not where a
    #: scheduler's word on its nodes is the proof (an srun step to a DOWN node would only wait)
    can_prove_post_mortem: ClassVar[bool] = True

    def alive(self) -> bool:
        """Whether the channel can still carry a command (False: reconnect before use)."""
        return True

    # -- capabilities: asked instead of testing the kind -------------------------------------
    def rsync_target(self, path: str) -> RsyncTarget:
        """How rsync reaches ``path`` on the node (only where ``can_rsync``)."""
        raise NotImplementedError(f"{self.node.label}: rsync cannot reach this node")

    def upload(self, local: Path, remote: str, progress: Callable[[int, int], None]) -> None:
        """``put`` for a push: ``remote`` (absolute) appears whole or not at all, and
        ``progress(done, total)`` hears the bytes as they go (here: once, at the end)."""
        self.put(local, remote)
        size = local.stat().st_size
        progress(size, size)

    def remember_home(self, home: str) -> None:
        """Take the home a probe already reported, saving the lookup ``home`` would make
        (nothing to save where the home costs nothing)."""
        return None

    def use_settings(self, settings: SSHSettings) -> None:
        """From now on use ``settings``: a node reached again with a short connect timeout
        keeps the fleet's own once it answered (nothing to do without SSH settings)."""
        return None

    @classmethod
    def ping_target(cls, node: Node, settings: SSHSettings) -> PingTarget:
        """Where the controller's reachability ping for ``node`` goes, or why it is skipped.
        A class question: the check pings beside connecting, before any connection exists."""
        return PingTarget(skip="no address to ping")

    @classmethod
    def watch_health(
        cls, names: Sequence[str], on_lost: Callable[[str, str], bool]
    ) -> HealthWatch | None:
        """Start watching these nodes from a source beside their connections (Slurm's node
        states): ``on_lost(name, reason)`` when it says one is gone. None: no such source."""
        return None

    @classmethod
    def reach_fields(cls, node: Node) -> dict[str, Any]:
        """What a run folder's connect.json keeps, beyond the node's inventory fields, so that
        ``status``/``stop``/``collect`` reach it the same way later (``reached_vars`` reads it)."""
        return {}

    @classmethod
    def reach_vars(cls, fields: Mapping[str, Any]) -> dict[str, str]:
        """The node vars that ``reach_fields`` stood for (empty: not this transport's)."""
        return {}

    @abstractmethod
    def run(
        self, command: Command, *, timeout: float, stdin: bytes | None = None, check: bool = False
    ) -> CommandResult:
        """Run a command to completion. ``check`` raises RemoteCommandError on non-zero exit."""

    @abstractmethod
    def start(self, command: Command) -> Stream:
        """Start a command and stream it (stdout and stderr merged)."""

    @abstractmethod
    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None: ...

    @abstractmethod
    def get(self, remote: str, local: str | Path) -> None: ...

    @abstractmethod
    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        """Entries of a remote folder as (name, is_dir, size); symlinks are reported as files."""

    @property
    @abstractmethod
    def home(self) -> str:
        """The node user's home directory (resolves ``~`` in workdirs)."""

    def expand(self, path: str) -> str:
        return expand_home(path, self.home)

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _checked(self, command: Command, result: CommandResult, check: bool) -> CommandResult:
        if check and result.exit_code != 0:
            raise RemoteCommandError(self.node.label, to_shell(command), result)
        return result


def transport(node: Node) -> type[Connection]:
    """The connection class that reaches ``node``: local for the embedded default, an srun
    step for a node of the Slurm allocation fleetctl runs in, SSH otherwise. The one place
    that reads a node's kind; everyone else asks the class or its connection."""
    if node.local:
        from fleetctl.transport.local import LocalConnection

        return LocalConnection
    if node.vars.get("fleetctl_connection") == "srun":  # a node of this Slurm allocation
        from fleetctl.transport.srun import SrunConnection

        return SrunConnection
    from fleetctl.transport.ssh import SSHConnection

    return SSHConnection


def connect(node: Node, settings: SSHSettings | None = None) -> Connection:
    """A new connection to ``node`` by its transport (``transport``)."""
    return transport(node)(node, settings)  # type: ignore[call-arg]  # each transport's own


def reach_fields(node: Node) -> dict[str, Any]:
    """What connect.json keeps to reach ``node`` the same way again (its transport's answer)."""
    return transport(node).reach_fields(node)


def reached_vars(fields: Mapping[str, Any]) -> dict[str, str]:
    """The node vars a connect.json entry's ``reach_fields`` stand for (empty: SSH)."""
    from fleetctl.transport.local import LocalConnection
    from fleetctl.transport.srun import SrunConnection
    from fleetctl.transport.ssh import SSHConnection

    for cls in (LocalConnection, SrunConnection, SSHConnection):
        found = cls.reach_vars(fields)
        if found:
            return found
    return {}


def __getattr__(name: str) -> object:
    """``LocalConnection`` stays importable from here; it lives in local.py (which imports this
    module, so it cannot be imported at the top)."""
    if name == "LocalConnection":
        from fleetctl.transport.local import LocalConnection

        return LocalConnection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
