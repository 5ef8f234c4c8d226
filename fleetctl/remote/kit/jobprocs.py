"""A job's processes on this node: found by env tag, verified group or descent; stopped with
a grace period, then killed; the port claims the job holds; the child subreaper.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from .portclaims import existing_claims_folder
from .procfs import PF_KTHREAD, cmdline, environ_has, pids, proc_start_time, proc_stat_flags


def adopt_port_claims(job_id: str) -> list:
    """The port claims made for this job (by the controller's port probe) now name this
    supervisor, so they hold exactly as long as it lives; returns their paths. The folder is
    the one the probe claimed in (``portclaims``: the same rule on the same host)."""
    pid, mine, claims = os.getpid(), [], existing_claims_folder()
    if claims is None:
        return mine
    try:
        names = [n for n in os.listdir(claims) if n.isdigit()]
    except OSError:
        return mine
    for name in names:
        path = os.path.join(claims, name)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("job") != job_id:
                continue
            data.update(pid=pid, start=proc_start_time(pid))
            tmp = os.path.join(claims, f".{name}.{pid}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, path)
            mine.append(path)
        except (OSError, ValueError):
            continue
    return mine


def release_port_claims(paths: list, job_id: str) -> None:
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                if json.load(f).get("job") == job_id:
                    os.unlink(path)
        except (OSError, ValueError, AttributeError):
            continue


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the child subreaper (Linux >= 3.4): a descendant of the job that
    leaves its session, process group and environment (``setsid env -i …``) and loses its
    parent is re-parented here, not to init, so the sweep still finds it. False where the
    kernel or libc does not offer it (then only env tags and the group count)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def job_tags(job_id: str, rank: int | None) -> list[bytes]:
    tags = [b"FLEET_JOB_ID=" + job_id.encode()]
    if rank is not None:
        tags.append(b"FLEET_NODE_RANK=" + str(rank).encode())
    return tags


def find_job_processes(
    job_id: str,
    rank: int | None,
    pgid: int | None = None,
    leader_start: int | None = None,
    root: int | None = None,
) -> list[int]:
    """Live (non-zombie) processes of this job here: env-tagged, in its verified group, or
    descendants of ``root`` (the job's supervisor, its children's subreaper)."""
    return scan_job(job_id, rank, pgid, leader_start, root)[0]


def scan_job(
    job_id: str,
    rank: int | None,
    pgid: int | None,
    leader_start: int | None,
    root: int | None = None,
) -> tuple[list[int], bool]:
    """(live pids of the job, whether the recorded process group is still this job's).

    The recorded group counts only when it is still ours (its leader has the recorded start
    time, or a member carries the job's env tag): a recycled pgid never points at strangers.
    Every descendant of ``root`` is the job's whatever its session, group or environment.
    """
    me = os.getpid()
    tags = job_tags(job_id, rank)
    tagged: list[int] = []
    group: list[int] = []
    children: dict[int, list[int]] = {}
    group_ours = False
    for pid in pids():
        if pid == me:
            continue
        st = proc_stat_flags(pid)
        if st is None or st[4] & PF_KTHREAD:  # kernel threads (thousands on big hosts)
            continue
        if pgid is not None and pid == pgid and leader_start is not None and st[3] == leader_start:
            group_ours = True
        if st[0] in ("Z", "X"):
            continue
        children.setdefault(st[1], []).append(pid)
        has_tag = environ_has(pid, tags)
        if has_tag:
            tagged.append(pid)
        if pgid is not None and st[2] == pgid:
            group.append(pid)
            group_ours = group_ours or has_tag
    found = set(tagged)
    if group_ours:
        found.update(group)
    todo = list(children.get(root, [])) if root is not None else []
    while todo:  # descendants of the subreaper, at any depth
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(found), group_ours


def _signal_all(pids: list[int], pgid: int | None, group_ours: bool, sig: int) -> None:
    if pgid is not None and group_ours:
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def stop_processes(
    job_id: str,
    rank: int | None,
    pgid: int | None,
    leader_start: int | None,
    grace: float,
    reap: object = None,
    settle: float = 5.0,
    root: int | None = None,
) -> dict:
    """SIGTERM, wait ``grace``, SIGKILL, wait up to ``settle``: returns what was done and left.

    ``reap`` (a Popen) is polled while waiting so the supervisor's own child never lingers as a
    zombie that would keep its group alive.
    """

    def alive() -> tuple[list[int], bool]:
        if reap is not None:
            reap.poll()  # type: ignore[attr-defined]
        return scan_job(job_id, rank, pgid, leader_start, root)

    first, ours = alive()
    result: dict = {"found": first, "terminated": [], "killed": [], "remaining": []}
    if not first:
        return result
    _signal_all(first, pgid, ours, signal.SIGTERM)
    result["terminated"] = first
    deadline = time.monotonic() + max(0.0, grace)
    left, ours = alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left, ours = alive()
    if left:
        _signal_all(left, pgid, ours, signal.SIGKILL)
        result["killed"] = left
        deadline = time.monotonic() + settle
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left, ours = alive()
            if left:
                _signal_all(left, pgid, ours, signal.SIGKILL)
    result["remaining"] = [{"pid": p, "cmd": cmdline(p)} for p in left]
    return result
