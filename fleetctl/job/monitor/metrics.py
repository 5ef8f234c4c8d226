"""What a run's metrics are made of, kept as the run goes: the job's observer.

The job core tells its observer (:class:`JobObserver`) what happens — an attempt begins, an
event (phase, a node started, lines, an exit, a loss), the collective benchmark's figures —
and :class:`JobMetrics` keeps it as one :class:`JobSample`, copied out whole for each scrape
(:meth:`JobMetrics.sample`). Turning a sample into Prometheus text is
``fleetctl.job.monitor.exposition`` (the only module that imports ``prometheus_client``, and only
when ``--metrics-addr``/``--metrics-textfile`` ask for it); a run without them has no observer.

The slow-node score comes from outside the job core: whoever judges slow nodes calls
:meth:`JobObserver.slow_scores` (host → score) on the job's observer (``JobContext.observer``,
None without metrics); until then every node's score is 0.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fleetctl.job.records.result import JobEvent, NodeOutcome


class JobObserver(Protocol):
    """What the job core reports to whoever watches a run from outside (metrics)."""

    def attempt(self, job_id: str, attempt: int, hosts: Sequence[str], nproc: int) -> None:
        """A new attempt (its own job id and nodes) begins; ``nproc``: ranks per node (0:
        not known yet)."""

    def event(self, ev: JobEvent, nodes: Sequence[NodeOutcome], status: str) -> None:
        """A job event, with every node's outcome and the job's status after it."""

    def collective(self, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        """The collective benchmark's per-host figures (``CollectiveReport.nodes``)."""

    def slow_scores(self, scores: Mapping[str, float]) -> None:
        """The slow-node watcher's scores by host (higher: slower): its hook into the
        metrics (``job.observer.slow_scores(...)`` where ``job.observer`` is not None)."""


@dataclass
class NodeSample:
    """One node as the metrics show it."""

    host: str
    node_rank: int
    state: str = "pending"
    lines: int = 0  # output lines streamed from it
    bytes: int = 0  # their bytes (UTF-8, newline included)
    last_line: float | None = None  # wall clock of its last line
    busbw: float | None = None  # GB/s: the last collective benchmark's figure for the host
    slow_score: float = 0.0  # the slow-node watcher's score (0 until it reports)
    exit_code: int | None = None


@dataclass
class JobSample:
    """The whole run at one moment: what one scrape renders."""

    job_id: str = ""
    attempt: int = 0
    max_attempts: int = 1
    phase: str = "starting"
    status: str = "starting"
    started: float | None = None  # wall clock: the run began
    last_progress: float | None = None  # wall clock: the last line or progress touch
    nproc: int = 0  # ranks per node (0: not known yet)
    nodes: list[NodeSample] = field(default_factory=list)
    now: float = 0.0  # when the sample was taken

    @property
    def ranks_alive(self) -> int:
        return sum(self.nproc or 1 for n in self.nodes if n.state == "running")

    def count(self, state: str) -> int:
        return sum(1 for n in self.nodes if n.state == state)


class JobMetrics:
    """The observer behind ``--metrics-addr``: the run's sample, safe to read from the HTTP
    server's thread while the job's threads write it."""

    def __init__(self, *, max_attempts: int = 1, clock: Any = time.time) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._s = JobSample(max_attempts=max_attempts, started=clock())
        self._scores: dict[str, float] = {}

    # -- the observer
    def attempt(self, job_id: str, attempt: int, hosts: Sequence[str], nproc: int) -> None:
        with self._lock:
            s = self._s
            s.job_id, s.attempt, s.nproc = job_id, attempt, nproc
            s.phase, s.status = "starting", "starting"
            busbw = {n.host: n.busbw for n in s.nodes}
            s.nodes = [
                NodeSample(h, i, busbw=busbw.get(h), slow_score=self._scores.get(h, 0.0))
                for i, h in enumerate(hosts)
            ]

    def event(self, ev: JobEvent, nodes: Sequence[NodeOutcome], status: str) -> None:
        with self._lock:
            s = self._s
            s.status = str(status)
            if ev.kind == "phase" and ev.phase is not None:  # its JobPhase: the label
                s.phase = str(ev.phase)
            elif ev.kind == "done":
                s.phase = "done"
            elif ev.kind == "teardown" and s.phase != "done":
                s.phase = "teardown"
            if ev.kind == "lines" and ev.rank is not None and ev.rank < len(s.nodes):
                n = s.nodes[ev.rank]
                n.lines += len(ev.lines)
                n.bytes += sum(len(x.encode("utf-8", "surrogateescape")) + 1 for x in ev.lines)
                n.last_line = s.last_progress = ev.time
                return
            if ev.kind == "progress":
                s.last_progress = ev.time
                return
            for o in nodes:  # a node started, ended, was lost: states as the job sees them
                if o.rank < len(s.nodes):
                    s.nodes[o.rank].state = str(o.state)
                    s.nodes[o.rank].exit_code = o.exit_code

    def collective(self, nodes: Mapping[str, Mapping[str, Any]]) -> None:
        with self._lock:
            for n in self._s.nodes:
                bw = (nodes.get(n.host) or {}).get("busbw")
                n.busbw = float(bw) if isinstance(bw, (int, float)) else None

    # -- the detached job's monitor, which polls instead of streaming
    def polled(
        self, states: Mapping[int, str], *, phase: str, status: str, progress: float | None
    ) -> None:
        """The node states one monitor poll found (rank → a ``NodeState`` value; ranks not
        named keep theirs), the phase, the status and when any node last made progress."""
        with self._lock:
            s = self._s
            s.phase, s.status = phase, status
            if progress is not None:
                s.last_progress = progress
            for rank, state in states.items():
                if rank < len(s.nodes):
                    s.nodes[rank].state = state

    # -- from outside the job core
    def slow_scores(self, scores: Mapping[str, float]) -> None:
        """The slow-node watcher's scores by host (higher: slower); hosts not named keep
        theirs, and keep them across retries."""
        with self._lock:
            self._scores.update({h: float(v) for h, v in scores.items()})
            for n in self._s.nodes:
                n.slow_score = self._scores.get(n.host, n.slow_score)

    def sample(self) -> JobSample:
        """A copy of the run as it is now (the scrape renders it without the lock)."""
        with self._lock:
            s = dataclasses.replace(self._s, nodes=[dataclasses.replace(n) for n in self._s.nodes])
        s.now = self._clock()
        return s
