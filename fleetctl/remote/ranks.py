"""The job's ranks on this node: their processes, how they ended, their log files.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import os
import re

try:  # as fleetctl.remote.<module> (tests); flat in W/bin/<program>_<sha>/ on a node
    from .procfs import proc_stat
except ImportError:
    from procfs import proc_stat


def rank_processes(leader: int) -> list:
    """(local rank, pid) of the topmost process of each local rank under ``leader``."""
    children: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st[0] not in ("Z", "X"):
                children.setdefault(st[1], []).append(int(name))
    out = []
    todo = [(leader, None)]
    while todo:  # depth first; a rank's own children (data loaders) share its LOCAL_RANK
        pid, parent_rank = todo.pop()
        local = _local_rank(pid)
        if local is not None and local != parent_rank:
            out.append((local, pid))
        todo.extend((c, local if local is not None else parent_rank) for c in children.get(pid, []))
    return sorted(out)


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


def zombie_exit(pid: int) -> int | None:
    """A process that ended and waits for its parent to reap it: its exit code, or -signal
    (``/proc/PID/stat`` field 52, Linux >= 3.5). None while it runs, once reaped, or when
    the kernel does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else status >> 8


def _local_rank(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    for e in entries:
        for key in (b"PADDLE_LOCAL_RANK=", b"LOCAL_RANK="):
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
