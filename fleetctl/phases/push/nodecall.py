"""One mode of a push program on a node (``push_helper.py``, ``image_load.py``): the config as
one JSON line on stdin (a peer token never in argv), the answer as one ``D`` frame. The one
way push, ``push --image`` and the checkpoint relay run them; each caller judges the answer's
``error`` its own way (a failed fetch may fall back to an upload)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import NodePushError
from fleetctl.phases.frames import last_data

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import Connection


def call_mode(
    node: Node,
    conn: Connection,
    program: str,
    mode: str,
    cfg: dict[str, Any],
    timeout: float,
    *,
    failed: str,
    missing_python: str = "",
) -> dict[str, Any]:
    """``program``'s ``mode`` on ``node``: its answer, which may hold ``error``. No answer is a
    NodePushError (stage ``mode``): ``failed (exit N): <last line>``, or the node's python not
    found (exit 127; ``missing_python`` says what to do about it)."""
    res = conn.run(
        remote.cached_argv(node.python, node.workdir, program, mode),
        timeout=timeout,
        stdin=json.dumps(cfg).encode() + b"\n",
    )
    payload = last_data(res.stdout)
    if isinstance(payload, dict):
        return payload
    tail = ((res.stderr or "").strip() or (res.stdout or "").strip()).splitlines()
    if res.exit_code == 127:
        raise NodePushError(
            node.label, f"python {node.python!r} not found on the node{missing_python}", stage=mode
        )
    raise NodePushError(
        node.label,
        f"{failed} (exit {res.exit_code})" + (f": {tail[-1]}" if tail else ""),
        stage=mode,
    )
