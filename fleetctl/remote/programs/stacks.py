"""Node side of stack dumps: every Python process of one job on this node, dumped.

Run by the controller as ``python3 -c <this file> <json>`` (stdlib only, Python >= 3.8), one
command per node. The JSON names the job (``job_id``), the node's run folder (``run_dir``),
a py-spy binary (``py_spy``, or null: ``py-spy`` on PATH if any) and whether a process py-spy
cannot read may be ended with SIGABRT (``abort``) so that Python's faulthandler, enabled for
every job by fleetctl (``PYTHONFAULTHANDLER=1``), writes all its threads to the job's console
log as it dies. Each process's py-spy dump is saved as ``<run_dir>/stacks/<pid>.txt``.

Prints one line per process ``K <json>`` — ``pid``, ``rank`` (``RANK`` in its environment, null
for launchers), ``method`` (``py-spy``, ``faulthandler`` or ``none``), ``text``, ``error`` —
then ``D <json>`` with the totals and, when processes were aborted, ``console``: what
console.log gained while their faulthandler dumps came in (bounded in time and size), for the
controller to fold like py-spy's.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

from ..kit.framing import frame
from ..kit.procfs import ended, environ, exe_name, pids

PY_SPY_TIMEOUT = 20
ABORT_WAIT = 5.0  # s for aborted processes to end and their dumps to reach console.log
SETTLE = 0.3  # s without console.log growing: the supervisor's rank tailers (0.1 s) are done
MAX_CONSOLE = 1 << 20  # bytes of console.log sent back


def is_python(pid):
    return (exe_name(pid) or "").startswith("python")


def job_processes(job_id):
    """(pid, env) of every process tagged with this job id, launchers and ranks alike."""
    me = os.getpid()
    out = []
    for pid in pids():
        env = environ(pid) if pid != me else {}
        if env.get("FLEET_JOB_ID") == job_id:
            out.append((pid, env))
    return sorted(out, key=lambda p: p[0])


def dump(pid, py_spy, folder):
    """py-spy's dump of ``pid``: (text, error)."""
    if not py_spy:
        return None, "py-spy not available on this node"
    try:
        res = subprocess.run(
            [py_spy, "dump", "--pid", str(pid)],
            capture_output=True,
            timeout=PY_SPY_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"py-spy: {e}"
    text = res.stdout.decode("utf-8", "replace")
    if res.returncode != 0 or not text.strip():
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        last = err[-1] if err else "no output"
        return None, f"py-spy exited {res.returncode}: {last}"
    path = os.path.join(folder, f"{pid}.txt")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return text, None


def _size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def console_since(path, offset, aborted):
    """What ``path`` gained from ``offset`` once the ``aborted`` pids ended and it stopped
    growing: both bounded by ABORT_WAIT; the last MAX_CONSOLE bytes at most."""
    deadline = time.monotonic() + ABORT_WAIT
    while time.monotonic() < deadline and not all(ended(p) for p in aborted):
        time.sleep(0.05)
    size, still = _size(path), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - still < SETTLE:
        time.sleep(0.05)
        now = _size(path)
        if now != size:
            size, still = now, time.monotonic()
    start = max(offset, size - MAX_CONSOLE)
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(size - start)
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def main(argv):
    args = json.loads(argv[1])
    py_spy = args.get("py_spy") or shutil.which("py-spy")
    run_dir = os.path.expanduser(args["run_dir"])
    folder = os.path.join(run_dir, "stacks")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    console = os.path.join(run_dir, "console.log")
    offset = _size(console)
    aborted = []
    counts = {"py-spy": 0, "faulthandler": 0, "none": 0}
    for pid, env in job_processes(args["job_id"]):
        if not is_python(pid):
            continue
        rank = env.get("RANK")
        text, error = dump(pid, py_spy, folder)
        method = "py-spy" if text is not None else "none"
        if text is None and args.get("abort") and env.get("PYTHONFAULTHANDLER"):
            try:
                os.kill(pid, signal.SIGABRT)
                method = "faulthandler"
                aborted.append(pid)
            except OSError as e:
                error = f"{error}; SIGABRT: {e}"
        counts[method] += 1
        frame(
            "K",
            {
                "pid": pid,
                "rank": int(rank) if rank is not None and rank.isdigit() else None,
                "method": method,
                "text": text,
                "error": error,
            },
        )
    done = dict(counts)
    if aborted:
        done["console"] = console_since(console, offset, aborted)
    frame("D", done)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
