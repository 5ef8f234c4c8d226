"""One host of the fleet, as the inventory describes it. Frozen: phases never mutate nodes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_WORKDIR = "~/.fleetctl"
DEFAULT_PYTHON = "python3"
LOCAL_ADDRESSES = frozenset({"localhost", "127.0.0.1", "::1"})
#: ``ansible_shell_type`` values (``Node.shell_type``): these login shells read POSIX command
#: lines as they are (the inventory records None for them) ...
POSIX_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "zsh"})
#: ... and these need each command wrapped (``transport/loginshell.py``; ``tcsh``: the csh
#: Ansible calls csh)
WRAPPED_SHELLS = frozenset({"csh", "tcsh", "fish"})


@dataclass(frozen=True)
class Node:
    """A host in rank order. ``name`` is the inventory hostname, ``address`` what SSH dials.

    ``train_addr`` is the address the inventory declares for the training network
    (``fleetctl_addr``); the check phase may learn it from ``nic`` instead.
    """

    name: str
    address: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    nic: str | None = None
    train_addr: str | None = None
    gpus: int | None = None
    gpu_ids: tuple[str, ...] = ()  # fleetctl_gpus as a list (indices or UUIDs); gpus = its length
    workdir: str = DEFAULT_WORKDIR
    python: str = DEFAULT_PYTHON
    env: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    env_archive: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None
    proxy_jump: str | None = None  # from the inventory's ansible_ssh_*_args (-J / ProxyJump)
    # ansible_shell_type, one of WRAPPED_SHELLS: a login shell that cannot read POSIX lines
    shell_type: str | None = None
    local: bool = False
    groups: tuple[str, ...] = ()
    vars: dict[str, Any] = field(default_factory=dict, hash=False, compare=False, repr=False)
    source: str | None = None  # "file:line" where the host was declared, for error messages

    @property
    def label(self) -> str:
        """How messages name the node: ``gpu03 (10.0.0.3)``."""
        return self.name if self.address == self.name else f"{self.name} ({self.address})"

    def to_dict(self, rank: int) -> dict[str, Any]:
        """The node as ``fleetctl inventory --json`` shows it; ``rank``: its node rank (its
        place in the selection)."""
        return {
            "rank": rank,
            "host": self.name,
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "key_file": self.key_file,
            "local": self.local,
            "nic": self.nic,
            "train_addr": self.train_addr,
            "gpus": self.gpus,
            "workdir": self.workdir,
            "python": self.python,
            "env": dict(self.env),
            "env_archive": self.env_archive,
            "known_hosts": self.known_hosts,
            "ssh_config": self.ssh_config,
            "groups": list(self.groups),
            "source": self.source,
        }

    @classmethod
    def localhost(cls, **overrides: Any) -> Node:
        """The embedded default fleet: this machine alone, run without SSH."""
        import socket
        import sys

        base: dict[str, Any] = {
            "name": socket.gethostname() or "localhost",
            "address": "127.0.0.1",
            "local": True,
            "python": sys.executable or DEFAULT_PYTHON,
        }
        base.update(overrides)
        return cls(**base)
