"""The ``cpu-cap`` lab fault: one host's processes held to a share of one CPU through a cpu
cgroup of its own, as a noisy neighbour or a mis-set container limit holds a real node.

cgroup v1 (the ``cpu`` hierarchy at /sys/fs/cgroup/cpu): ``fleetctl-lab/<lab>-<host>`` with
``cpu.cfs_quota_us`` = percent × ``cpu.cfs_period_us`` / 100; cgroup v2: ``cpu.max``. Every
process of the host (those in its network namespace: PID 1, sshd, every session and job) is
moved in, and what they start later is born there. ``clear`` moves them back where PID 1 was
and removes the group; ``lab down`` removes what is left of the lab's groups (and their
shared parent once it is empty).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab import procs
from fleetctl.remote.kit.procfs import cgroup_paths

if TYPE_CHECKING:
    from fleetctl.lab.hosts import LabHost

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
MOVE_PASSES = 5  # scans of the host's processes: one forked mid-move is caught by the next


def _v1() -> Path | None:
    cpu = ROOT / "cpu"
    return cpu if (cpu / "cpu.cfs_quota_us").is_file() else None


def _v2() -> bool:
    with contextlib.suppress(OSError):
        return "cpu" in (ROOT / "cgroup.controllers").read_text().split()
    return False


def hierarchy() -> tuple[Path, str]:
    """The cpu hierarchy's root and which version; LabError without one."""
    v1 = _v1()
    if v1 is not None:
        return v1, "v1"
    if _v2():
        return ROOT, "v2"
    raise LabError("no cpu cgroup controller on this machine: the cpu-cap fault is unavailable")


def group_of(lab: str, host: str) -> Path:
    root, _ = hierarchy()
    return root / "fleetctl-lab" / f"{lab}-{host}"


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _move(pids: list[int], group: Path) -> None:
    for pid in pids:
        # gone meanwhile (ESRCH), or a kernel thread: nothing to hold
        with contextlib.suppress(ProcessLookupError, OSError):
            _write(group / "cgroup.procs", str(pid))


def _members(group: Path) -> list[int]:
    try:
        return [int(x) for x in (group / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def cap(lab: str, h: LabHost, percent: float) -> dict[str, object]:
    """Hold host ``h`` to ``percent`` of one CPU; returns the fault record."""
    if not 1 <= percent <= 100:
        raise LabInputError(f"cpu-cap: --percent must be within 1..100, got {percent:g}")
    init = h.init_pid
    if init is None:
        raise LabError(f"{h.name}: host is not running")
    _root, version = hierarchy()
    ctl = "cpu" if version == "v1" else ""
    back = cgroup_paths(init).get(ctl, "/")
    group = group_of(lab, h.name)
    for _ in range(3):  # another lab's ``down`` may remove the shared parent meanwhile
        with contextlib.suppress(FileNotFoundError):
            group.mkdir(parents=True, exist_ok=True)
            break
    quota = int(PERIOD_US * percent / 100)
    if version == "v1":
        _write(group / "cpu.cfs_period_us", str(PERIOD_US))
        _write(group / "cpu.cfs_quota_us", str(quota))
    else:
        _write(group / "cpu.max", f"{quota} {PERIOD_US}")
    inside = set()
    for _ in range(MOVE_PASSES):
        todo = [p for p in procs.pids_in_netns(f"/run/netns/{h.ns}") if p not in inside]
        if not todo:
            break
        _move(todo, group)
        inside = set(_members(group))
    return {"kind": "cpu_cap", "host": h.name, "percent": percent, "back": back}


def clear(lab: str, h: LabHost, back: str) -> None:
    """Undo :func:`cap`: every process back in ``back`` (PID 1's group before), group gone."""
    root, _ = hierarchy()
    group = group_of(lab, h.name)
    if not group.is_dir():
        return
    home = root / back.lstrip("/")
    for _ in range(MOVE_PASSES):
        left = _members(group)
        if not left:
            break
        _move(left, home)
    try:
        group.rmdir()
    except OSError as e:
        raise LabError(f"{h.name}: cpu cgroup {group} not removed: {e}") from e


def remove_all(lab: str) -> list[str]:
    """``lab down``: the lab's groups, emptied by then (its processes ended)."""
    try:
        root, _ = hierarchy()
    except LabError:
        return []
    removed = []
    parent = root / "fleetctl-lab"
    for group in sorted(parent.glob(f"{lab}-*")) if parent.is_dir() else ():
        with contextlib.suppress(OSError):
            group.rmdir()
            removed.append(f"cpu cgroup {group}")
    with contextlib.suppress(OSError):  # the shared parent, once no lab has a group in it
        parent.rmdir()
    return removed
