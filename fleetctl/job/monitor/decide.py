"""The job monitor's decision: one poll of every node's supervisor in, the job's verdict (or
"keep watching") and the event lines out — through the same state machine an attached run uses
(``fleetctl.job.records.state``). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from fleetctl.job.monitor.supervisors import EXTERNAL_STOP_REASON, NodeReport
from fleetctl.job.records.jobrecord import FailureRecord
from fleetctl.job.records.runfolder import iso
from fleetctl.job.records.state import JobState, NodeState

if TYPE_CHECKING:
    from fleetctl.api.runspec import Supervision
    from fleetctl.plan.roles import CompletionPolicy

DEFAULT_POLL = 2.0
DEFAULT_LOST_TIMEOUT = 60.0  # detached jobs: nobody waits on them, so tolerate long blips
DEFAULT_GRACE = 5.0
MONITOR_REASON = "stopped by the job monitor"
# Once a node of a plain job succeeded, its peers are shutting down (torchrun's exit barrier
# waits up to 300 s for them, then teardown and interpreter exit): no line comes, so the
# stall limit gives way to the longer of it and this.
DEFAULT_FINISH = 300.0
ENDED = frozenset({"succeeded", "failed", "lost"})

# How the job ends (Decision.action; see there) and what one node's answer says (_classify)
Action = Literal["fail", "done", "external", "give_up"]
NodeVerdict = Literal["running", "succeeded", "failed", "lost", "unreachable", "external"]

# ---------------------------------------------------------------------------- the decision


@dataclass
class WatchState:
    """What the monitor remembers between polls (kept by the caller of :func:`decide`)."""

    unreachable_since: dict[int, float] = field(default_factory=dict)  # rank -> first miss
    reported: set[int] = field(default_factory=set)  # ranks whose end was written to events
    tolerated: set[int] = field(default_factory=set)  # failures the completion policy allows
    progress: dict[int, float] = field(default_factory=dict)  # rank -> last progress mark seen
    last_progress: float | None = None  # when any mark last moved (this machine's clock)
    begun: bool = False  # a node said the job's start-up is over (its first line or touch)
    ended: set[int] = field(default_factory=set)  # ranks whose end the stall clock saw
    ranks_ended: set[int] = field(default_factory=set)  # nodes whose ranks all ended (``A``)
    finishing: bool = False  # a node of a plain job succeeded: the rest is shut-down


@dataclass(frozen=True)
class Decision:
    """How the job ends. ``action``: ``fail`` (a node failed first: tear the rest down),
    ``done`` (every node ended; ``status`` says how), ``external`` (someone else stops it),
    ``give_up`` (no node to blame: ``--timeout`` passed or the job stalled; ``reason``)."""

    action: Action
    status: str | None = None
    rank: int | None = None
    host: str | None = None
    state: Literal["failed", "lost"] | None = None  # for ``fail``
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    time: float | None = None
    unreachable: bool = False  # lost because it did not answer: do not wait on it again

    def first_failure(self) -> FailureRecord | None:
        """job.json's ``first_failure`` entry (None unless ``fail``)."""
        if self.action != "fail" or self.rank is None:
            return None
        first = FailureRecord(
            rank=self.rank,
            host=self.host,
            state=self.state,
            exit_code=self.exit_code,
            signal=self.signal,
            reason=self.reason,
            time=iso(self.time),
        )
        first.extra["found_by"] = "monitor"
        return first

    def describe(self) -> str:
        if self.action == "fail":
            if self.state == "lost":
                how = f"lost ({self.reason})" if self.reason else "lost"
            elif self.signal is not None:
                how = f"signal {self.signal}"
            elif self.exit_code is None and self.reason:  # still running: slow (slowwatch)
                how = self.reason
            else:
                how = f"exit code {self.exit_code}"
            return f"node {self.rank} ({self.host}) failed first: {how}"
        if self.action == "done":
            return f"every node ended: {self.status}"
        if self.action == "give_up":
            return f"the job {self.reason}"
        return "the job is being stopped from another terminal"


