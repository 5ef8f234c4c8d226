"""The slow-node judge: which node the others wait for, from the nodes' pace reports.

In a synchronous job every rank steps together, so each node's step rate is the same and
cannot tell who is slow. Where the ranks spend their time can: the slow node's ranks compute
(or wait for a CPU) nearly all the time, while its peers finish their part early and wait in
the collective for it. Each node's supervisor samples its ranks (``fleetctl.remote.kit.pace``)
and reports every few seconds; a **round** is one fresh report from every node, and in it
the busiest node is the suspect when

* its ranks run most of the time (``busy`` ≥ ``MIN_BUSY``) while the peers wait most of the
  time (their median ``busy`` ≤ ``MAX_PEER_BUSY``), and it stands clear of the next busiest
  node (``MIN_GAP``), so only the worst is ever named, never a pair that is alike; or
* its cpu cgroup is throttled (in ``MIN_THROTTLED`` of its quota periods) while its ranks run
  and no peer's cgroup is throttled: a CPU-capped node (a noisy neighbour, a container limit)
  whose ranks' helper threads (gloo's, the data loader's) are held back with them.

When the two rules point at different nodes there is no suspect. A node that is the suspect
of ``AGREE`` of the last ``WINDOW`` rounds, none of them naming another, is named; weak or
mixed evidence names nobody, and a fleet of noisy but alike nodes never has a suspect. Pure:
no clock, no I/O.
"""

from __future__ import annotations

# statistics is imported where a round is judged: its import (decimal, fractions: ~2 ms of
# CPU) would cost every multi-node run's launch, before any pace report has come.
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from fleetctl.plan.userinput import AGREE as AGREE  # the run options' defaults, kept there
from fleetctl.plan.userinput import WINDOW as WINDOW

if TYPE_CHECKING:
    from fleetctl.job.diagnose.slowstacks import SlowStacks

MIN_BUSY = 0.6
MAX_PEER_BUSY = 0.5
MIN_GAP = 0.3
MIN_THROTTLED = 0.2
MAX_PEER_THROTTLED = 0.05
MIN_CPU = 0.02  # CPU-s/s a throttled node's ranks use: throttling an idle job slows nothing
MIN_RATIO = 1.5  # said as "computes ~N× longer" from here


@dataclass(frozen=True)
class NodePace:
    """One node's report: the mean over its ranks of their busy share, and its throttling."""

    rank: int
    host: str
    busy: float
    throttled: float | None = None
    cpu: float = 0.0  # CPU seconds per second, mean over its ranks

    @classmethod
    def from_report(cls, rank: int, host: str, report: dict[str, Any]) -> NodePace | None:
        """From a ``W`` frame's payload; None when it holds no usable rank sample."""
        import statistics

        ranks = report.get("ranks")
        if not isinstance(ranks, dict):
            return None
        rows = [r for r in ranks.values() if isinstance(r, dict)]
        busy = [float(r["busy"]) for r in rows if isinstance(r.get("busy"), (int, float))]
        cpu = [float(r["cpu"]) for r in rows if isinstance(r.get("cpu"), (int, float))]
        if not busy:
            return None
        thr = report.get("throttled")
        throttled = float(thr) if isinstance(thr, (int, float)) else None
        return cls(rank, host, statistics.fmean(busy), throttled, statistics.fmean(cpu or [0.0]))


