"""The post-mortem's proof: after a stall, a lost node or a collective timeout ended the job,
the collective programs of ``check --collective`` run among the job's reachable hosts to show
which node or link is slow or dead — all of them at once up to ``ALL_PAIRS_UP_TO`` hosts (the
collective measures every link and its judge names the culprit), else the rounds of
``fleetctl.health.bisect``. A host out of reach over SSH, or whose data link the post-mortem
probe found down (``fleetctl.job.diagnose.culprit``), is its own proof: then no collective runs (one
fault at a time; the others passing would cost seconds to say).

Bounded and harmless: it runs over connections of its own, closed at its limit
(``--post-mortem-timeout``) so every node program gets EOF and exits at once; it never raises,
and only adds to the result (``post_mortem`` in job.json, the summary's proof lines, the health
ledger's evidence through ``fleetctl.job.run.spares.remember_faulty``): the exit code and the
culprit already named stay as they were.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetctl.health.bisect import ALL_PAIRS_UP_TO, Bisect, Finding, Round, proof_lines
from fleetctl.job.records.result import JobPhase
from fleetctl.job.records.state import JobStatus, NodeState
from fleetctl.plan.collective import CollectiveOptions
from fleetctl.plan.rankplan import NodeFacts

if TYPE_CHECKING:
    from fleetctl.job.records.result import JobResult
    from fleetctl.job.run.context import JobContext
    from fleetctl.phases.check.collective import Started
    from fleetctl.phases.check.collective_judge import CollectiveReport

# a link or node this far below the median fails a group: the fault that stalled a job is
# severe (a dead link, a NIC at 1/100), while 8 lab hosts sharing 2 cores spread their links
# 2x (the check's 0.5 named one of those: bench/by_hand.md, Post-mortem)
MIN_FRACTION = 0.25
SIZE = 1 << 20  # bytes per transfer: a dead or 50 Mbit/s link shows at once, a good one in ms
DIAL = 2.0  # s at least to open each host's SSH connection (a lost one's is the proof)
CLOSE_WAIT = 3.0  # s for the rounds' threads to end once their connections are closed
# what a rank prints when a collective timed out or its peer's link went away
_COLLECTIVE = re.compile(
    r"NCCL (timeout|error)|Watchdog caught collective operation timeout|ncclRemoteError"
    r"|Connection closed by peer|Connection reset by peer|Timed out waiting|gloo.*[Tt]imeout",
)
_CUT = ": data link down"  # fleetctl.job.diagnose.culprit's words for a host no peer reaches


def wanted(result: JobResult) -> str | None:
    """Why a proof is worth running (``a lost node``, ``a stall``, ``a collective timeout``),
    or None: a job that failed on its own error needs none."""
    if result.status != JobStatus.FAILED:
        return None
    if any(n.state == NodeState.LOST for n in result.nodes):
        return "a lost node"
    if (result.verdict or "").startswith("stalled"):
        return "a stall"
    ff = result.failed_node
    if ff is not None and _COLLECTIVE.search("\n".join(result.log_tail(ff.rank, 50))):
        return "a collective timeout"
    return None


def named_hosts(record: Mapping[str, Any] | None) -> dict[str, str]:
    """The hosts a proof record (``Proof.to_dict``, as job.json keeps it) named, and why in a
    few words (the health ledger's reason)."""
    if not record:
        return {}
    found = record.get("finding") or {}
    out = {h: "unreachable over SSH after the job" for h in record.get("unreachable") or []}
    out |= {h: "data link down" for h in record.get("cut") or []}
    hosts = list(found.get("hosts") or [])
    for h in list(record.get("named") or []):
        if found.get("kind") == "link" and len(hosts) == 2:
            out.setdefault(h, f"slow or dead link {hosts[0]} - {hosts[1]} (post-mortem collective)")
        else:
            out.setdefault(h, "slow or dead (post-mortem collective)")
    return out


@dataclasses.dataclass
class Proof:
    """What the post-mortem ran and found (job.json's ``post_mortem``)."""

    why: str
    limit: float
    hosts: list[str] = dataclasses.field(default_factory=list)  # ran the collective
    unreachable: list[str] = dataclasses.field(default_factory=list)
    cut: list[str] = dataclasses.field(default_factory=list)
    finding: Finding = dataclasses.field(default_factory=lambda: Finding("none"))
    rounds: list[Round] = dataclasses.field(default_factory=list)
    elapsed: float = 0.0
    programs: int = 0  # node programs started: one per host when every round reused its own

    @property
    def named(self) -> list[str]:
        """The hosts the proof shows sick (what the health ledger records)."""
        found = self.finding.hosts if self.finding.kind in ("node", "link") else ()
        return [*self.unreachable, *self.cut, *(h for h in found if h not in self.cut)]

    def lines(self) -> list[str]:
        return proof_lines(
            self.finding,
            self.rounds,
            hosts=self.hosts,
            unreachable=self.unreachable,
            cut=self.cut,
            elapsed=self.elapsed,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "why": self.why,
            "limit": self.limit,
            "hosts": self.hosts,
            "unreachable": self.unreachable,
            "cut": self.cut,
            "finding": self.finding.to_dict(),
            "rounds": [r.to_dict() for r in self.rounds],
            "elapsed": round(self.elapsed, 3),
            "programs": self.programs,
            "named": self.named,
            "lines": self.lines(),
        }


class Ahead:
    """The proof's own connections and node programs, started in the background as the job's
    teardown begins, so that each node imports torch while its job is stopped (as
    ``check --collective`` overlaps it with the probe). ``close`` ends them all (EOF)."""

    def __init__(self, job: JobContext, why: str) -> None:
        from fleetctl.ssh.fanout import FanOut
        from fleetctl.transport.connection import SSHSettings

        assert job.plan is not None
        self.why, self.limit = why, job.options.supervision.post_mortem_timeout
        pythons = {np.host: np.python for np in job.plan.nodes}
        self.nodes = [
            dataclasses.replace(n, python=pythons[n.name]) for n in job.nodes if n.name in pythons
        ]
        self.facts = {
            np.host: NodeFacts(train_addr=np.train_addr, nic=np.nic, python=np.python)
            for np in job.plan.nodes
        }
        settings = job.options.settings or SSHSettings()
        dial = min(settings.connect_timeout, max(DIAL, self.limit / 6))
        self.fleet = FanOut(self.nodes, dataclasses.replace(settings, connect_timeout=dial))
        self.unreachable: list[str] = []
        self.started: Started | None = None
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._start, daemon=True, name="post-mortem-ahead")
        self._thread.start()

    def _start(self) -> None:
        from fleetctl.phases.check.collective import start_programs

        with contextlib.suppress(Exception):
            res = self.fleet.connect()
            self.unreachable = [n.name for n in self.nodes if n.name in res.failed]
            if not self.unreachable and not self._closed.is_set():
                # each waits for its part until the proof's limit after a teardown's worth
                self.started = start_programs(self.fleet, self.nodes, self.limit + 60.0, many=True)
        if self._closed.is_set():  # closed while starting (a reconnect on a closed fleet)
            self.close()

    def ready(self, deadline: float) -> bool:
        self._thread.join(max(0.0, deadline - time.monotonic()))
        return not self._thread.is_alive()

    def close(self) -> None:
        self._closed.set()
        started = self.started
        if started is not None:
            started.close()
        self.fleet.close()  # EOF to every node program still running: they exit at once


