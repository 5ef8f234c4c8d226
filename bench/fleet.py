"""Measurement 8: a fleet of 64 and 128 lab hosts — the check, a cut link, a no-op run.

Each size gets a lab of its own (two networks: SSH on one, the mesh on the data network, the
lab's minimal shell rc files), so the rows show what this controller does at that size:

* ``fleetctl check`` of a healthy lab: must pass (a sample that fails is a failure, not a
  number); the mesh strategy ``auto`` picks (sparse past 32 hosts) is in the notes;
* the same check with one host's data link cut: must fail and name that host, alone;
* ``fleetctl run`` of a no-op job (check included), after one untimed run so the push is a
  no-op, split by phase from job.json's ``phases`` — wall time per phase and the controller's
  CPU per node per phase (its own threads; ssh/rsync children apart).

Every lab host shares this machine's two cores with the controller: at 128 hosts remote work
(sshd, a shell per command, the node probe) costs about N times what it would on real hosts, so
the wall times are an upper bound and the controller CPU is the number to watch.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from common import Result, SampleFailed, fleetctl_argv, repeat, run_timed, tail
from phases import NOOP_SCRIPT, PhaseBench, parse_iso

SIZES = (64, 128)
QUICK_SIZES = (4,)
# job.json phase names (their first word) → the column a phase's time is booked under
PHASES = ("connecting", "checking", "pushing", "launching", "collecting", "done:")
COLUMNS = ("connect", "check", "push", "launch→exit", "collect")


class FleetBench:
    """Brings up one lab per size, measures it, takes it down (``finally``)."""

    def __init__(self, work: Path, *, quick: bool) -> None:
        self.work, self.quick = work, quick
        self.fl = fleetctl_argv()

    def run(self, sizes: tuple[int, ...], repeats: int) -> list[Result]:
        from fleetctl.lab import Lab

        out: list[Result] = []
        for n in sizes:
            t0 = time.perf_counter()
            lab = Lab.up(n, networks=2)
            up = time.perf_counter() - t0
            try:
                self.lab = lab
                bench = PhaseBench(lab, self.work / f"fleet{n}", quick=self.quick)
                bench.work.mkdir(parents=True, exist_ok=True)
                rows = [
                    self.check(bench, n, repeats),
                    self.cut_link(bench, lab, n, repeats),
                    self.pipeline(bench, n, repeats),
                ]
                for r in rows:
                    r.note = f"lab up {up:.0f} s; {r.note}" if r.note else f"lab up {up:.0f} s"
                out.extend(rows)
            finally:
                lab.down()
        return out

    def _check(self, bench: PhaseBench, n: int) -> tuple[float, Any]:
        inv = bench.inventory(n, "/root/.fleetctl/bench-fleet")
        argv = [*self.fl, "check", "-i", inv, "--json", "--recheck"]  # never a cached pass
        t = run_timed(argv, env=bench.env, timeout=600)
        try:
            report = json.loads(t.proc.stdout)
        except ValueError as e:
            raise SampleFailed(f"exit {t.proc.returncode}, no JSON: {tail(t.proc.stderr)}") from e
        return t.seconds, (t, report)

    def check(self, bench: PhaseBench, n: int, repeats: int) -> Result:
        row = Result("fleet", "fleetctl check (healthy lab)", n)
        seen: dict[str, Any] = {}

        def once() -> tuple[float, dict[str, Any]]:
            r0 = remote_cpu(self.lab)
            seconds, (t, report) = self._check(bench, n)
            if t.proc.returncode != 0:
                raise SampleFailed(f"exit {t.proc.returncode}: {_failures(report)}")
            seen["mesh"] = _mesh_note(report)
            return seconds, {
                "controller CPU s": t.cpu,
                "CPU ms per node": 1000 * t.cpu / n,
                "remote CPU ms per node": 1000 * (remote_cpu(self.lab) - r0) / n,
            }

        repeat(row, repeats, once)
        row.note = seen.get("mesh", "")
        return row

    def cut_link(self, bench: PhaseBench, lab: Any, n: int, repeats: int) -> Result:
        victim = lab.hosts[n // 2].name
        row = Result("fleet", f"fleetctl check, one data link cut ({victim})", n)

        def once() -> tuple[float, dict[str, Any]]:
            seconds, (t, report) = self._check(bench, n)
            if t.proc.returncode == 0:
                raise SampleFailed("the check passed with a data link cut")
            blamed = _blamed(report)
            if blamed != [victim]:
                who = ", ".join(blamed[:6]) + (f" and {len(blamed) - 6} more" if blamed[6:] else "")
                raise SampleFailed(f"blamed {who or 'nobody'}, not {victim} alone")
            return seconds, {"controller CPU s": t.cpu, "CPU ms per node": 1000 * t.cpu / n}

        lab.cut_link(victim, "data")
        try:
            repeat(row, repeats, once)
        finally:
            lab.heal_link(victim, "data")
        row.note = f"must fail naming {victim} alone"
        return row

    def pipeline(self, bench: PhaseBench, n: int, repeats: int) -> Result:
        row = Result("fleet", "fleetctl run no-op job (check + no-op push + launch + collect)", n)
        bench.run_job(n, NOOP_SCRIPT, [], name="fleet", timeout=600)  # the push is a no-op after

        samples = iter(range(1_000_000))

        def once() -> tuple[float, dict[str, Any]]:
            # a cache of its own per sample: the run's check really runs (a passing check is
            # reused for 120 s otherwise, and the phase would time the cache)
            bench.env["FLEETCTL_CACHE_DIR"] = str(bench.work / f"cache-{next(samples)}")
            r0 = remote_cpu(self.lab)
            r = bench.run_job(n, NOOP_SCRIPT, [], name="fleet", timeout=600)
            if r["rc"] != 0:
                raise SampleFailed(f"exit {r['rc']}: {r['why']}")
            phases = r["job"].phases
            return r["wall"], {
                **split_phases(phases, n),
                "controller CPU s (with children)": r["cpu"],
                "remote CPU ms per node": 1000 * (remote_cpu(self.lab) - r0) / n,
            }

        repeat(row, repeats, once)
        row.note = (
            "per phase from job.json: wall s and controller CPU ms per node (its own threads); "
            "launch→exit: launch until the last node exited; collect: teardown check + logs"
        )
        return row


def remote_cpu(lab: Any) -> float:
    """CPU seconds the lab hosts' processes used so far, ended ones included: each host's init
    reaps its orphans (the detached node supervisors and their jobs) and its sshd listener its
    sessions, so their children's times hold everything that ended; their own times are added.
    What a real host would spend of its own CPU: the no-op run's remote side, per node."""
    time.sleep(0.5)  # sessions the controller just closed: reaped by their sshd listener
    tck = os.sysconf("SC_CLK_TCK")
    total = 0
    for h in lab.hosts:
        for pid in {h.init_pid, lab.sshd_pid(h.name)} - {None}:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            fields = data[data.rfind(b")") + 2 :].split()
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / tck