def _classify(s: NodeReport) -> tuple[NodeVerdict, str | None]:
    """A supervisor's answer as running / succeeded / failed / lost / unreachable / external,
    with a reason for the bad ones."""
    if s.state == "unreachable":
        return "unreachable", s.error
    if s.state == "exited":
        if s.signal is None and s.exit_code == 0:
            return "succeeded", None
        return "failed", None
    if s.state == "stopped":
        if s.stop_reason == EXTERNAL_STOP_REASON:
            return "external", s.stop_reason
        if s.stop_reason and s.stop_reason.startswith(MONITOR_REASON):
            return "external", s.stop_reason  # another monitor already tears it down
        return "failed", f"stopped on the node: {s.stop_reason or 'no reason recorded'}"
    if s.state == "lost":
        return "lost", "its supervisor died"
    if s.state == "absent":
        return "lost", "no record of the job on the node"
    return "running", None


def stall_reason(quiet: float) -> str:
    return f"stalled: no progress on any node for {quiet:.0f} s"


def finish_reason(quiet: float) -> str:
    return f"stalled finishing: a node succeeded, the others silent for {quiet:.0f} s"


def ranks_ended_cleanly(said: object) -> bool:
    """A node's ``A`` frame (attached) or ``ranks_ended.json`` (``status``, detached) says
    every rank there ended with exit code 0: the job's work on that node is done, and what is
    left is its launcher's silent shut-down, judged as a succeeded node's peers' is."""
    return isinstance(said, dict) and said.get("failed") == 0 and bool(said.get("ranks"))


def startup_reason(waited: float) -> str:
    return f"stalled at start-up: no progress on any node {waited:.0f} s after the launch"


def past_limit(
    sup: Supervision,
    now: float,
    *,
    started: float | None,
    progress: float | None,
    launched: bool = True,
    finishing: bool = False,
) -> str | None:
    """Why the job is past a limit of its supervision, else None — the one decision an
    attached run and a detached job's monitor share: ``--timeout`` from ``started`` (the
    launch); once every node ``launched``, before the job's first progress (``progress``
    None) its start-up limit from ``started``, then its stall limit from the last
    ``progress`` (a node's end counts). ``finishing``: a node of a plain job succeeded, so
    the job's work is over and the rest is shut-down, which prints nothing: the stall limit
    is at least :data:`DEFAULT_FINISH` then. One clock for all of them."""
    if sup.timeout is not None and started is not None and now - started > sup.timeout:
        return f"timed out after {sup.timeout:g} s"
    if not launched:
        return None
    if progress is None:
        limit = sup.startup_limit()
        if limit is not None and started is not None and now - started > limit:
            return startup_reason(now - started)
        return None
    limit = sup.stall_timeout
    if limit is None or now - progress <= (max(limit, DEFAULT_FINISH) if finishing else limit):
        return None
    return finish_reason(now - progress) if finishing else stall_reason(now - progress)


def limit_reached(
    states: Sequence[NodeReport],
    watch: WatchState,
    now: float,
    *,
    started: float | None,
    sup: Supervision,
    policy: CompletionPolicy | None = None,
) -> Decision | None:
    """:func:`past_limit` for a detached job: a ``give_up`` decision, or None.

    Progress is a node's progress mark (its console log or progress file changed, by the
    node's own clock) moving between polls, or a node's end first seen; only this machine's
    clock measures the silence, so node clocks need not agree with it. The stall clock
    starts when a node first says the job began (its first line of a rank, or a progress
    touch); until then the start-up limit counts from ``started``. A node that succeeded
    makes a plain job (no ``policy``) ``finishing``: its peers' silence is their shut-down.
    A node whose ranks all ended (its launcher still running) counts as that node's end: the
    stall clock restarts, and ranks that all exited 0 make the job ``finishing`` too.
    """
    for s in states:
        if s.progress is not None and watch.progress.get(s.rank) != s.progress:
            watch.progress[s.rank] = s.progress
            watch.last_progress = now
        kind = _classify(s)[0]
        if kind in ENDED and s.rank not in watch.ended:
            watch.ended.add(s.rank)
            watch.last_progress = now
            watch.begun = True  # an end is past the start-up, whatever the node printed
            watch.finishing = watch.finishing or (kind == "succeeded" and policy is None)
        if s.ranks_ended is not None and s.rank not in watch.ranks_ended:
            watch.ranks_ended.add(s.rank)
            watch.last_progress, watch.begun = now, True
            watch.finishing = watch.finishing or (
                ranks_ended_cleanly(s.ranks_ended) and policy is None
            )
    if not watch.begun and any(s.begun for s in states):
        watch.begun, watch.last_progress = True, now
    if watch.last_progress is None:
        watch.last_progress = now
    progress = watch.last_progress if watch.begun else None
    why = past_limit(sup, now, started=started, progress=progress, finishing=watch.finishing)
    return None if why is None else Decision("give_up", "failed", reason=why)


