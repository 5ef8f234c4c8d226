"""Process identity helpers: the lab kills only processes it can prove it started.

A PID alone is not an identity (PIDs get reused), so the lab records ``(pid, start time)`` and
re-checks both before sending any signal. Processes living in a lab network namespace are
identified by that namespace's inode, which no unrelated process can share.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable

from fleetctl.remote.kit.procfs import pids, proc_start_time, proc_stat


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot), or None when gone or a zombie."""
    return proc_start_time(pid)


def ppid_of(pid: int) -> int | None:
    st = proc_stat(pid)
    return st[1] if st is not None else None


def same_process(pid: int | None, started: int | None) -> bool:
    """True when ``pid`` still names the very process recorded with ``started``."""
    return bool(pid) and started is not None and start_time(pid) == started  # type: ignore[arg-type]


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (via /proc/PID/task/*/children, else a /proc scan)."""
    found: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(x) for x in f.read().split())
        return found
    except FileNotFoundError:
        pass
    except OSError:
        return []
    return [p for p in all_pids() if ppid_of(p) == pid]


def all_pids() -> list[int]:
    return pids()


def exe_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets process ``pid`` has open (empty when gone or unreadable)."""
    found: set[str] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[8:-1])
    return found


def pids_in_netns(ns_path: str) -> list[int]:
    """Every process whose network namespace is the one bound at ``ns_path``."""
    try:
        st = os.stat(ns_path)
    except OSError:
        return []
    key = (st.st_dev, st.st_ino)
    me = os.getpid()
    out = []
    for pid in all_pids():
        if pid == me:
            continue
        try:
            s = os.stat(f"/proc/{pid}/ns/net")
        except OSError:
            continue
        if (s.st_dev, s.st_ino) == key and start_time(pid) is not None:
            out.append(pid)
    return out


def kill(pid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_gone(pids: Iterable[tuple[int, int | None]], timeout: float) -> list[int]:
    """Wait until each (pid, start) is gone or a zombie; return those still alive at timeout."""
    pending = [(p, s) for p, s in pids if p]
    deadline = time.monotonic() + timeout
    while True:
        pending = [
            (p, s)
            for p, s in pending
            if (st := start_time(p)) is not None and (s is None or st == s)
        ]
        if not pending or time.monotonic() >= deadline:
            return [p for p, _ in pending]
        time.sleep(0.01)
