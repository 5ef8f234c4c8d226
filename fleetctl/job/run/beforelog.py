"""Where a before-launch hook's output goes (``run --before fabfile.py:task``): each line,
with the node it came from, to the terminal as ``[rank host] line`` (a ``line`` event, like a
rank's) and to ``<rank>-<host>/before.log`` in the run folder.

The hook keeps its public signature ``(nodes, settings)``; the task runner finds the sink in
:data:`BEFORE_OUTPUT` while the hook runs (set in the calling thread, read before its own
threads start)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.job.run.context import JobContext

LineSink = Callable[[int, str], None]  # (index of the node in the job's nodes, one line)
BEFORE_OUTPUT: ContextVar[LineSink | None] = ContextVar("fleetctl_before_output", default=None)


@contextlib.contextmanager
def before_output(job: JobContext) -> Iterator[None]:
    """While the hook runs: its lines are events and go to each node's ``before.log``."""
    lock = threading.Lock()
    files: dict[int, IO[bytes]] = {}

    def sink(index: int, line: str) -> None:
        with lock:  # the nodes' output threads take turns: whole lines, files opened once
            f = files.get(index)
            if f is None:
                with contextlib.suppress(OSError):
                    host = job.result.nodes[index].host
                    f = files[index] = job.folder.open_before_log(index, host)
            if f is not None:
                with contextlib.suppress(OSError):
                    f.write(line.encode("utf-8", "replace") + b"\n")
            job.emit("line", line, rank=index)

    token = BEFORE_OUTPUT.set(sink)
    try:
        yield
    finally:
        BEFORE_OUTPUT.reset(token)
        for f in files.values():
            with contextlib.suppress(OSError):
                f.close()
