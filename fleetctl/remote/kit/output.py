"""The supervisor's frame writer: one writer thread, whole lines, so a stalled SSH channel
never blocks the job, the log or the dead-man switch.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import errno
import os
import queue
import threading

from .framing import line

OUT_QUEUE = 10000  # frames buffered for a slow controller; beyond that lines go to the log only
COALESCE_BYTES = 32768  # frames joined into one write (about one SSH packet)


class Out:
    """Frames to the controller through one writer thread, so a stalled SSH channel never blocks
    the job, the log or the dead-man switch. Frames are whole lines, written in one call each."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.q: queue.Queue = queue.Queue(OUT_QUEUE)
        self.dropped = 0
        self.broken = fd is None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        if fd is not None:
            self.thread.start()

    def frame(self, kind: str, payload: bytes = b"", *, must: bool = False) -> None:
        if self.broken:
            return
        data = line(kind, payload)
        try:
            if must:
                self.q.put(data, timeout=2.0)
            else:
                self.q.put_nowait(data)
        except queue.Full:
            self.dropped += 1

    def frame_or_wait(self, kind: str, payload: bytes) -> None:
        """Like :meth:`frame`, but wait for room instead of dropping: used while console.log
        cannot be written (disk full), when the controller's copy is the only one left. The
        job then waits on its pipe rather than lose lines; only a gone controller drops them."""
        data = line(kind, payload)
        while not self.broken:
            try:
                self.q.put(data, timeout=1.0)
                return
            except queue.Full:
                continue

    def _loop(self) -> None:
        while True:
            data = self.q.get()
            if data is None:
                return
            # Coalesce what queued meanwhile: one write, and fewer SSH packets for the
            # controller to decrypt, when the job prints fast.
            end = False
            parts = [data]
            size = len(data)
            while size < COALESCE_BYTES:
                try:
                    more = self.q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    end = True
                    break
                parts.append(more)
                size += len(more)
            if len(parts) > 1:
                data = b"".join(parts)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)  # type: ignore[arg-type]
                    view = view[n:]
            except OSError:
                self.broken = True  # controller gone; the log still gets everything
                return
            if end:
                return

    def close(self, timeout: float) -> None:
        if self.fd is None or not self.thread.is_alive():
            return
        try:
            self.q.put(None, timeout=timeout)
        except queue.Full:
            return
        self.thread.join(timeout)


# console.log (the supervisor's copy of the job's output, written as it comes)
def write_all(f, data: bytes) -> None:
    """All of ``data`` to an unbuffered file (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise OSError(errno.ENOSPC, "no space left on device")
        view = view[n:]


def write_problem(e: OSError, run_dir: str) -> str:
    """What a failed console.log write says about the node."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full on {run_dir}"
    return f"cannot write console.log in {run_dir}: {e.strerror or e}"


def gap_note(lost: int, problem: str | None) -> bytes:
    """The line console.log gets where output is missing (writes work again)."""
    return (
        f"\n[fleetctl supervisor] {lost} bytes of output are missing here ({problem}); "
        "fleetctl's streamed copy has them\n"
    ).encode()
