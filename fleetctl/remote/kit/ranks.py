"""The job's ranks on this node: their processes, how they ended, their log files.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import os
import re

from .procfs import environ_entries, pids, proc_stat


def rank_processes(leader: int) -> list:
    """(local rank, pid) of the topmost process of each local rank under ``leader``."""
    children: dict = {}
    for pid in pids():
        st = proc_stat(pid)
        if st is not None and st[0] not in ("Z", "X"):
            children.setdefault(st[1], []).append(pid)
    out = []
    todo = [(leader, None)]
    while todo:  # depth first; a rank's own children (data loaders) share its LOCAL_RANK
        pid, parent_rank = todo.pop()
        local = _local_rank(pid)
        if local is not None and local != parent_rank:
            out.append((local, pid))
        todo.extend((c, local if local is not None else parent_rank) for c in children.get(pid, []))
    return sorted(out)


def all_ended(rank_pids: dict, exits: dict, expected: int) -> dict | None:
    """``{"ranks": n, "failed": k}`` once the newest process of every local rank seen (and of
    at least ``expected`` ranks: FLEET_NPROC_PER_NODE) has ended, by ``exits`` (pid -> its
    ``{"code"}``), else None. The job's work on the node is over then, whatever its launcher
    still does (torchrun's exit barrier waits up to 300 s for the other nodes). ``failed``
    counts the non-zero codes read; a code its launcher reaped first (None) is not known bad."""
    latest = [pids[-1] for pids in rank_pids.values() if pids]
    if not latest or len(latest) < expected or any(p not in exits for p in latest):
        return None
    failed = sum(exits[p].get("code") not in (0, None) for p in latest)
    return {"ranks": len(latest), "failed": failed}


def pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux >= 5.3; ``os.pidfd_open`` from Python 3.9, the raw syscall
    before): readable once the process ended. None where the kernel or the process says no."""
    opener = getattr(os, "pidfd_open", None)
    try:
        if opener is not None:
            return int(opener(pid))
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.syscall(434, pid, 0))  # pidfd_open: 434 on every architecture
        return fd if fd >= 0 else None
    except (OSError, AttributeError, ValueError):
        return None


def _local_rank(pid: int) -> int | None:
    entries = environ_entries(pid) or set()
    for key in (b"PADDLE_LOCAL_RANK=", b"LOCAL_RANK="):  # paddle's first: it may set both
        for e in entries:
            if e.startswith(key) and e[len(key) :].isdigit():
                return int(e[len(key) :])
    return None


def rank_log_files(root: str, rules: dict) -> list:
    """(path, number) of each rank output file under ``root`` so far, by the launcher's rules
    (the spec's ``rank_logs``, written by its module under ``fleetctl/plan/launchers/``):
    ``files``, regular expressions each matching a file's whole path relative to ``root``
    (``/``-separated), the first group the rank's number; ``deep``, search sub-folders too.
    Found in folder order, then rule order, then name order. No rules (an older spec): none."""
    rxs = []
    for pattern in rules.get("files") or ():
        with contextlib.suppress(re.error):
            rx = re.compile(str(pattern))
            if rx.groups:
                rxs.append(rx)
    if not rxs:
        return []
    if rules.get("deep"):
        folders = os.walk(root)
    else:
        try:
            folders = iter([(root, [], os.listdir(root))])
        except OSError:
            return []
    out = []
    for dirpath, _dirs, names in folders:
        rel = os.path.relpath(dirpath, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        for rx in rxs:
            for name in sorted(names):
                m = rx.fullmatch(prefix + name)
                if m and m.group(1).isdecimal():
                    out.append((os.path.join(dirpath, name), int(m.group(1))))
    return out
