"""Reattach: a node whose channel went silent or closed is reached over a new connection
before it is called lost.

A management-network blip stalls or breaks the SSH channel to a node whose job runs on. The
watcher then opens a *new* connection (the old transport may be dead) and starts the node
supervisor's ``reattach`` mode: it says whether the job's supervisor is alive, replays
console.log from the first line the controller did not get, relays heartbeats (the dead-man
switch counts them) and stop requests, and ends with the job's exit report. The watcher tries
from half the lost-node timeout on; only a node not back on a new connection by the time it
has been silent for the whole timeout is lost; a job whose controller never comes back is
still stopped by its dead-man switch.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

from fleetctl.errors import LaunchError
from fleetctl.phases.frames import FrameReader
from fleetctl.phases.launch import start_command

if TYPE_CHECKING:
    from fleetctl.phases.frames import Frame
    from fleetctl.phases.launch import NodeRun
    from fleetctl.transport.connection import Connection

MAX_REATTACH = 3  # per node and job: a link that keeps flapping is a sick node


def reattach_stream(run: NodeRun, conn: Connection, *, timeout: float) -> list[Frame]:
    """Start ``reattach`` on ``conn`` and make it ``run``'s stream once the supervisor answers
    alive; returns the frames that came after its ``S``. Raises LaunchError with the reason
    (no answer in ``timeout`` s, channel closed, supervisor gone)."""
    label = run.node.label
    cmd = start_command(
        run.python, run.sup_path, "reattach", "--run-dir", run.run_dir, "--skip", str(run.lines)
    )
    stream = conn.start(cmd)
    reader = FrameReader(batch_lines=True)
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout
    try:
        while not any(f.kind == "S" for f in frames):
            left = deadline - time.monotonic()
            if left <= 0:
                raise LaunchError(f"{label}: no answer from its supervisor within {timeout:g}s")
            data = stream.recv(min(0.2, left))
            if data is None:
                continue
            if not data:
                frames += reader.flush()
                if not any(f.kind == "S" for f in frames):
                    raise LaunchError(f"{label}: the new connection closed at once")
                break
            frames += reader.feed(data)
        i = next(i for i, f in enumerate(frames) if f.kind == "S")
        try:
            info = frames[i].data()
        except ValueError as e:
            raise LaunchError(f"{label}: malformed answer from its supervisor") from e
        if not info.get("alive") and info.get("state") == "running":
            raise LaunchError(f"{label}: the node answers, but the job's supervisor is gone")
    except BaseException:
        with contextlib.suppress(Exception):
            stream.close()
        raise
    run.stream, run.reader = stream, reader
    run.reattached += 1
    return frames[i + 1 :]
