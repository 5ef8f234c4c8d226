"""The supervisor's spec (one JSON line on stdin) and the job's work folder it names.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import time

from .atomic import durable, fsync_path
from .records import SupervisorSpec


def read_spec(fd: int, timeout: float) -> tuple[SupervisorSpec, bytes]:
    """The JSON spec line from stdin; returns (spec, bytes read past it). A spec of the wrong
    shape is a ``RecordError`` (a ValueError) naming the key."""
    import select

    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError(f"no spec within {timeout:g}s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise ValueError("stdin closed before the spec")
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    return SupervisorSpec.from_dict(json.loads(line.decode("utf-8"))), rest


def seed_work_folder(cwd: str | None, seed: str | None) -> None:
    """The job's work folder (its cwd, shared by every attempt of the job) starts as a copy
    of the code snapshot: relative paths resolve as in the user's checkout, and what the job
    writes there (checkpoints, downloaded data) stays the job's own, never the snapshot's
    (which other jobs share), and survives a retry. Made once, under a temporary name and
    renamed: nodes sharing one home race safely, the loser drops its copy. Flushed to disk
    before the rename: a reset must not leave a work folder of empty scripts that the next
    attempt runs (issue 39)."""
    if not cwd or not seed:
        return
    work = os.path.abspath(os.path.expanduser(cwd))
    if os.path.isdir(work):
        return
    import shutil  # here: only the first attempt of a job copies

    src = os.path.abspath(os.path.expanduser(seed))
    parent = os.path.dirname(work)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    # a name of its own: pids repeat across the nodes of a shared home
    tmp = os.path.join(parent, f".tmp-{os.path.basename(work)}-{os.getpid()}-{os.urandom(4).hex()}")
    shutil.copytree(src, tmp, symlinks=True)
    os.chmod(tmp, 0o700)
    durable(tmp, linked=False)  # the folder is the mark that it was seeded: no empty copies
    try:
        os.rename(tmp, work)
    except OSError:  # another node of a shared home made it first: theirs is the same copy
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(work):
            raise
    fsync_path(parent)
