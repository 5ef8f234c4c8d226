"""Bounded waits of the check probe: a program run with a timeout, a function on a thread of
its own, a parallel map. Every wait here ends.

Node module: stdlib only, Python >= 3.8 (the probe's: 3.7+).
"""

from __future__ import annotations

import os
import threading
import time


def which(name: str) -> str | None:
    """shutil.which for a plain name, without importing shutil."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def run(argv: list, timeout: float) -> tuple:
    """(exit code, stdout, stderr); 127 when the program is missing, 124 on timeout.

    Started by ``os.posix_spawn``, read here: no ``subprocess`` import, which cost every
    probe ~4 ms of its ~45 ms CPU (it runs rsync on every node). Python 3.7 has no
    posix_spawn: ``subprocess`` there."""
    if not hasattr(os, "posix_spawn"):
        return _run_subprocess(argv, timeout)
    import select
    import signal

    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        spawn = os.posix_spawn if "/" in argv[0] else os.posix_spawnp
        pid = spawn(
            argv[0],
            argv,
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, out_w, 1),
                (os.POSIX_SPAWN_DUP2, err_w, 2),
            ],
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),  # as subprocess restores them
        )
    except FileNotFoundError as e:
        _close(out_r, err_r)
        return 127, "", str(e)
    except OSError as e:
        _close(out_r, err_r)
        return 126, "", str(e)
    finally:
        _close(out_w, err_w)
    chunks: dict = {out_r: [], err_r: []}
    open_fds = [out_r, err_r]
    deadline = time.monotonic() + timeout
    try:
        while open_fds:
            left = deadline - time.monotonic()
            if left <= 0:
                return _killed(pid, timeout)
            ready, _, _ = select.select(open_fds, [], [], left)
            for fd in ready:
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    open_fds.remove(fd)
        # its output ended; the limit still holds (a program may shut its pipes and linger)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() >= deadline:
                return _killed(pid, timeout)
            time.sleep(0.005)
    finally:
        _close(out_r, err_r)
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    out, err = (b"".join(chunks[fd]).decode(errors="replace") for fd in (out_r, err_r))
    return code, out, err


def _killed(pid: int, timeout: float) -> tuple:
    import signal

    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return 124, "", f"timed out after {timeout:g}s"


def _close(*fds: int) -> None:
    for fd in fds:
        try:  # noqa: SIM105 - contextlib stays unimported on the probe's path
            os.close(fd)
        except OSError:
            pass


def _run_subprocess(argv: list, timeout: float) -> tuple:
    import subprocess

    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    except FileNotFoundError as e:
        return 127, "", str(e)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {timeout:g}s"
    except OSError as e:
        return 126, "", str(e)
    return (
        proc.returncode,
        proc.stdout.decode(errors="replace"),
        proc.stderr.decode(errors="replace"),
    )


def bounded(fn, timeout: float, default: object) -> object:
    """Run fn in a daemon thread; ``default`` if it does not finish (DNS can hang)."""
    box = [default]

    def target() -> None:
        try:
            box[0] = fn()
        except Exception as e:  # reported as data, never raised
            box[0] = {"error": str(e)}

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    return box[0]


class Task:
    """``fn(*args)`` on a daemon thread of its own; :meth:`result` waits a bounded time.

    Not concurrent.futures: its import (logging, traceback) cost every probe start ~14 ms of
    CPU, on every node, at every check."""

    def __init__(self, fn, *args) -> None:
        self.value: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn, args), daemon=True)
        self.thread.start()

    def _run(self, fn, args: tuple) -> None:
        try:
            self.value = fn(*args)
        except BaseException as e:  # re-raised by result(), in the caller's thread
            self.error = e

    def result(self, timeout: float) -> object:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise TimeoutError(f"no answer within {timeout:g}s")
        if self.error is not None:
            raise self.error
        return self.value


def pmap(fn, items: list, width: int, timeout: float) -> list:
    """``[fn(x) for x in items]`` on up to ``width`` threads, in order; the first error is
    raised, and so is TimeoutError when they are not all done within ``timeout``."""
    out: list = [None] * len(items)
    errors: list = []
    todo = iter(range(len(items)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                return
            try:
                out[i] = fn(items[i])
            except BaseException as e:  # re-raised below, in the caller's thread
                errors.append(e)
                return

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(width, len(items)))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"{len(items)} calls not done within {timeout:g}s")
    return out
