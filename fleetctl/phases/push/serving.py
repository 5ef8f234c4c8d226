"""Push's ``serve`` mode on one node: a short-lived HTTP server for one file, bound to the
node's training address, answering only a one-time bearer token. Started and stopped the one
way here for every peer copy: the env archive's waves (``peers.py``), ``push --image``'s seed
(``image.py``) and the checkpoint relay (``relay.py``)."""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import NodePushError
from fleetctl.phases.frames import PUSH_KINDS, FrameStream

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import Connection, Stream

START_TIMEOUT = 30.0  # from the command to the server's address frame


@dataclass(frozen=True)
class Serving:
    """A started server: its stream (closing its stdin ends it) and where peers fetch from."""

    node: str
    stream: Stream
    host: str
    port: int
    token: str

    def peer(self) -> dict[str, Any]:
        """The fetch config's entry for this server (``{"fetch": {"peers": [...]}}``)."""
        return {"name": self.node, "host": self.host, "port": self.port, "token": self.token}


def start_serve(
    node: Node,
    conn: Connection,
    *,
    path: str,
    sha: str,
    bind: str | None,
    timeout: float,
    remove: bool,
) -> Serving:
    """Start ``serve`` for ``path`` on ``node`` (``remove``: it deletes the file when it ends).
    Raises NodePushError (stage ``serve``) when it does not say where it listens in time."""
    from fleetctl.phases.push.state import REMOTE_SRC

    token = secrets.token_hex(32)
    stream = conn.start([node.python, remote.NO_SITE, "-c", REMOTE_SRC, "serve"])
    cfg = {
        "path": path,
        "sha": sha,
        "token": token,
        "bind": bind,
        "timeout": timeout,
        "remove": remove,
    }
    try:
        stream.send(json.dumps(cfg).encode() + b"\n")
        frames = FrameStream(stream, PUSH_KINDS, json_kinds=PUSH_KINDS)
        got = frames.next("AD", time.monotonic() + START_TIMEOUT)
        if got is None and not frames.eof:
            raise NodePushError(
                node.label, f"peer server did not start in {START_TIMEOUT:.0f}s", stage="serve"
            )
        if got is None:
            raise NodePushError(
                node.label, "peer server exited: " + frames.tail[-200:], stage="serve"
            )
        info = got.data()
        if not isinstance(info, dict) or "port" not in info:
            error = info.get("error") if isinstance(info, dict) else info
            raise NodePushError(node.label, f"peer server: {error}", stage="serve")
    except BaseException:
        stop_serve(stream)
        raise
    return Serving(node.name, stream, str(info["host"]), int(info["port"]), token)


def stop_serve(stream: Stream) -> None:
    """Close the server's stdin (it exits, removing its file when asked to) and its stream."""
    with contextlib.suppress(Exception):
        stream.close_stdin()
        stream.exit_code(15)
    with contextlib.suppress(Exception):
        stream.close()