def start(job: JobContext) -> Ahead | None:
    """As the teardown begins: the proof's connections and programs when a proof is wanted
    and can run (not ``--no-post-mortem``; no container job: the host's python may have no
    torch; no Slurm allocation's nodes: Slurm's word on a node is the proof there, and a step
    to a node it marked DOWN would only wait out the limit)."""
    from fleetctl.transport.connection import transport

    job.sync()
    why = wanted(job.result) if job.options.supervision.post_mortem else None
    plan = job.plan
    if why is None or plan is None or any(np.container for np in plan.nodes):
        return None
    if not all(transport(n).can_prove_post_mortem for n in job.nodes):
        return None
    return Ahead(job, why)


def prove(job: JobContext, ahead: Ahead) -> Proof:
    """Run the proof on what ``ahead`` started, within ``--post-mortem-timeout`` s from now;
    closes ``ahead``."""
    started = time.monotonic()
    limit = ahead.limit
    proof = Proof(ahead.why, limit)
    proof.cut = [
        n.name
        for n in ahead.nodes
        if any(c.startswith(n.name + _CUT) for c in job.result.culprits or [])
    ]
    opts = CollectiveOptions(size=SIZE, min_fraction=MIN_FRACTION, iters=2, timeout=limit)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            _run(proof, ahead, opts, started + limit, box)
        except Exception as e:  # the job's own failure stays the story
            proof.finding = Finding("error", (), f"{type(e).__name__}: {e}")
            box["done"] = True

    t = threading.Thread(target=work, daemon=True, name="post-mortem-proof")
    t.start()
    try:
        t.join(limit)
    finally:
        ahead.close()
    t.join(CLOSE_WAIT)
    proof = dataclasses.replace(proof, rounds=list(proof.rounds))  # a late thread writes no more
    if "done" not in box:
        bisect = box.get("plan")
        left = bisect.suspects() if isinstance(bisect, Bisect) else tuple(proof.hosts)
        proof.finding = Finding("unfinished", left, f"limit {limit:g} s")
    proof.elapsed = time.monotonic() - started
    proof.programs = ahead.started.starts if ahead.started is not None else 0
    return proof


