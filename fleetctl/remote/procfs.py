"""The one reader of /proc: a process's stat fields, start time, environment and command line.

Node programs import it, and so do the controller's job monitor and the lab (their own
machine's processes). Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

PF_KTHREAD = 0x00200000


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, starttime) of a process, None when it is gone."""
    got = proc_stat_flags(pid)
    return None if got is None else got[:4]


def proc_stat_flags(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgid, starttime, flags): :func:`proc_stat` and the kernel's flags."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[1]), int(rest[2]), int(rest[19]), int(rest[6])
    except (IndexError, ValueError):
        return None


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot); None when gone or a zombie.

    With the pid it names one process for good: pids are reused, start times are not.
    """
    st = proc_stat(pid)
    return None if st is None or st[0] in ("Z", "X") else st[3]


def environ_entries(pid: int) -> set[bytes] | None:
    """The ``NAME=value`` entries of a process's environment; None when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return set(f.read().split(b"\0"))
    except OSError:
        return None


def environ_has(pid: int, tags: list[bytes]) -> bool:
    """Whether a process's environment holds every one of ``tags`` exactly."""
    entries = environ_entries(pid)
    return entries is not None and all(t in entries for t in tags)


def cmdline(pid: int, limit: int = 200) -> str:
    """A process's command line, spaces for NULs, at most ``limit`` characters."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:limit]
    except OSError:
        return ""
