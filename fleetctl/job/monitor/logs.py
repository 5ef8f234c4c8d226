"""``fleetctl logs``: a job's console logs, collected or followed live from every node.

Following is one streamed SSH command per node running a small stdlib follower that frames
whole lines like the supervisor does; lines from all nodes arrive through one queue.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from fleetctl.node import Node

if TYPE_CHECKING:
    pass

from fleetctl.errors import one_line
from fleetctl.phases.frames import FOLLOW_KINDS, FrameReader

if TYPE_CHECKING:
    from fleetctl.job.monitor.handle import JobHandle


def follow_logs(
    h: JobHandle,
    ranks: Sequence[tuple[int, str]],
    on_line: Callable[[int, str, str], None],
    *,
    follow: bool = True,
    lines: int | None = None,
    stop: threading.Event | None = None,
    timeout: float | None = None,
) -> dict[int, str | None]:
    """Stream the nodes' live ``console.log`` (one streamed SSH command per node).

    Calls ``on_line(rank, host, text)`` for every whole line; returns when every node's
    job ended and its log was read to the end (``follow``), at once after the current
    content (not ``follow``), when ``stop`` is set, or after ``timeout``. Returns rank ->
    error (None = fine).
    """
    stop = stop or threading.Event()
    q: queue.Queue[tuple[int, str, str | None]] = queue.Queue()
    by_name = {n.name: n for n in h.nodes}
    errors: dict[int, str | None] = {}
    threads = []
    for rank, host in ranks:
        node = by_name.get(host)
        if node is None:
            errors[rank] = "not in connect.json"
            continue
        t = threading.Thread(
            target=_follow_one,
            args=(h, rank, node, q, stop, follow, lines),
            daemon=True,
            name=f"logs-{rank}",
        )
        threads.append(t)
        t.start()
    pending = {rank for rank, _ in ranks if rank not in errors}
    hosts = dict(ranks)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while pending:
            if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                break
            try:
                rank, kind, text = q.get(timeout=0.2)
            except queue.Empty:
                continue
            if kind == "line":
                on_line(rank, hosts[rank], text or "")
            else:
                errors[rank] = text
                pending.discard(rank)
    finally:
        stop.set()
        for t in threads:
            t.join(3.0)
    while True:  # lines already read before the end
        try:
            rank, kind, text = q.get_nowait()
        except queue.Empty:
            break
        if kind == "line":
            on_line(rank, hosts[rank], text or "")
    return errors


def _follow_one(
    h: JobHandle,
    rank: int,
    node: Node,
    q: queue.Queue[tuple[int, str, str | None]],
    stop: threading.Event,
    follow: bool,
    lines: int | None,
) -> None:
    from fleetctl.phases.launch import start_command, supervisor_path, upload_on_request

    stream = None
    try:
        conn = h.fleet.connection(node)
        np = h.plan.node(node.name)
        sup = supervisor_path(conn.expand(node.workdir))
        args = ["follow", "--run-dir", conn.expand(np.run_dir)]
        args += [
            "--follow",
            "1" if follow else "0",
            "--last",
            str(-1 if lines is None else lines),
        ]
        stream = conn.start(start_command(conn.expand(node.python), sup, *args))
        reader = FrameReader(kinds=FOLLOW_KINDS)
        while not stop.is_set():
            data = stream.recv(0.3)
            if data is None:
                continue
            frames = reader.feed(data) if data else reader.flush()
            for fr in frames:
                if fr.kind == "L":
                    q.put((rank, "line", fr.text))
                elif fr.kind == "E":
                    q.put((rank, "line", f"[fleetctl] {fr.text}"))
                elif fr.kind == "U":  # the supervisor is not there yet: the loader asks
                    upload_on_request(stream)
            if not data:
                code = stream.exit_code(2.0)
                q.put((rank, "end", None if code == 0 else f"log follower exited {code}"))
                return
        q.put((rank, "end", None))
    except Exception as e:  # every node's outcome is kept; never a silent thread death
        q.put((rank, "end", one_line(e)))
    finally:
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()
