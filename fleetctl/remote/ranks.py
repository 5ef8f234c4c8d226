"""The job's ranks on this node: their processes, how they ended, their log files.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import os

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


def rank_log_files(root: str, layout: str) -> list:
    """(path, rank) of each local rank's output file the launcher made so far: torchrun
    ``<dir>/<run>/attempt_K/<local>/{stdout,stderr}.log``, paddle ``<dir>/workerlog.<local>``
    (local ranks), deepspeed ``<dir>/<time>_rank<G>.log`` (global ranks)."""
    out = []
    if layout == "deepspeed":
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(root)):
                stem, _, rank = name[: -len(".log")].rpartition("_rank")
                if stem and name.endswith(".log") and rank.isdigit():
                    out.append((os.path.join(root, name), int(rank)))
        return out
    if layout == "paddle":
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(root)):
                local = name[len("workerlog.") :]
                if name.startswith("workerlog.") and local.isdigit():
                    out.append((os.path.join(root, name), int(local)))
        return out
    for dirpath, _dirs, _names in os.walk(root):
        local = os.path.basename(dirpath)
        if not local.isdigit():
            continue
        for name in ("stdout.log", "stderr.log"):
            path = os.path.join(dirpath, name)
            if os.path.exists(path):
                out.append((path, int(local)))
    return out