@dataclass(frozen=True)
class SlowVerdict:
    """A node named slow, with its evidence: what the result, job.json and the health ledger
    carry. ``compute_ratio``: how much longer its ranks compute per step than the peers'
    (their running shares, the step being common); ``peers_wait``: the share of time the
    peers spent waiting (median); ``throttled``: its cgroup's throttled share (None: no quota);
    ``stacks``: py-spy's shares once sampled (``slowstacks.py``; None: not sampled);
    ``at_round``: the round of reports that named it (1: the job's first), the promise in the
    job's own clock — rounds, not seconds, which a loaded controller stretches (0 for a
    progress verdict, which counts its own rounds); ``seconds``: from the launch to the
    verdict by the controller's clock (``at_launch``; None until then: the judge has no
    clock). A node named by its progress rate
    (``progress_rate.py``) has no ``busy`` or ``peers_wait`` (None), its ``compute_ratio`` is
    how many times slower it progresses, and ``progress`` holds the figures (the shape, its
    unit, the rates, the counts gained)."""

    rank: int
    host: str
    busy: float | None
    peers_wait: float | None
    compute_ratio: float
    throttled: float | None
    rounds: int
    why: str = field(default="")
    at_round: int = 0
    stacks: SlowStacks | None = None
    progress: dict[str, Any] | None = None
    seconds: float | None = None

    def at_launch(self, started: float | None, now: float) -> SlowVerdict:
        """The verdict with ``seconds`` since ``started`` (the launch, wall clock) at ``now``;
        as it was without a launch time (an older record's)."""
        if started is None:
            return self
        return replace(self, seconds=round(max(0.0, now - started), 1))

    def with_stacks(self, stacks: SlowStacks) -> SlowVerdict:
        """The verdict with py-spy's evidence: its phrase (``peers wait in all_reduce 78% of
        the time``) takes the place of the kernel's ``peers wait in collectives …``."""
        why = self.why
        said = stacks.phrase()
        if said is not None:
            head, _, last = why.rpartition("; ")
            kept = head if last.startswith("peers wait in collectives") else why
            why = f"{kept}; {said}" if kept else said
        return replace(self, why=why, stacks=stacks)

    def line(self) -> str:
        """``node 2 (gpu03) slows the job: its ranks compute ~4.0× longer per step; …``"""
        return f"node {self.rank} ({self.host}) slows the job: {self.why}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line()}


def suspect(round_: list[NodePace]) -> NodePace | None:
    """The round's slow node, or None (fewer than two nodes, no clear one, or two rules that
    point at different nodes)."""
    import statistics

    if len(round_) < 2:
        return None
    ranked = sorted(round_, key=lambda p: p.busy, reverse=True)
    worst, peers = ranked[0], ranked[1:]
    peer_busy = statistics.median(p.busy for p in peers)
    gap = worst.busy - ranked[1].busy
    waits = worst.busy >= MIN_BUSY and peer_busy <= MAX_PEER_BUSY and gap >= MIN_GAP
    capped = max(round_, key=lambda p: p.throttled or 0.0)
    throttled = (
        (capped.throttled or 0.0) >= MIN_THROTTLED
        and capped.cpu >= MIN_CPU
        and all((p.throttled or 0.0) <= MAX_PEER_THROTTLED for p in round_ if p is not capped)
    )
    if waits and throttled and capped is not worst:
        return None  # two stories: name nobody
    if waits:
        return worst
    return capped if throttled else None


def evidence(node: NodePace, peers: list[NodePace]) -> tuple[float, float, str]:
    """(compute ratio, peers' wait share, the words) for ``node`` against its ``peers``."""
    import statistics

    peer_busy = statistics.median(p.busy for p in peers)
    ratio = node.busy / max(peer_busy, 0.02)
    parts = []
    if ratio >= MIN_RATIO:
        parts.append(f"its ranks compute ~{ratio:.1f}× longer per step")
    if (node.throttled or 0.0) >= MIN_THROTTLED:
        parts.append(
            f"its cpu cgroup is throttled in {100 * (node.throttled or 0):.0f}% of periods"
        )
    parts.append(f"peers wait in collectives {100 * (1 - peer_busy):.0f}% of the time")
    return ratio, 1 - peer_busy, "; ".join(parts)


