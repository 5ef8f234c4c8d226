"""Node side of the slow-node watch's stack evidence: where each rank's main thread is, sampled.

When the controller's judge names a node slow (``fleetctl/job/diagnose/pace.py``) it runs this
once on every node of the job: ``python3 -c <this file> <json>`` (stdlib only, Python >= 3.8)
with ``job_id``, ``py_spy`` (a binary, or null: ``py-spy`` on PATH if any), ``samples`` (per
rank) and ``window`` (s: no new round of dumps starts after it). Each sample is one
``py-spy dump --nonblocking`` of a rank (the process is never paused) classified by
:func:`classify`; only the tallies travel back, one ``K <json>`` line per rank — ``pid``,
``rank``, ``wait``, ``idle``, ``compute``, ``unknown``, ``places`` ({collective: samples}),
``error`` — then ``D <json>`` with ``samples`` (all ranks) and ``error`` (e.g. no py-spy).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time

from ..kit.framing import frame
from .stacks import is_python, job_processes

DUMP_TIMEOUT = 10  # s for one dump
_THREAD = re.compile(
    r'^Thread (?:0x)?[0-9a-fA-F]+ \((?P<state>[a-z+]+)\)(?::\s*"(?P<name>[^"]*)")?'
)
_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^()]+):(?P<line>\d+)\)\s*$")
# the public collectives of torch.distributed (its wrappers and helpers are skipped)
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "send",
    "wait",
)


def main_thread(text):
    """(state, frames innermost first as (func, file)) of the dump's ``MainThread``; the first
    thread without one; None when the text holds no thread (a failed dump)."""
    got = None
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            if got is not None and (got[2] or m["name"] != "MainThread"):
                break
            got = (m["state"], [], m["name"] == "MainThread")
            continue
        f = _FRAME.match(line)
        if f and got is not None:
            got[1].append((f["func"], f["file"].replace("\\", "/")))
    return None if got is None else (got[0], got[1])


def classify(text):
    """(kind, place) of one dump: ``wait`` in a collective (``place``: ``all_reduce``, …),
    ``idle`` asleep elsewhere, ``compute`` running, ``unknown`` (no stack).

    A main thread anywhere inside ``torch/distributed`` (gloo's busy polling too) or in a
    ``synchronize``/``wait`` of torch (NCCL's stream sync) waits for its peers; one asleep
    inside autograd's ``backward`` waits there for DDP's gradient all-reduce (on CPU the
    engine runs on the main thread; the reducer blocks it on the bucket's collective)."""
    got = main_thread(text)
    if got is None or not got[1]:
        return "unknown", None
    state, frames = got
    for func, path in frames:
        name = func.rsplit(".", 1)[-1]
        if "torch/distributed/" in path and name in COLLECTIVES:
            return "wait", name
        torch = "/torch/" in "/" + path
        if (torch and name in ("synchronize", "wait")) or "nccl" in path.lower():
            return "wait", name
    if any("torch/distributed/" in path for _, path in frames):
        return "wait", "torch.distributed"
    asleep = state == "idle"
    if asleep and any("torch/autograd/" in path for _, path in frames):
        return "wait", "backward"
    return ("idle", None) if asleep else ("compute", None)


def dump(py_spy, pid):
    """The text of one non-blocking dump of ``pid``, or (None, why)."""
    try:
        res = subprocess.run(
            [py_spy, "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            timeout=DUMP_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, "py-spy: " + str(e)
    if res.returncode != 0:
        err = res.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, "py-spy exited {}: {}".format(res.returncode, err[-1] if err else "no output")
    return res.stdout.decode("utf-8", "replace"), None


def main(argv):
    args = json.loads(argv[1])
    py_spy = args.get("py_spy") or shutil.which("py-spy")
    if py_spy and not os.access(py_spy, os.X_OK):
        py_spy = None
    if not py_spy:
        frame("D", {"samples": 0, "error": "py-spy not available on this node"})
        return 0
    ranks = []
    for pid, env in job_processes(args["job_id"]):
        rank = env.get("RANK")
        if rank is not None and rank.isdigit() and is_python(pid):
            ranks.append((pid, int(rank)))
    tally = {
        pid: {"pid": pid, "rank": rank, "wait": 0, "idle": 0, "compute": 0, "unknown": 0}
        for pid, rank in ranks
    }
    places = {pid: {} for pid, _ in ranks}
    errors = {}
    end = time.monotonic() + float(args.get("window") or 5.0)
    for _ in range(int(args.get("samples") or 8)):
        for pid, _rank in ranks:
            text, error = dump(py_spy, pid)
            kind, place = classify(text) if text is not None else ("unknown", None)
            tally[pid][kind] += 1
            if place is not None:
                places[pid][place] = places[pid].get(place, 0) + 1
            if error:
                errors[pid] = error
        if time.monotonic() > end:
            break
    total = 0
    for pid, _rank in ranks:
        row = tally[pid]
        taken = row["wait"] + row["idle"] + row["compute"]
        total += taken
        # a non-blocking read that raced the rank (``Bad address``) is one ``unknown`` sample;
        # only a rank no dump could read says why
        frame("K", dict(row, places=places[pid], error=None if taken else errors.get(pid)))
    frame("D", {"samples": total, "error": None if ranks else "no rank process of the job"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
