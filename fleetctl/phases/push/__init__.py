"""Push phase: ship the code snapshot and the conda-pack env to every node, then prove they work.

Per node, in the common cases: a no-op push is ONE remote command (probe: is
``W/code/<digest>`` there, is ``W/envs/<sha256>`` there and does its python load NCCL); a full
push is probe, rsync (real OpenSSH with fleetctl's trust settings), an SFTP upload of the
archive and ONE finalize command (rename code, unpack env into a temp dir, rewrite prefixes for
the final location, rename, verify). Large fleets fetch the archive from already-served peers
over the training network through a short-lived token-protected HTTP server, so the
controller's uplink carries the archive about once. Every node's outcome is kept; any failure
raises ``PushError`` whose ``result`` maps each node to its ``NodePush`` or its error.
"""

from __future__ import annotations

from fleetctl.phases.push.phase import push
from fleetctl.phases.push.report import (
    NodePush,
    ProgressFn,
    PushEvent,
    PushOptions,
    PushReport,
    env_path_prefix,
)
from fleetctl.phases.push.request import PushRequest

__all__ = [
    "NodePush",
    "ProgressFn",
    "PushEvent",
    "PushOptions",
    "PushReport",
    "PushRequest",
    "env_path_prefix",
    "push",
]
