"""The slow-node watch of a detached job, in its monitor: the attached run's judge and verdict.

A detached job has no channel for the supervisors' ``W`` frames: each supervisor keeps its
latest pace report in the run folder (``pace.json``, with a sequence number) and the
``status`` the monitor polls anyway answers it. Each new report feeds the same judge
(``fleetctl.job.diagnose.pace``); a verdict lands as an attached run's does: ``slow`` in
job.json, an event, the health ledger, py-spy's samples of every rank taken in the
background (the poll never waits on them), and with ``--on-slow stop`` the job's end with the
node as its first failure, once the samples are in.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError, HealthLedgerError, one_line

if TYPE_CHECKING:
    from fleetctl.api.runspec import Supervision
    from fleetctl.job.diagnose.pace import SlowVerdict
    from fleetctl.job.monitor.decide import Decision
    from fleetctl.job.monitor.handle import JobHandle
    from fleetctl.job.monitor.supervisors import NodeReport


def remember_slow(host: str, job_id: str, line: str) -> str | None:
    """The slow node into the health ledger (source ``slow``): ``run --nodes N`` leaves it out
    next time. A ledger that cannot be written is a warning (returned), never the job's end."""
    from fleetctl.health.ledger import Ledger

    try:
        Ledger().record(
            host, source="slow", reason=f"slowed job {job_id}", evidence=line, job_id=job_id
        )
    except HealthLedgerError as e:
        return f"{host}: health ledger not written: {e}"
    return None


class MonitorPace:
    """Fed each poll's node reports; says the verdict's events and, with ``--on-slow stop``,
    gives the decision that ends the job."""

    def __init__(self, h: JobHandle, sup: Supervision, event: Callable[[str], None]) -> None:
        from fleetctl.job.diagnose.pace import judge_for

        nodes = {np.node_rank: np.host for np in h.plan.nodes}
        self.h, self.sup, self.event = h, sup, event
        self.judge = None
        if sup.on_slow != "off" and len(nodes) > 1:
            self.judge = judge_for(nodes, _roles(h), sup.slow_rounds)
        self.seen: dict[int, int] = {}  # node rank -> the last report's sequence number
        self.verdict: SlowVerdict | None = None
        self.sampler: threading.Thread | None = None
        self.samples: dict[str, Any] = {}
        self.done = False

    def poll(self, states: list[NodeReport]) -> Decision | None:
        """One poll's reports in; the stop decision once due, else None."""
        if self.judge is None or self.done:
            return None
        for st in states:
            pace = st.pace or {}
            seq = pace.get("seq")
            if not isinstance(seq, int) or not isinstance(pace.get("report"), dict):
                continue
            if self.seen.get(st.rank) == seq:
                continue
            self.seen[st.rank] = seq
            verdict = self.judge.add(st.rank, pace["report"])
            if verdict is not None:
                self._named(verdict)
        if self.sampler is None or self.sampler.is_alive():
            return None
        return self._evidence()

    def _named(self, verdict: SlowVerdict) -> None:
        from fleetctl.job.records.runs import _parse_iso
        from fleetctl.phases.stacks import SAMPLE_WINDOW, SAMPLES, sample_stacks

        verdict = verdict.at_launch(_parse_iso(self.h.job.started), time.time())
        self.verdict = verdict
        self._record(verdict)
        self.event(f"warning [{verdict.rank} {verdict.host}] {verdict.line()}")
        trouble = remember_slow(verdict.host, self.h.job_id, verdict.line())
        if trouble is not None:
            self.event(f"warning {trouble}")
        h = self.h

        def run() -> None:
            try:
                self.samples = {
                    "replies": sample_stacks(
                        h.fleet, h.plan, pythons=h.pythons(), samples=SAMPLES, window=SAMPLE_WINDOW
                    )
                }
            except Exception as e:  # the verdict stands without its stacks
                self.samples = {"error": one_line(e)}

        self.sampler = threading.Thread(target=run, daemon=True, name="slow-stacks")
        self.sampler.start()

    def _evidence(self) -> Decision | None:
        from fleetctl.job.diagnose.slowstacks import from_replies
        from fleetctl.job.monitor.decide import Decision

        self.done = True
        assert self.verdict is not None
        hosts = {np.node_rank: np.host for np in self.h.plan.nodes}
        stacks = from_replies(self.verdict.rank, hosts, self.samples)
        verdict = self.verdict = self.verdict.with_stacks(stacks)
        self._record(verdict)
        self.event(
            f"notice [{verdict.rank} {verdict.host}] py-spy: {stacks.phrase() or stacks.note}"
        )
        if self.sup.on_slow != "stop":
            return None
        return Decision(
            "fail",
            rank=verdict.rank,
            host=verdict.host,
            state="failed",
            reason=f"slow: {verdict.why}",
        )

    def _record(self, verdict: SlowVerdict) -> None:
        """``slow`` in job.json, as an attached run writes it."""
        h = self.h
        with contextlib.suppress(FleetctlError, OSError), h.folder.locked():
            job = h.folder.load_job()
            job.slow = verdict.to_dict()
            h.folder.write_job(job)
            h.job = job


def _roles(h: JobHandle) -> dict[int, str] | None:
    """A role job's node rank -> role, from its roles.json (None: not a role job)."""
    from fleetctl.job.records.runfolder import ROLES_FILE

    path = h.folder.path / ROLES_FILE
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        if path.is_file():
            return {int(t["rank"]): str(t["role"]) for t in json.loads(path.read_text())["tasks"]}
    return None
