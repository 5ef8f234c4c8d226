"""Node side of the slow-node watch (``fleetctl/job/diagnose/pace.py`` judges): where this node's
ranks spend their time. Every ``report`` s one ``W`` frame: per local rank the share of the interval
its main thread ran or waited for a CPU (``busy``; asleep is waiting, in a collective mostly),
of it the share waiting for a CPU (``delay``), from /proc/PID/schedstat; its CPU seconds per
second (``cpu``); and the share of its cpu cgroup's quota periods throttled (``throttled``,
null without a quota). A few small reads per rank per report. Stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import time

from .atomic import read_json, write_json
from .procfs import cgroup_paths, proc_cpu, proc_schedstat

REPORT = 2.0  # s between reports
HZ = os.sysconf("SC_CLK_TCK")


def throttle_counts(pid: int, root: str) -> tuple | None:
    """(nr_periods, nr_throttled) of the cpu cgroup holding ``pid`` (v1, else v2)."""
    paths, got = cgroup_paths(pid), {}
    rels = [("cpu", paths["cpu"])] if "cpu" in paths else []
    rels += [("", paths[""])] if "" in paths else []
    for sub, rel in rels:
        try:
            with open(os.path.join(root, sub, rel.lstrip("/"), "cpu.stat")) as f:
                got = dict(ln.split() for ln in f if ln.startswith("nr_"))
            return int(got["nr_periods"]), int(got["nr_throttled"])
        except (OSError, ValueError, KeyError):
            continue
    return None


class PaceSampler:
    """One report per call of :meth:`report` on the interval since the last one.
    ``ranks``: a callable giving ``{local rank: pid}`` now (ranks start late, may restart)."""

    def __init__(self, ranks, clock=time.monotonic, cgroup_root: str = "/sys/fs/cgroup"):
        self.ranks, self.clock, self.root = ranks, clock, cgroup_root
        self.last: dict = {}  # local -> (pid, when, cpu ticks, schedstat)
        self.throttle0 = None

    def report(self) -> dict | None:
        """The interval's report; None when no rank was seen in it (or first seen now)."""
        now, ranks = self.clock(), {}
        pids = self.ranks()
        for local, pid in pids.items():
            got, sched = proc_cpu(pid), proc_schedstat(pid)
            if got is None or sched is None:
                continue
            was = self.last.get(local)
            self.last[local] = (pid, now, got[1], sched)
            if was is None or was[0] != pid:
                continue
            span = max(now - was[1], 1e-6)
            run, delay = ((sched[i] - was[3][i]) / 1e9 / span for i in (0, 1))
            ranks[str(local)] = {
                "busy": round(min(1.0, run + delay), 3),
                "delay": round(min(1.0, delay), 3),
                "cpu": round((got[1] - was[2]) / HZ / span, 3),
            }
        counts = throttle_counts(next(iter(pids.values())), self.root) if pids else None
        throttled, was = None, self.throttle0
        if counts is not None and was is not None and counts[0] > was[0]:
            throttled = round(min(1.0, (counts[1] - was[1]) / (counts[0] - was[0])), 3)
        self.throttle0 = counts
        return {"ranks": ranks, "throttled": throttled} if ranks else None


def watch_pace(cfg: dict, ranks, send, done, tally=None) -> None:
    """The sampler's thread: ``send(payload)`` a report every ``cfg['report']`` s until
    ``done`` (a threading.Event) is set. ``tally`` (a detached job's ``progress.Tally``): its
    counts go with each report as ``progress``."""
    sampler = PaceSampler(ranks)
    sampler.report()
    while not done.wait(float(cfg.get("report") or REPORT)):
        said = sampler.report()
        counts = tally.report() if tally is not None else None
        if counts:
            said = said or {"ranks": {}, "throttled": None}
            said["progress"] = counts
        if said is not None:
            send(json.dumps(said, separators=(",", ":")).encode())


def pace_file(run_dir: str):
    """``send`` when detached: the latest report, numbered, in pace.json (``status``)."""
    path = os.path.join(run_dir, "pace.json")
    seq = [int(read_json(path).get("seq") or 0)]

    def send(said: bytes) -> None:
        seq[0] += 1
        write_json(path, {"seq": seq[0], "report": json.loads(said)})

    return send