def _run(
    proof: Proof, ahead: Ahead, opts: CollectiveOptions, deadline: float, box: dict[str, Any]
) -> None:
    if not ahead.ready(deadline):
        raise TimeoutError("no SSH connection within the limit")
    proof.unreachable = [h for h in ahead.unreachable if h not in proof.cut]
    if proof.unreachable or proof.cut or len(ahead.nodes) < 2:
        # one fault at a time: the host out of reach is the proof, and a collective among
        # the others would cost seconds to say they pass
        box["done"] = True
        return
    proof.hosts = [n.name for n in ahead.nodes]
    if len(proof.hosts) <= ALL_PAIRS_UP_TO:  # one collective measures every link
        (rep,) = _round(ahead, [proof.hosts], opts, deadline)
        proof.rounds.append(Round((tuple(proof.hosts),), (not rep.ok,), (_note(rep),)))
        proof.finding = _judged(rep, proof.hosts)
        box["done"] = True
        return
    plan = box["plan"] = Bisect(proof.hosts)
    best = 0.0  # the best median link of a passing group so far: what "slow" is measured by
    while groups := plan.groups():
        reps = _round(ahead, groups, opts, deadline)
        best = max([best, *(r.median for r in reps if r.ok)])
        bad = [not r.ok or r.median < opts.min_fraction * best for r in reps]
        again = [i for i, r in enumerate(reps) if bad[i] and _measured_again(r, len(groups[i]))]
        if again:  # a verdict on figures a preempted transfer can make: once more
            more = _round(ahead, [groups[i] for i in again], opts, deadline)
            for i, r in zip(again, more, strict=True):
                if r.ok and (not reps[i].ok or r.median > reps[i].median):
                    reps[i] = r
            best = max([best, *(r.median for r in reps if r.ok)])
            bad = [not r.ok or r.median < opts.min_fraction * best for r in reps]
        plan.feed(bad, [_note(r) for r in reps])
        proof.rounds = list(plan.rounds)
        named = _named_within(groups, reps, bad)
        if named is not None:  # a group measured all its pairs and its judge names the fault
            proof.finding = named
            box["done"] = True
            return
    assert plan.finding is not None
    proof.finding = plan.finding
    box["done"] = True


