"""The slow-node watch of a detached job, in its monitor: the attached run's judge and verdict.

A detached job has no channel for the supervisors' ``W`` frames: each supervisor keeps its
latest pace report in the run folder (``pace.json``, with a sequence number) and the
``status`` the monitor polls anyway answers it. Each new report feeds the same judge
(``fleetctl.job.diagnose.pace``); a verdict lands as an attached run's does: ``slow`` in
job.json, an event, the health ledger, py-spy's samples of every rank taken in the
background (the poll never waits on them), and with ``--on-slow stop`` the job's end with the
node as its first failure, once the samples are in.

The progress-rate judge (``fleetctl.job.diagnose.progress_rate``) runs here too: nobody reads
a detached job's lines as they come, so each supervisor counts its ranks' progress markers
itself (``fleetctl.remote.kit.progress.Tally``) and its pace report carries the counts, each
with the node's time of the line that said it; ``status`` adds the node's clock, so the
monitor places each count in its own clock (no skew between the hosts). A verdict of either
judge lands only if the other suspects no other node, as in an attached run.
"""

from __future__ import annotations

import contextlib
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

_ENDED = ("exited", "stopped", "lost", "absent")  # a node's states once its part is over


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
        self.judge = self.progress = None
        if sup.on_slow != "off" and len(nodes) > 1:
            from fleetctl.job.diagnose.progress_rate import progress_judge

            roles = _roles(h)
            self.judge = judge_for(nodes, roles, sup.slow_rounds)
            self.progress = progress_judge(nodes, roles, sup.slow_rounds)
        self.seen: dict[int, int] = {}  # node rank -> the last report's sequence number
        self.verdict: SlowVerdict | None = None
        self.sampler: threading.Thread | None = None
        self.samples: dict[str, Any] = {}
        self.done = False

    def poll(self, states: list[NodeReport], at: float | None = None) -> Decision | None:
        """One poll's reports in (``at``: when they came, ``time.monotonic()``); the stop
        decision once due, else None."""
        if self.judge is None or self.progress is None or self.done:
            return None
        at = time.monotonic() if at is None else at
        for st in states:
            if st.state in _ENDED or st.ranks_ended:  # its silence from now is no slowness
                self.progress.end(st.rank)
            pace = st.pace or {}
            seq = pace.get("seq")
            if not isinstance(seq, int) or not isinstance(pace.get("report"), dict):
                continue
            if self.seen.get(st.rank) == seq:
                continue
            self.seen[st.rank] = seq
            self.progress.counts(st.rank, placed(pace, at))
            if self.verdict is None:
                self._judged(self.judge.add(st.rank, pace["report"]), self.judge, self.progress)
        if self.verdict is None:
            self._judged(self.progress.tick(at), self.progress, self.judge)
        if self.verdict is not None and self.verdict.progress is not None and not self.done:
            return self._stop()  # named by its progress: the figures are the evidence
        if self.sampler is None or self.sampler.is_alive():
            return None
        return self._evidence()

    def _judged(self, verdict: SlowVerdict | None, judge: Any, other: Any) -> None:
        """A judge's verdict lands unless the other judge suspects another node in its window
        (then nobody is named and both judge on: ``job/run/context.py: _judged``)."""
        if verdict is None:
            return
        if other.suspects() - {verdict.rank}:
            judge.withdraw()
            return
        self._named(verdict)

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
        if verdict.progress is not None:  # its peers wait for nobody: no py-spy to ask
            return
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

        assert self.verdict is not None
        hosts = {np.node_rank: np.host for np in self.h.plan.nodes}
        stacks = from_replies(self.verdict.rank, hosts, self.samples)
        verdict = self.verdict = self.verdict.with_stacks(stacks)
        self._record(verdict)
        self.event(
            f"notice [{verdict.rank} {verdict.host}] py-spy: {stacks.phrase() or stacks.note}"
        )
        return self._stop()

    def _stop(self) -> Decision | None:
        """With ``--on-slow stop``, the decision that ends the job, the node its first failure."""
        from fleetctl.job.monitor.decide import Decision

        self.done = True
        verdict = self.verdict
        assert verdict is not None
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
    """A role job's node rank -> role, from its roles.json (None: not a role job, or the file
    is unreadable: the slow node is then named without its role)."""
    from fleetctl.errors import RunFolderError
    from fleetctl.job.records.files import RolesRecord

    try:
        record = h.folder.find_record(RolesRecord)
    except RunFolderError:
        return None
    return None if record is None else {t.rank: t.role for t in record.tasks}


def placed(pace: dict[str, Any], at: float) -> list[tuple[str, str, float, float]]:
    """A node's progress counts (its pace report's ``progress``: ``[source, shape, time,
    count]``, the time by the node's clock) placed in the monitor's (``at``: when ``status``
    answered, whose ``now`` is the node's clock then). Malformed entries are passed over."""
    rows, now = pace["report"].get("progress"), pace.get("now")
    if not isinstance(rows, list) or not isinstance(now, (int, float)):
        return []
    out = []
    for row in rows:
        if not (isinstance(row, list) and len(row) == 4):
            continue
        src, kind, t, count = row
        if isinstance(src, str) and isinstance(kind, str) and _number(t) and _number(count):
            out.append((src, kind, at - (float(now) - float(t)), float(count)))
    return out


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