def decide(
    states: Sequence[NodeReport],
    watch: WatchState,
    now: float,
    *,
    lost_after: float,
    policy: CompletionPolicy | None = None,
) -> tuple[Decision | None, list[str]]:
    """One poll's verdict (None: keep watching) and the event lines it gives rise to.

    The first failure is the bad end with the earliest time (a node's recorded end time; for
    a node that stopped answering, when it first did not), so two nodes failing between two
    polls are told apart. A role job's ``min_failed`` (``policy``) may tolerate a failure.
    Updates ``watch`` (unreachable streaks, what was already reported).
    """
    notes: list[str] = []
    kinds: dict[int, NodeVerdict] = {}
    bad: list[tuple[float, Decision]] = []
    for s in states:
        kind, why = _classify(s)
        if kind == "external":
            return Decision("external", reason=why), notes
        if kind == "unreachable":
            since = watch.unreachable_since.setdefault(s.rank, now)
            if since == now:
                notes.append(
                    f"node {s.rank} ({s.host}) did not answer: {why or 'no reason'}; "
                    f"tolerated up to {lost_after:g}s"
                )
            if now - since > lost_after:
                kinds[s.rank] = "lost"
                reason = f"unreachable for {now - since:.0f}s" + (f": {why}" if why else "")
                d = Decision(
                    "fail",
                    "failed",
                    s.rank,
                    s.host,
                    "lost",
                    reason=reason,
                    time=since,
                    unreachable=True,
                )
                bad.append((since, d))
            else:
                kinds[s.rank] = "running"
            continue
        missed = watch.unreachable_since.pop(s.rank, None)
        if missed is not None:
            notes.append(f"node {s.rank} ({s.host}) answers again after {now - missed:.1f}s")
        kinds[s.rank] = kind
        if kind in ("failed", "lost"):
            when = s.end_time if s.end_time is not None else now
            d = Decision(
                "fail",
                "failed",
                s.rank,
                s.host,
                "failed" if kind == "failed" else "lost",
                exit_code=s.exit_code,
                signal=s.signal,
                reason=why,
                time=when,
            )
            bad.append((when, d))
        elif kind == "succeeded" and s.rank not in watch.reported:
            watch.reported.add(s.rank)
            notes.append(f"node {s.rank} ({s.host}) succeeded")
    # The job's state machine decides, as for an attached run: successes as they stand, then
    # the bad ends one by one, earliest first; the one that reaches a role's min_failed (for a
    # plain job: the first) is the job's first failure.
    index = {s.rank: i for i, s in enumerate(states)}
    machine = JobState(
        len(states),
        policy,
        [
            NodeState.SUCCEEDED if kinds[s.rank] == "succeeded" else NodeState.RUNNING
            for s in states
        ],
    )
    bad.sort(key=lambda x: (x[0], x[1].rank or 0))
    for when, d in bad:
        assert d.rank is not None and d.state is not None
        change = machine.end(index[d.rank], NodeState(d.state), when)
        if change.first_failure:
            return d, notes
        if d.rank not in watch.tolerated:
            watch.tolerated.add(d.rank)
            notes.append(
                f"node {d.rank} ({d.host}) ended badly ({d.state}); tolerated by its role's "
                "min_failed"
            )
    if all(kinds[s.rank] in ENDED for s in states):
        return Decision("done", str(machine.outcome())), notes
    return None, notes
