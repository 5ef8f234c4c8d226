"""The container guard: ends the job's containers on this node when its supervisor cannot.

conmon, not the supervisor, is the parent of a container, so a container outlives a supervisor
killed with SIGKILL (or by the OOM killer, or a crash). The supervisor starts this guard before
the job, out of its own process tree and session and without the job's env tags (so no stop
sweep of the job takes it for one of the job's processes), and holds the write end of a pipe
that is the guard's stdin. The supervisor's verified end of the containers writes ``d``: the
guard leaves quietly (after an end a hung runtime cut, said in the supervisor's exit report,
too: the guard would hang as long again). EOF without ``d`` (the supervisor died, however it
died, or could not verify the end) makes the guard do the end itself: the job's containers
stopped (SIGTERM, the grace, SIGKILL), removed and listed again by label, then the job's
processes swept (the runtime's client, a rank that left the container's process group), what
it did written to ``container-guard.json`` in the node run folder.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time

from .atomic import read_json, write_json
from .containers import end_containers
from .jobprocs import stop_processes
from .wire import STATE_FILE

GUARD_FILE = "container-guard.json"  # in the node run folder: what the guard had to do
READY_TIMEOUT = 10.0  # s for the guard to say it is up
DONE = b"d"

# ``python -S -c GUARD <folder of this module's package> <this module> <json>``: the folder
# first on sys.path (not the current one: a user's ~/json.py must not replace the stdlib's),
# then the guard's main.
GUARD = (
    "import sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "guard = __import__(sys.argv.pop(1), None, None, ['main'])\n"
    "sys.exit(guard.main(sys.argv[1:]))\n"
)
UNTAGGED = ("FLEET_JOB_ID", "FLEET_NODE_RANK")  # the job's env tags: the guard is no job process


class Guard:
    """The supervisor's end of a running guard: ``release`` once the end is verified."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd

    def release(self, leave: bool) -> None:
        """Close our end: with ``d`` when the containers' end is verified, or was cut by a hung
        runtime and reported (the guard leaves), without it otherwise (the guard tries the end
        itself)."""
        if self.fd < 0:
            return
        try:
            if leave:
                os.write(self.fd, DONE)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = -1


def start_guard(
    cfg: dict, job_id: str, rank: int, run_dir: str, grace: float
) -> tuple[Guard | None, str | None]:
    """Start the guard for the job's containers: (the guard, None) or (None, why not).

    Called before the supervisor becomes a child subreaper: the guard's parent exits at once,
    so the guard is re-parented to init, never under the supervisor's tree."""
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.isfile(os.path.join(here, "container_guard.py")):
        return None, "no container guard: the supervisor runs from memory (workdir not writable)"
    root = here
    for _ in range(__name__.count(".")):
        root = os.path.dirname(root)
    args = {"cfg": cfg, "job_id": job_id, "rank": rank, "run_dir": run_dir, "grace": grace}
    env = {k: v for k, v in os.environ.items() if k not in UNTAGGED}
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", GUARD, root, __name__, json.dumps(args)],
            stdin=r,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd="/",
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        os.close(r)
        os.close(w)
        return None, f"no container guard: {e.strerror or e}"
    os.close(r)
    try:
        line = _read_line(proc.stdout.fileno(), READY_TIMEOUT)  # type: ignore[union-attr]
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
        try:
            proc.wait(READY_TIMEOUT)  # the guard's first process exits once it forked
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if not line.startswith(b"ready "):
        os.close(w)
        return None, "no container guard: it did not start"
    return Guard(int(line.split()[1]), w), None


def _read_line(fd: int, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data


def main(argv: list) -> int:
    """The guard: fork away from the starter, say ``ready <pid>``, wait for our stdin's end."""
    args = json.loads(argv[0])
    if os.fork() > 0:
        os._exit(0)  # our starter reaps this one; the guard is an orphan now, init's child
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    os.write(1, b"ready %d\n" % os.getpid())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    said = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            chunk = b""
        if not chunk:
            break
        said += chunk
    if DONE in said:
        return 0
    return act(args)


def act(args: dict) -> int:
    """The supervisor is gone without a verified end: end the containers, then the job's
    processes still alive (the runtime's client among them), and say what was done."""
    run_dir = str(args["run_dir"])
    grace = float(args.get("grace", 5.0))
    started = time.time()
    ended = end_containers(args["cfg"], grace)
    state = read_json(os.path.join(run_dir, STATE_FILE))
    if state.get("job_id") != args["job_id"]:
        state = {}
    swept = stop_processes(
        str(args["job_id"]),
        int(args["rank"]),
        state.get("pgid"),
        state.get("leader_start"),
        grace,
    )
    record = {"time": started, "containers": ended, "processes": swept}
    with contextlib.suppress(OSError):
        write_json(os.path.join(run_dir, GUARD_FILE), record)
    return 0 if ended["problem"] is None and not swept["remaining"] else 1