def _round(
    ahead: Ahead, groups: Sequence[Sequence[str]], opts: CollectiveOptions, deadline: float
) -> list[CollectiveReport]:
    """Each group's collective, all at once (the groups are disjoint), within ``deadline``;
    the programs started ahead serve the first round."""
    from fleetctl.phases.check.collective import run_collective

    left = max(1.0, deadline - time.monotonic())
    opts = dataclasses.replace(opts, timeout=left)
    by_name = {n.name: n for n in ahead.nodes}
    out: list[Any] = [None] * len(groups)

    def one(i: int) -> None:
        members = [by_name[h] for h in groups[i]]
        out[i] = run_collective(
            ahead.fleet, members, ahead.facts, opts, ahead.started, start_wait=left
        )

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + CLOSE_WAIT)
    if any(r is None for r in out):
        raise TimeoutError("a round ran past the limit")
    return out


def _measured_again(rep: CollectiveReport, hosts: int) -> bool:
    """Whether a failing group runs once more (its better run counts): when its figures alone
    failed it — below a quarter of the best group's median, or, in a group of two (two links,
    no all-pairs verdict), one slow figure — not a hang or an error. With the lab's 2 cores at
    load 50 one pair's median swung 8x between rounds (0.08 to 0.96 GB/s: a false "more than
    one fault"); its programs are alive (several parts in a row), so once more costs a second
    or less, and a real fault fails again."""
    if rep.ok:
        return True
    return hosts <= 2 and not rep.hung and all(why.startswith("slow ") for _, why in rep.failures)


def _named_within(
    groups: Sequence[Sequence[str]], reps: Sequence[CollectiveReport], bad: Sequence[bool]
) -> Finding | None:
    """The one failing group's own verdict, when it is as good as the all-pairs one: three
    hosts or more (two cannot tell which end), every pair measured, one node or link named."""
    failing = [i for i, b in enumerate(bad) if b]
    if len(failing) != 1:
        return None
    group, rep = groups[failing[0]], reps[failing[0]]
    if not 3 <= len(group) <= ALL_PAIRS_UP_TO:
        return None
    found = _judged(rep, group)
    return found if found.kind in ("node", "link") else None


def _note(rep: CollectiveReport) -> str:
    if rep.ok:
        return f"median link {rep.median:.3g} GB/s"
    host, reason = rep.failures[0]
    more = len(rep.failures) - 1
    return f"{host}: {reason.splitlines()[0]}" + (f"; +{more} more" if more else "")


def _judged(rep: CollectiveReport, hosts: Sequence[str]) -> Finding:
    """The finding of one collective among all the hosts (every link measured)."""
    if rep.ok:
        return Finding("none")
    failed = rep.failed_hosts
    first: dict[str, str] = {}
    for h, r in rep.failures:
        first.setdefault(h, r.splitlines()[0])
    if set(failed) == set(hosts) and not rep.hung and not rep.links:
        h = failed[0]
        return Finding("error", (), f"{h}: {first[h]}")  # no torch, no port: nothing measured
    if len(failed) == 1:
        return Finding("node", (failed[0],), first[failed[0]])
    links = {r for _, r in rep.failures if r.startswith("slow link ")}
    if len(failed) == 2 and len(links) == 1:
        return Finding("link", tuple(failed), next(iter(links)))
    return Finding("several", tuple(failed), "; ".join(f"{h}: {first[h]}" for h in failed[:3]))


def record(job: JobContext, ahead: Ahead | None) -> None:
    """The post-mortem's proof into the result and the live output (``ahead``: what
    :func:`start` began; None: no proof wanted)."""
    if ahead is None:
        return
    say = f"checking every host: a collective among them, after {ahead.why} (post-mortem)"
    job.emit("phase", say, phase=JobPhase.POST_MORTEM)
    proof = prove(job, ahead)
    job.result.post_mortem = proof.to_dict()
    for line in proof.lines():
        job.emit("notice", f"post-mortem proof: {line.strip()}")
