"""The one reader of /proc: the processes there, a process's stat fields, start time, exit
status, environment, executable and command line.

Node programs import it (``tests/remote/test_one_reader.py`` fails on a second parser), and so
do the controller's job monitor and the lab (their own machine's processes). Imports nothing
new: a node program's start pays only its compile. Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os

PF_KTHREAD = 0x00200000


def pids() -> list[int]:
    """Every process's pid, this one's included (a snapshot: any may be gone by its read)."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/PID/stat after ``(comm)``: ``[0]`` is field 3 (state)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'.
    return data[data.rfind(b")") + 2 :].split()


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, starttime) of a process, None when it is gone."""
    got = proc_stat_flags(pid)
    return None if got is None else got[:4]


def proc_stat_flags(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgid, starttime, flags): :func:`proc_stat` and the kernel's flags."""
    rest = _stat_fields(pid)
    if rest is None:
        return None
    try:
        return (
            rest[0].decode("ascii", "replace"),
            int(rest[1]),
            int(rest[2]),
            int(rest[19]),
            int(rest[6]),
        )
    except (IndexError, ValueError):
        return None


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot); None when gone or a zombie.

    With the pid it names one process for good: pids are reused, start times are not.
    """
    st = proc_stat(pid)
    return None if st is None or st[0] in ("Z", "X") else st[3]


def age(pid: int) -> float | None:
    """Seconds since ``pid`` started (its start time against /proc/uptime, both the kernel's
    clock since boot); None when it is gone or /proc cannot say."""
    start = proc_start_time(pid)
    if start is None:
        return None
    try:
        with open("/proc/uptime", "rb") as f:
            up = float(f.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return up - start / os.sysconf("SC_CLK_TCK")


def ended(pid: int) -> bool:
    """Whether ``pid`` has ended: gone, or a zombie nobody reaped yet."""
    st = proc_stat(pid)
    return st is None or st[0] in ("Z", "X")


def zombie_exit(pid: int) -> int | None:
    """A process that ended and waits for its parent to reap it: its exit code, or -signal
    (field 52, Linux >= 3.5). None while it runs, once reaped, or when the kernel does not say."""
    fields = _stat_fields(pid)
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else status >> 8


def pid_alive(pid: object, start: object) -> bool:
    """Whether ``pid`` is the live process that started at ``start`` (any, when None)."""
    if not isinstance(pid, int):
        return False
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (start is None or st[3] == start)


def environ_entries(pid: int) -> set[bytes] | None:
    """The ``NAME=value`` entries of a process's environment; None when unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return set(f.read().split(b"\0"))
    except OSError:
        return None


def environ(pid: int) -> dict[str, str]:
    """A process's environment as a dict (empty when unreadable or gone)."""
    out = {}
    for item in environ_entries(pid) or ():
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return out


def environ_has(pid: int, tags: list[bytes]) -> bool:
    """Whether a process's environment holds every one of ``tags`` exactly."""
    entries = environ_entries(pid)
    return entries is not None and all(t in entries for t in tags)


def exe_name(pid: int) -> str | None:
    """The file name of a process's executable; None when unreadable (not ours) or gone."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None


def cmdline(pid: int, limit: int = 200) -> str:
    """A process's command line, spaces for NULs, at most ``limit`` characters."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:limit]
    except OSError:
        return ""


def proc_cpu(pid: int) -> tuple[str, int] | None:
    """(state, utime + stime of the whole process in clock ticks); None when gone."""
    rest = _stat_fields(pid)
    if rest is None:
        return None
    try:
        return rest[0].decode("ascii", "replace"), int(rest[11]) + int(rest[12])
    except (IndexError, ValueError):
        return None


def cgroup_paths(pid: int) -> dict[str, str]:
    """A process's cgroups: controller -> path (v2's under ``""``); empty when unreadable."""
    out: dict[str, str] = {}
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for ln in lines:
        parts = ln.split(":", 2)
        if len(parts) == 3:
            for ctl in parts[1].split(","):
                out[ctl] = parts[2]
    return out


def proc_schedstat(pid: int) -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable waiting for one) of a process's main thread; None when gone
    or the kernel keeps no such account."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[0]), int(fields[1])
    except (OSError, IndexError, ValueError):
        return None