def split_phases(phases: list[dict[str, Any]], n: int) -> dict[str, float]:
    """job.json ``phases`` → wall seconds and controller CPU ms per node, per column."""
    marks = {}
    for p in phases:
        first = str(p.get("phase", "")).split(" ")[0]
        if first in PHASES and first not in marks:
            marks[first] = (parse_iso(p["at"]), float(p["cpu"]))
    missing = [p for p in PHASES if p not in marks]
    if missing:
        raise SampleFailed(f"job.json phases lack {missing}")
    out: dict[str, float] = {}
    for col, a, b in zip(COLUMNS, PHASES[:-1], PHASES[1:], strict=True):
        out[f"{col} s"] = marks[b][0] - marks[a][0]
        out[f"{col} CPU ms/node"] = 1000 * (marks[b][1] - marks[a][1]) / n
    return out


def _failures(report: Any) -> str:
    """``host: check: detail`` of every failed cell, shortened."""
    bad = [
        f"{h.get('host')}: {name}: {cell.get('detail')}"
        for h in _hosts(report)
        for name, cell in (h.get("checks") or {}).items()
        if isinstance(cell, dict) and cell.get("status") == "fail"
    ]
    more = f" (and {len(bad) - 4} more)" if len(bad) > 4 else ""
    return "; ".join(bad[:4]) + more


def _hosts(report: Any) -> list[dict[str, Any]]:
    hosts = report.get("hosts") if isinstance(report, dict) else None
    return [h for h in hosts or [] if isinstance(h, dict)]


def _mesh(report: Any) -> dict[str, dict[str, Any]]:
    """Each host's mesh cell: {"status": …, "detail": …}."""
    return {str(h.get("host")): (h.get("checks") or {}).get("mesh") or {} for h in _hosts(report)}


def _blamed(report: Any) -> list[str]:
    """The hosts whose mesh cell failed: the check's verdict on who is cut off."""
    return sorted(h for h, cell in _mesh(report).items() if cell.get("status") == "fail")


def _mesh_note(report: Any) -> str:
    """How many peers each host tested (the mesh strategy shows in it: N-1 is the full mesh)."""
    counts = []
    for cell in _mesh(report).values():
        m = re.match(r"(\d+)/(\d+) peers", str(cell.get("detail", "")))
        if m:
            counts.append(int(m.group(2)))
    if not counts:
        return "no mesh result in the report"
    return f"mesh: {sum(counts)} directed pairs tested, {min(counts)}–{max(counts)} peers a host"
