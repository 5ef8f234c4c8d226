"""Node side of the slow-node watch: where each rank of the job on this node is, cheaply.

In a synchronous job every rank steps together, so step rates cannot tell which node is slow;
where the ranks spend their time can. A rank's main thread is either on a CPU, runnable and
waiting for one (a busy or throttled host), or asleep — in a collective's wait, mostly, once
the job trains. Every ``report`` s the sampler sends one ``W`` frame: per local rank the share
of the interval its main thread was running or waiting for a CPU (``busy``, from
``/proc/PID/schedstat``; without it, the share of ``tick``-s samples of its state that read
``R``), of that the share spent waiting for a CPU (``delay``), its CPU seconds per second
(``cpu``, all threads), and the share of its cpu cgroup's quota periods that were throttled
(``throttled``; null without a quota). The controller compares the nodes
(``fleetctl/job/pace.py``). A few small reads per rank per interval: far below 1% of a core.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import time

try:  # as fleetctl.remote.<module> (tests); flat in W/bin/<program>_<sha>/ on a node
    from .procfs import cgroup_paths, proc_cpu, proc_schedstat
except ImportError:
    from procfs import cgroup_paths, proc_cpu, proc_schedstat

TICK = 0.25  # s between state samples
REPORT = 2.0  # s between reports to the controller
HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
CGROUP_ROOT = "/sys/fs/cgroup"


def cpu_stat_file(pid: int, root: str = CGROUP_ROOT) -> str | None:
    """The cpu.stat of the cgroup that holds ``pid`` (cgroup v1's cpu controller, else v2)."""
    paths = cgroup_paths(pid)
    tries = []
    if "cpu" in paths:
        rel = paths["cpu"].lstrip("/")
        tries += [os.path.join(root, d, rel, "cpu.stat") for d in ("cpu", "cpu,cpuacct")]
    if "" in paths:
        tries.append(os.path.join(root, paths[""].lstrip("/"), "cpu.stat"))
    for path in tries:
        if os.path.isfile(path):
            return path
    return None


def throttle_counts(path: str | None) -> tuple[int, int] | None:
    """(nr_periods, nr_throttled) of a cpu.stat; None when unreadable."""
    if path is None:
        return None
    got = {}
    try:
        with open(path) as f:
            for ln in f:
                key, _, value = ln.partition(" ")
                if key in ("nr_periods", "nr_throttled"):
                    got[key] = int(value)
    except (OSError, ValueError):
        return None
    if len(got) < 2:
        return None
    return got["nr_periods"], got["nr_throttled"]


class PaceSampler:
    """Each rank's time split into running, waiting for a CPU and asleep, one report per
    interval: from the main thread's schedstat where the kernel keeps it (exact, one read per
    rank per report), else from its state at each tick.

    ``ranks``: a callable giving ``{local rank: pid}`` now (ranks start late and may restart)."""

    def __init__(self, ranks, clock=time.monotonic, cgroup_root: str = CGROUP_ROOT) -> None:
        self.ranks = ranks
        self.clock = clock
        self.cgroup_root = cgroup_root
        self.ticks: dict = {}  # local -> [running ticks, ticks] (no schedstat)
        self.start: dict = {}  # local -> (pid, cpu ticks, schedstat or None) at the start
        self.since = clock()
        self.throttle0: tuple | None = None

    def _begin(self, local: str, pid: int) -> bool:
        """Start counting a rank (new, or restarted as another pid); False when gone."""
        got = proc_cpu(pid)
        if got is None:
            return False
        self.start[local] = (pid, got[1], proc_schedstat(pid))
        return True

    def tick(self) -> None:
        for local, pid in self.ranks().items():
            if (local not in self.start or self.start[local][0] != pid) and not self._begin(
                local, pid
            ):
                continue
            if self.start[local][2] is not None:
                continue  # schedstat tells it exactly at the report
            got = proc_cpu(pid)
            if got is not None:
                count = self.ticks.setdefault(local, [0, 0])
                count[0] += got[0] == "R"
                count[1] += 1

    def report(self) -> dict | None:
        """The interval's report, and a new interval; None when no rank was seen in it."""
        now = self.clock()
        span = max(now - self.since, 1e-6)
        ranks = {}
        for local, (pid, cpu0, sched0) in list(self.start.items()):
            got, sched = proc_cpu(pid), proc_schedstat(pid)
            if got is None:
                del self.start[local]
                continue
            said = {"cpu": round(max(0, got[1] - cpu0) / HZ / span, 3)}
            if sched0 is not None and sched is not None:
                run = max(0, sched[0] - sched0[0]) / 1e9 / span
                delay = max(0, sched[1] - sched0[1]) / 1e9 / span
                said["busy"] = round(min(1.0, run + delay), 3)
                said["delay"] = round(min(1.0, delay), 3)
            elif self.ticks.get(local, [0, 0])[1]:
                busy, ticks = self.ticks[local]
                said["busy"] = round(busy / ticks, 3)
            else:
                continue
            ranks[str(local)] = said
            self.start[local] = (pid, got[1], sched)
        throttled = None
        pids = list(self.ranks().values())
        counts = throttle_counts(cpu_stat_file(pids[0], self.cgroup_root)) if pids else None
        if counts is not None and self.throttle0 is not None:
            periods = counts[0] - self.throttle0[0]
            if periods > 0:
                throttled = round(min(1.0, (counts[1] - self.throttle0[1]) / periods), 3)
        self.throttle0 = counts
        self.ticks, self.since = {}, now
        if not ranks:
            return None
        return {"span": round(span, 3), "ranks": ranks, "throttled": throttled}


def watch_pace(cfg: dict, ranks, send, done) -> None:
    """The sampler's thread: tick, and ``send(payload bytes)`` a report every interval, until
    ``done`` (a threading.Event) is set. ``cfg``: the spec's ``pace`` (``tick``, ``report``)."""
    tick = float(cfg.get("tick") or TICK)
    every = float(cfg.get("report") or REPORT)
    sampler = PaceSampler(ranks)
    due = time.monotonic() + every
    while not done.wait(tick):
        sampler.tick()
        if time.monotonic() >= due:
            due = time.monotonic() + every
            said = sampler.report()
            if said is not None:
                send(json.dumps(said, separators=(",", ":")).encode())
