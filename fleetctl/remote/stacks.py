"""Node side of stack dumps: every Python process of one job on this node, dumped.

Run by the controller as ``python3 -c <this file> <json>`` (stdlib only, Python >= 3.8), one
command per node. The JSON names the job (``job_id``), the node's run folder (``run_dir``),
a py-spy binary (``py_spy``, or null: ``py-spy`` on PATH if any) and whether a process py-spy
cannot read may be ended with SIGABRT (``abort``) so that Python's faulthandler, enabled for
every job by fleetctl (``PYTHONFAULTHANDLER=1``), writes all its threads to the job's console
log as it dies. Each process's py-spy dump is saved as ``<run_dir>/stacks/<pid>.txt``.

Prints one line per process ``K <json>`` — ``pid``, ``rank`` (``RANK`` in its environment, null
for launchers), ``method`` (``py-spy``, ``faulthandler`` or ``none``), ``text``, ``error`` —
then ``D <json>`` with the totals.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

PY_SPY_TIMEOUT = 20


def environ(pid):
    """The process's environment as a dict (empty when unreadable or gone)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def is_python(pid):
    try:
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False
    return exe.startswith("python")


def job_processes(job_id):
    """(pid, env) of every process tagged with this job id, launchers and ranks alike."""
    me = os.getpid()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        env = environ(int(name))
        if env.get("FLEET_JOB_ID") == job_id:
            out.append((int(name), env))
    return sorted(out, key=lambda p: p[0])


def frame(kind, data):
    sys.stdout.write(kind + " " + json.dumps(data) + "\n")
    sys.stdout.flush()


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


def main(argv):
    args = json.loads(argv[1])
    py_spy = args.get("py_spy") or shutil.which("py-spy")
    folder = os.path.join(os.path.expanduser(args["run_dir"]), "stacks")
    os.makedirs(folder, mode=0o700, exist_ok=True)
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
    frame("D", counts)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
