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

REMOTE_SRC = remote.inline("push_helper.py")
ENVINFO_SRC = remote.inline("envinfo.py")  # run by the env's python


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
