"""The progress-rate judge: in a job whose nodes progress independently, the node that falls
behind its peers, from the progress markers of its ranks' output
(``fleetctl/remote/kit/progress.py``).

A synchronous job's nodes all step together, so their rates are alike and this judge names
nobody there: the pace judge (``pace.py``, where the ranks spend their time) is the one for
it. In a job whose nodes run their own loops (a parameter sweep, data-parallel work without a
collective, the workers of an ensemble) nobody waits for anybody, so the pace judge sees every
node busy and names nobody; progress rates tell the slow node.

Every ``ROUND`` seconds (driven by the lines' arrival), per node: for each rank that prints
(torchrun's ``[rankN]:`` prefixes keep a node's ranks apart), the rate of its markers of one
shape over the last ``SPAN`` seconds, the node's rate the median over its ranks. The shape is
the most specific one every node of the group printed in the span; a node with none (silent,
or printing another shape) leaves the round without a suspect. In a round the slowest node is
the suspect when its rate is ≤ ``MAX_RATIO`` of its peers' median and its peers are alike
(each ≥ ``ALIKE`` of that median): only the worst is ever named, never one of two slow ones.
Named as the pace judge names (``AGREE`` of the last ``WINDOW`` rounds naming it and no
other); never once a node of the group has ended (a finished node's silence is not
slowness); by role in a role job. Pure: the caller gives the times.
"""

from __future__ import annotations

# statistics is imported where rates are judged, as in pace.py: not at every run's launch
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.job.diagnose.pace import AGREE, WINDOW, SlowVerdict
from fleetctl.remote.kit.progress import KINDS, UNITS, Count, Marker, may_mark, parse, source

if TYPE_CHECKING:
    import re
    from collections.abc import Iterable

ROUND = 2.0  # seconds between rounds, as the pace reports
SPAN = 12.0  # seconds of markers a rate is measured over
MIN_SPAN = 4.0  # a rate needs markers at least this far apart
MAX_RATIO = 0.5  # the suspect's rate against its peers' median, at most
ALIKE = 0.7  # each peer's rate against that median, at least: the peers are alike
MAX_POINTS = 4096  # markers kept per rank and shape: memory stays bounded at any line rate
# lines read per batch a node sends, its last ones: a training loop's few lines a second all
# are; a log flood's batches (thousands of lines) cost 64 regex scans each, not thousands
# (a count only grows: the newest markers carry the rate)
SCAN = 64


@dataclass
class _Series:
    """One rank's markers of one shape, as a count that only grows (``Count``) over time."""

    points: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MAX_POINTS))
    count: Count = field(default_factory=Count)

    def add(self, t: float, m: Marker) -> None:
        value = self.count.add(m)
        if value is not None:
            self.points.append((t, value))

    def point(self, t: float, value: float) -> None:
        """A count already carried on (a detached supervisor's ``Tally``): a newer one only."""
        if not self.points or (t > self.points[-1][0] and value >= self.points[-1][1]):
            self.points.append((t, value))

    def prune(self, now: float) -> None:
        while self.points and self.points[0][0] < now - SPAN:
            self.points.popleft()

    def rate(self, now: float) -> tuple[float, float, float] | None:
        """(rate, count gained, seconds) over the last SPAN, or None (too few markers)."""
        self.prune(now)
        if len(self.points) < 2:
            return None
        (t0, v0), (t1, v1) = self.points[0], self.points[-1]
        if t1 - t0 < MIN_SPAN:
            return None
        return (v1 - v0) / (t1 - t0), v1 - v0, t1 - t0


@dataclass(frozen=True)
class NodeRate:
    rank: int
    host: str
    rate: float
    gained: float
    seconds: float


class _Group:
    """The nodes that are one another's peers (all of a job's, or one role's)."""

    def __init__(self, nodes: dict[int, str], agree: int) -> None:
        self.nodes, self.agree = dict(nodes), agree
        self.rounds: list[tuple[NodeRate | None, dict[int, NodeRate], str]] = []
        self.ended = False

    def round(self, series: dict[int, dict[tuple[str, str], _Series]], now: float) -> None:
        got, rates, kind = _suspect(self.nodes, series, now)
        self.rounds = [*self.rounds, (got, rates, kind)][-WINDOW:]

    def named(self) -> SlowVerdict | None:
        if self.ended:
            return None
        ranks = {got.rank for got, _, _ in self.rounds if got is not None}
        if len(ranks) != 1:
            return None
        streak = [(got, r, k) for got, r, k in self.rounds if got is not None]
        if len(streak) < self.agree:
            return None
        got, rates, kind = streak[-1]
        assert got is not None
        return _verdict(got, [r for r in rates.values() if r.rank != got.rank], kind, len(streak))


