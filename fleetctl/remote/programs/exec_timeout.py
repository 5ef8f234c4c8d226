"""``fleetctl exec --timeout``, on the node: run a shell line, and when its time is up stop it
and everything it started. Stdlib only, Python >= 3.8, shipped with ``python -c``.

argv: ``TIMEOUT GRACE TAG COMMAND``. The command runs under ``/bin/sh -c`` in its own session
(so its process group holds its children) with ``FLEET_EXEC_ID=TAG`` in its environment (so a
child that left the group with ``setsid`` is still found, in /proc). stdin, stdout and stderr
are the command's own. On time-out: SIGTERM to the group and every tagged process, GRACE
seconds, SIGKILL, then the last stderr line is ``fleetctl: exec timed out after T s …`` and
the exit status 124 (as coreutils ``timeout``). Otherwise the command's status (128+N for a
signal N, as shells say).

argv ``--sweep TIMEOUT GRACE TAG RC``: what is left to do after coreutils ``timeout`` ran the
tagged command and exited RC (124 or 137) in the shell this replaces (``exec``). A command of
its own that exits 124 ends before TIMEOUT: then RC passes on unchanged. Otherwise the tagged
processes outside the group ``timeout`` stopped (``setsid`` children) get SIGTERM, GRACE
seconds, SIGKILL, and the same last stderr line and 124 as above. The common case, a command
that ends in time, so never starts Python on the node (its start and this program's compile
were most of a node's CPU for ``exec -- hostname``).

Closing the SSH channel does not stop a command without a terminal (no SIGHUP), so the
controller's own deadline alone would leave it running: this is the node's own deadline.
"""

from __future__ import annotations

import os
import sys
import time

# No subprocess (nor contextlib): its import was a third of this wrapper's CPU, paid on every
# node for every ``fleetctl exec``; the command is forked and reaped here (``Child``). No
# ``signal`` either but the C module under it: ``signal`` converts its constants to enums, and
# importing ``enum`` was again a third of what was left (~5 of ~16 ms per node per exec).
try:
    import _signal as signal
except ImportError:  # an interpreter without it: the public module
    import signal  # type: ignore[no-redef]

from ..kit.procfs import age, ended, environ_has, pids
from ..kit.wire import EXEC_TIMEOUT_MARK as MARK

TIMED_OUT = 124
SETTLE = 5.0  # s to wait for killed processes to be gone


def tagged(tag: str) -> list[int]:
    """Pids (not ours) whose environment holds ``FLEET_EXEC_ID=<tag>`` exactly."""
    want = [("FLEET_EXEC_ID=" + tag).encode()]
    me = os.getpid()
    return [pid for pid in pids() if pid != me and environ_has(pid, want)]


def alive(tag: str) -> list[int]:
    return [p for p in tagged(tag) if not ended(p)]


def kill_each(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:  # noqa: SIM105 - contextlib is not imported here
            os.kill(pid, sig)
        except OSError:
            pass


def settle(tag: str, seconds: float) -> list[int]:
    """The tagged processes still alive after up to ``seconds`` of waiting for them to go."""
    deadline = time.monotonic() + seconds
    while alive(tag) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(tag)


def signal_all(pgid: int, tag: str, sig: int) -> None:
    try:  # noqa: SIM105
        os.killpg(pgid, sig)
    except OSError:
        pass
    kill_each(tagged(tag), sig)


def _exit_code(status: int) -> int:
    """A wait status as subprocess says it: the exit code, or -N for a signal N."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


class Child:
    """The command: ``/bin/sh -c`` in a session of its own; its status once reaped."""

    def __init__(self, command: str, env: dict) -> None:
        self.returncode: int | None = None
        pid = os.fork()
        if pid == 0:  # the child: nothing but a new session and the shell
            try:
                os.setsid()
                # Python ignores SIGXFSZ (and we set SIGPIPE back already): not the command
                if hasattr(signal, "SIGXFSZ"):
                    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
                os.execve("/bin/sh", ["/bin/sh", "-c", command], env)
            except BaseException as e:  # the child must never go on as this program
                try:
                    os.write(2, f"fleetctl: cannot start /bin/sh: {e}\n".encode())
                finally:
                    os._exit(127)
        self.pid = pid

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more to learn
                self.returncode = 255
                return self.returncode
            if pid:
                self.returncode = _exit_code(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if it still runs after ``timeout`` seconds (polled as
        subprocess polls a wait with a timeout: from 0.5 ms, doubling up to 50 ms)."""
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return self.returncode


def run(timeout: float, grace: float, tag: str, command: str) -> int:
    env = dict(os.environ)
    env["FLEET_EXEC_ID"] = tag
    proc = Child(command, env)
    code = proc.wait(timeout)
    if code is not None:
        return code if code >= 0 else 128 - code
    found = len(set(alive(tag)) | {proc.pid})
    signal_all(proc.pid, tag, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        proc.poll()
        if proc.returncode is not None and not alive(tag):
            break
        time.sleep(0.05)
    killed = alive(tag)
    if proc.poll() is None or killed:
        signal_all(proc.pid, tag, signal.SIGKILL)
    proc.wait(SETTLE)
    left = settle(tag, SETTLE)
    how = "killed with SIGKILL" if killed else "stopped with SIGTERM"
    tail = f"; still running: {' '.join(map(str, left))}" if left else ""
    sys.stderr.write(f"{MARK} {timeout:g}s: {found} process(es) {how}{tail}\n")
    sys.stderr.flush()
    return TIMED_OUT


def sweep(timeout: float, grace: float, tag: str, rc: int) -> int:
    """After coreutils ``timeout`` exited ``rc``: stop the tagged processes it could not reach
    (outside its process group) when it timed out; ``rc`` as it is when the command ended in
    time (this process is the shell that ran ``timeout``: its age is the command's time)."""
    took = age(os.getpid())  # to 10 ms (clock ticks): a time-out is never taken for an end
    if rc not in (TIMED_OUT, 128 + 9) or (took is not None and took < timeout - 0.05):
        return rc
    group = "killed with SIGKILL" if rc != TIMED_OUT else "stopped with SIGTERM"
    found = len(alive(tag))
    kill_each(tagged(tag), signal.SIGTERM)
    killed = settle(tag, grace)
    kill_each(killed, signal.SIGKILL)
    left = settle(tag, SETTLE)
    how = "killed with SIGKILL" if killed else "stopped with SIGTERM"
    tail = f"; still running: {' '.join(map(str, left))}" if left else ""
    sys.stderr.write(
        f"{MARK} {timeout:g}s: its process group {group} by coreutils timeout, "
        f"{found} more process(es) {how}{tail}\n"
    )
    sys.stderr.flush()
    return TIMED_OUT


def main(argv: list) -> int:
    if len(argv) == 5 and argv[0] == "--sweep":
        return sweep(float(argv[1]), float(argv[2]), argv[3], int(argv[4]))
    if len(argv) != 4:
        sys.stderr.write("usage: exec_timeout TIMEOUT GRACE TAG COMMAND\n")
        sys.stderr.write("       exec_timeout --sweep TIMEOUT GRACE TAG RC\n")
        return 2
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return run(float(argv[0]), float(argv[1]), argv[2], argv[3])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
