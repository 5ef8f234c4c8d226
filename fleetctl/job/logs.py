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

from fleetctl.job.supervisors import _one_line

if TYPE_CHECKING:
    from fleetctl.job.handle import JobHandle


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
    from fleetctl.phases.launch import FrameReader

    stream = None
    try:
        conn = h.fleet.connection(node)
        np = h.plan.node(node.name)
        argv = [
            conn.expand(node.python),
            "-c",
            FOLLOWER,
            conn.expand(np.run_dir),
            "1" if follow else "0",
            "-1" if lines is None else str(lines),
        ]
        stream = conn.start(argv)
        reader = FrameReader()
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
            if not data:
                code = stream.exit_code(2.0)
                q.put((rank, "end", None if code == 0 else f"log follower exited {code}"))
                return
        q.put((rank, "end", None))
    except Exception as e:  # every node's outcome is kept; never a silent thread death
        q.put((rank, "end", _one_line(e)))
    finally:
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()


# Node side of ``fleetctl logs``: argv = run_dir, follow (1/0), last N lines (-1 = all).
# Frames like the supervisor's: ``L <line>`` per whole line, ``E <notice>``. Ends when the job's
# supervisor has ended (supervisor.json not running, or its process gone) and the log is read
# to the end, when stdin closes (fleetctl went away), or at once without follow.
FOLLOWER = r"""
import json, os, select, sys, time
d, follow, last = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
log, state = os.path.join(d, "console.log"), os.path.join(d, "supervisor.json")
out = os.fdopen(1, "wb", 0)
def running():
    try:
        with open(state) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return os.path.isdir(d) and not os.path.exists(log)
    if s.get("state") != "running":
        return False
    pid, start = s.get("supervisor_pid"), s.get("supervisor_start")
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            st = f.read().decode("ascii", "replace")
        rest = st[st.rfind(")") + 2:].split()
        return rest[0] not in ("Z", "X") and (start is None or int(rest[19]) == start)
    except (OSError, TypeError, ValueError, IndexError):
        return False
def emit(line):
    out.write(b"L " + line.rstrip(b"\n") + b"\n")
deadline = time.time() + 30
while not os.path.exists(log):
    if not follow or time.time() > deadline or not running():
        out.write(b"E no console.log on this node (the job never started here)\n")
        sys.exit(0)
    time.sleep(0.2)
f = open(log, "rb")
if last >= 0:
    f.seek(0, 2)
    start = max(0, f.tell() - 262144)
    f.seek(start)
    tail = f.read().split(b"\n")
    if start > 0:
        tail = tail[1:]
    buf = tail[-1] if tail else b""
    for line in (tail[:-1][-last:] if last > 0 else []):
        emit(line)
else:
    buf = b""
while True:
    chunk = f.read(65536)
    if chunk:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for line in lines:
            emit(line)
        continue
    if not follow:
        break
    alive = running()
    r, _, _ = select.select([0], [], [], 0.3)
    if r and not os.read(0, 4096):
        break
    if not alive:
        chunk = f.read()
        if not chunk:
            break
        buf += chunk
if buf:
    emit(buf)
"""