def _suspect(
    nodes: dict[int, str], series: dict[int, dict[tuple[str, str], _Series]], now: float
) -> tuple[NodeRate | None, dict[int, NodeRate], str]:
    """The round's slow node (or None), every node's rate and the shape measured."""
    for kind in KINDS:
        rates: dict[int, NodeRate] = {}
        for rank, host in nodes.items():
            per = [s.rate(now) for (_, k), s in series.get(rank, {}).items() if k == kind]
            got = [r for r in per if r is not None]
            if not got:
                break
            import statistics  # here: a job whose lines carry no progress never needs it

            rates[rank] = NodeRate(
                rank,
                host,
                statistics.median(r[0] for r in got),
                statistics.median(r[1] for r in got),
                statistics.median(r[2] for r in got),
            )
        else:
            return _slowest(rates), rates, kind
    return None, {}, ""


def _slowest(rates: dict[int, NodeRate]) -> NodeRate | None:
    import statistics

    if len(rates) < 2:
        return None
    ranked = sorted(rates.values(), key=lambda r: r.rate)
    worst, peers = ranked[0], ranked[1:]
    median = statistics.median(p.rate for p in peers)
    if median <= 0 or worst.rate > MAX_RATIO * median:
        return None
    return worst if all(p.rate >= ALIKE * median for p in peers) else None


def _verdict(node: NodeRate, peers: list[NodeRate], kind: str, rounds: int) -> SlowVerdict:
    import statistics

    median = statistics.median(p.rate for p in peers)
    ratio = min(median / max(node.rate, 1e-9), 999.0)
    mine, theirs = node.rate * node.seconds, median * node.seconds
    why = (
        f"its ranks progress ~{ratio:.1f}× slower ({UNITS[kind]} {_fmt(mine)} vs "
        f"{_fmt(theirs)} in {node.seconds:.0f} s)"
    )
    progress = {
        "shape": kind,
        "unit": UNITS[kind],
        "rate": round(node.rate, 4),
        "peers_rate": round(median, 4),
        "gained": round(mine, 3),
        "peers_gained": round(theirs, 3),
        "seconds": round(node.seconds, 1),
    }
    return SlowVerdict(
        node.rank,
        node.host,
        None,
        None,
        round(ratio, 2),
        None,
        rounds,
        why,
        progress=progress,
    )


def _fmt(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.2g}"


class ProgressJudge:
    """Lines in (with their arrival time), at most one verdict out; one group per role."""

    def __init__(
        self,
        groups: list[dict[int, str]],
        agree: int = AGREE,
        own: re.Pattern[str] | None = None,
    ) -> None:
        self.groups = [_Group(g, agree) for g in groups if len(g) > 1]
        self.own = own
        self.series: dict[int, dict[tuple[str, str], _Series]] = {}
        self.verdict: SlowVerdict | None = None
        self.at: float | None = None  # the last round's time

    def lines(self, rank: int, t: float, lines: Iterable[str]) -> SlowVerdict | None:
        """A node's lines that arrived at ``t``; the verdict when a round due now names one."""
        if self.verdict is not None:
            return None
        mine = self.series.setdefault(rank, {})
        batch = lines if isinstance(lines, (list, tuple)) else list(lines)
        scan = batch[-SCAN:]
        if self.own is None and not may_mark("\n".join(scan)):
            return self.tick(t)  # no line has a shape's word (a log flood's usual batch)
        for line in scan:
            for m in parse(line, self.own):
                mine.setdefault((source(line), m.kind), _Series()).add(t, m)
        return self.tick(t)

    def counts(self, rank: int, points: Iterable[tuple[str, str, float, float]]) -> None:
        """A node's counts as its supervisor tallied them (a detached job, for its monitor:
        ``remote/kit/progress.py: Tally``): (rank prefix, shape, time, count), the count
        already carried across epochs and bars; the next :meth:`tick` judges them."""
        if self.verdict is not None:
            return
        mine = self.series.setdefault(rank, {})
        for src, kind, t, value in points:
            if kind in UNITS:
                mine.setdefault((src, kind), _Series()).point(t, value)

    def tick(self, now: float) -> SlowVerdict | None:
        if self.verdict is not None or (self.at is not None and now - self.at < ROUND):
            return None
        self.at = now
        for per in self.series.values():
            for s in per.values():
                s.prune(now)
        for g in self.groups:
            g.round(self.series, now)
            self.verdict = g.named()
            if self.verdict is not None:
                return self.verdict
        return None

    def end(self, rank: int) -> None:
        """A node ended: its group is judged no more (its silence from now is no slowness)."""
        for g in self.groups:
            if rank in g.nodes:
                g.ended = True

    def suspects(self) -> set[int]:
        """The nodes any round of the window suspects (the other judge's veto)."""
        return {got.rank for g in self.groups for got, _, _ in g.rounds if got is not None}

    def withdraw(self) -> None:
        """The verdict was refused (the pace judge suspects another node): judge on."""
        self.verdict = None


def progress_judge(
    nodes: dict[int, str], roles: dict[int, str] | None, agree: int, own: Any = None
) -> ProgressJudge:
    """The judge of a job: its nodes as one group, or by role (``roles``: rank -> role)."""
    groups: dict[str, dict[int, str]] = {}
    for rank, host in sorted(nodes.items()):
        groups.setdefault(roles.get(rank, "") if roles else "", {})[rank] = host
    return ProgressJudge(list(groups.values()), agree, own)