class PaceJudge:
    """Rounds of reports in, at most one verdict out (the first node named stays named)."""

    def __init__(self, nodes: dict[int, str], agree: int = AGREE) -> None:
        self.nodes = dict(nodes)  # node rank -> host: every node must report in a round
        self.agree = agree
        self.fresh: dict[int, NodePace] = {}
        # the last WINDOW rounds: (the round's suspect or None, the round)
        self.rounds: list[tuple[NodePace | None, list[NodePace]]] = []
        self.streak: list[tuple[NodePace, list[NodePace]]] = []  # the rounds that named it
        self.verdict: SlowVerdict | None = None
        self.count = 0  # rounds complete so far

    def add(self, rank: int, report: dict[str, Any]) -> SlowVerdict | None:
        """One node's report; the verdict when this report completes a round that names a
        node for the ``agree``-th time within the window (once only), else None."""
        if self.verdict is not None or rank not in self.nodes:
            return None
        pace = NodePace.from_report(rank, self.nodes[rank], report)
        if pace is None:
            return None
        self.fresh[rank] = pace
        if len(self.fresh) < len(self.nodes):
            return None
        round_, self.fresh = list(self.fresh.values()), {}
        self.rounds = [*self.rounds, (suspect(round_), round_)][-WINDOW:]
        self.count += 1
        named = {got.rank for got, _ in self.rounds if got is not None}
        if len(named) != 1:  # nobody, or two nodes within the window: not clear enough
            return None
        self.streak = [(got, r) for got, r in self.rounds if got is not None]
        if len(self.streak) < self.agree:
            return None
        self.verdict = self._verdict()
        return self.verdict

    def suspects(self) -> set[int]:
        """The nodes any round of the window suspects (the other judge's veto)."""
        return {got.rank for got, _ in self.rounds if got is not None}

    def scores(self) -> dict[str, float]:
        """The latest round's score by host (higher: slower): its ranks' busy share over the
        median of its peers' (1: like its peers), for the metrics' slow-node series."""
        import statistics

        if not self.rounds:
            return {}
        round_ = self.rounds[-1][1]
        out = {}
        for p in round_:
            peers = [q.busy for q in round_ if q is not p]
            out[p.host] = round(p.busy / max(statistics.median(peers), 0.02), 3) if peers else 1.0
        return out

    def _verdict(self) -> SlowVerdict:
        """The streak's evidence, averaged over its rounds."""
        import statistics

        rank = self.streak[-1][0].rank
        mine = [s[0] for s in self.streak]
        thr = [p.throttled for p in mine if p.throttled is not None]
        node = NodePace(
            rank,
            mine[-1].host,
            statistics.fmean(p.busy for p in mine),
            statistics.fmean(thr) if thr else None,
            statistics.fmean(p.cpu for p in mine),
        )
        peers = [p for _, r in self.streak for p in r if p.rank != rank]
        ratio, wait, why = evidence(node, peers)
        return SlowVerdict(
            rank,
            node.host,
            round(node.busy, 3),
            round(wait, 3),
            round(ratio, 2),
            None if node.throttled is None else round(node.throttled, 3),
            len(self.streak),
            why,
            at_round=self.count,
        )


class GroupJudges:
    """One :class:`PaceJudge` per group of nodes that step together — a role job's roles (a
    parameter server never waits for a trainer as a trainer's peers do) — with the same
    interface; groups of one node are not judged. The first verdict of any group stands."""

    def __init__(self, groups: list[dict[int, str]], agree: int = AGREE) -> None:
        self.judges = [PaceJudge(g, agree) for g in groups if len(g) > 1]
        self.verdict: SlowVerdict | None = None

    @property
    def count(self) -> int:
        return sum(j.count for j in self.judges)

    def add(self, rank: int, report: dict[str, Any]) -> SlowVerdict | None:
        if self.verdict is not None:
            return None
        for j in self.judges:
            if rank in j.nodes:
                self.verdict = j.add(rank, report)
                return self.verdict
        return None

    def scores(self) -> dict[str, float]:
        return {k: v for j in self.judges for k, v in j.scores().items()}

    def suspects(self) -> set[int]:
        return {rank for j in self.judges for rank in j.suspects()}

    def withdraw(self) -> None:
        """The verdict was refused (the progress judge suspects another node): judge on."""
        self.verdict = None
        for j in self.judges:
            j.verdict = None


def judge_for(nodes: dict[int, str], roles: dict[int, str] | None, agree: int) -> GroupJudges:
    """The judge of a job: its nodes as one group, or by role (``roles``: node rank -> role)."""
    groups: dict[str, dict[int, str]] = {}
    for rank, host in sorted(nodes.items()):
        groups.setdefault(roles.get(rank, "") if roles else "", {})[rank] = host
    return GroupJudges(list(groups.values()), agree)
