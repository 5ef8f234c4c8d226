"""What the push keeps per node between its stages, the node-side helper it drives
(``fleetctl/remote/programs/push_helper.py``) and its answer marker, and one-line node errors."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import FleetctlError, NodePushError, one_line

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.phases.envpack import EnvArchive
    from fleetctl.phases.push.report import NodePush

# The push helper and the env's python's envinfo as ``python -c`` code: made on first use
# (module ``__getattr__``; inlining and compressing them cost ~4 ms of CPU), since a no-op
# run's push, whose probe the check did, asks for neither.
_INLINED = {"REMOTE_SRC": "push_helper.py", "ENVINFO_SRC": "envinfo.py"}  # envinfo: env's python
if TYPE_CHECKING:
    REMOTE_SRC: str
    ENVINFO_SRC: str


def __getattr__(name: str) -> str:
    program = _INLINED.get(name)
    if program is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    code = globals()[name] = remote.inline(program)
    return code


@dataclass
class _State:
    """One node's mutable push state between phases."""

    node: Node
    result: NodePush
    archive: EnvArchive | None = None
    workdir: str = ""
    workdir_id: str | None = None  # nodes with one id share one workdir (an NFS home)
    rsync: str | None = None
    free: int = 0
    code_present: bool = False
    code_prev: str | None = None
    prev_manifest: dict[str, list] | None = None
    env_present: bool = False
    verify: dict[str, Any] | None = None
    code_pending: dict[str, Any] | None = None
    kept_archive: str | None = None  # archive name kept under W/envs to serve peers
    t0: float = field(default_factory=time.monotonic)


def _node_error(node: Node, e: BaseException) -> BaseException:
    if isinstance(e, FleetctlError):
        return e
    return NodePushError(node.label, _one_line(e), stage="push")


def _one_line(e: BaseException) -> str:
    return one_line(e, typed=True)
