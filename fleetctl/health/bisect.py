"""The post-mortem's plan: which hosts run a collective together in each round, to prove the
one slow or dead node or link after a job ended on a stall, a lost node or a collective
timeout. Pure: the runner (``fleetctl.job.diagnose.proof``) runs each round's groups at once and
feeds back which failed; the golden table is ``tests/pure/test_postmortem_bisect.py``.

Up to ``ALL_PAIRS_UP_TO`` hosts one collective of them all measures every link (the collective
program's every ring shift) and its judge names the node or link: one round. Past it, group
tests: a group fails when the fault is inside it (a faulty node in it, or both ends of a faulty
link), so

* **within S** (the fault is a node of S or a link inside S): halves A and B run at once; the
  failing half is the new S, two passing halves leave a link *across* them, every node good.
  Two hosts left are each tried with a host proven good: the one that fails is the node, none
  failing is the link between them;
* **across A, B** (a link from A to B, every node good): A1+B1 and A2+B2 at once, then (both
  passed) A1+B2 and A2+B1 — at most two rounds per halving of both sides;
* **star c, P** (node c, or a link from c to P; only on three hosts, where a half is one host
  and no host is proven good yet): c with half of P.

A single fault is found in at most 2·log2 N rounds (a node in about log2 N). A link is named
only after the two hosts failed together *and* passed apart; a node only after it failed with
hosts proven good.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

ALL_PAIRS_UP_TO = 8  # the collective program measures every ordered pair up to this many
KINDS = ("node", "link", "pair", "none", "several", "unfinished", "error")

Group = tuple[str, ...]


@dataclass(frozen=True)
class Finding:
    """What the post-mortem proved: ``kind`` (one of ``KINDS``), the hosts it names, and the
    evidence in words (``why``: the judge's reason for an all-pairs round)."""

    kind: str
    hosts: tuple[str, ...] = ()
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "hosts": list(self.hosts), "why": self.why}


@dataclass(frozen=True)
class Round:
    """One round: its groups (run at once), which failed, and each group's figure in words."""

    groups: tuple[Group, ...]
    bad: tuple[bool, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "groups": [list(g) for g in self.groups],
            "bad": list(self.bad),
            "notes": list(self.notes),
        }


def max_rounds(n: int) -> int:
    """The bound the plan keeps: 2·log2 N rounds (at least one)."""
    return max(1, math.floor(2 * math.log2(n))) if n >= 2 else 0


def _halves(xs: Sequence[str]) -> tuple[Group, Group]:
    k = (len(xs) + 1) // 2
    return tuple(xs[:k]), tuple(xs[k:])


Decide = Callable[[Sequence[bool]], None]


@dataclass
class Bisect:
    """The adaptive plan for ``names`` (≥ 2): ``groups()`` is the next round (empty when
    ``finding`` is set), ``feed(bad)`` its outcome, one flag per group."""

    names: Sequence[str]
    rounds: list[Round] = field(default_factory=list)
    finding: Finding | None = None
    good: list[str] = field(default_factory=list)  # hosts proven not to be the faulty node

    def __post_init__(self) -> None:
        self.names = list(self.names)
        self._state: tuple[Any, ...] = ("within", tuple(self.names), False)
        self._next: tuple[list[Group], Decide] | None = None
        if len(self.names) < 2:
            self.finding = Finding("none")

    # ----------------------------------------------------------------------------- stepping
    def groups(self) -> list[Group]:
        while self.finding is None and self._next is None:
            self._next = self._plan()
        return [] if self._next is None else list(self._next[0])

    def feed(self, bad: Sequence[bool], notes: Sequence[str] = ()) -> None:
        groups = self.groups()
        if not groups or self._next is None:
            raise ValueError("no round to feed: the plan is done")
        if len(bad) != len(groups):
            raise ValueError(f"{len(bad)} outcomes for {len(groups)} groups")
        self.rounds.append(Round(tuple(groups), tuple(bool(b) for b in bad), tuple(notes)))
        decide, self._next = self._next[1], None
        decide([bool(b) for b in bad])

    def suspects(self) -> tuple[str, ...]:
        """The hosts the fault may still be in (what an unfinished post-mortem names)."""
        hosts: set[str] = set()
        for part in self._state[1:]:
            if isinstance(part, str):
                hosts.add(part)
            elif isinstance(part, tuple):
                hosts.update(part)
        return tuple(h for h in self.names if h in hosts)

    # ------------------------------------------------------------------------------ states
    def _set(self, *state: Any) -> None:
        self._state = state

    def _found(self, kind: str, *hosts: str) -> None:
        self.finding = Finding(kind, self._order(hosts))

    def _prove_good(self, hosts: Sequence[str]) -> None:
        self.good += [h for h in hosts if h not in self.good]

    def _refs(self, avoid: Sequence[str]) -> list[str]:
        return [h for h in self.good if h not in avoid]

    def _plan(self) -> tuple[list[Group], Decide] | None:
        st = self._state
        if st[0] == "within":
            return self._within(st[1], st[2])
        if st[0] == "star":
            return self._star(st[1], st[2], st[3])
        if st[0] == "cross":
            return self._cross(st[1], st[2], st[3])
        return self._cross2(*st[1:])

    def _within(self, s: Group, tested: bool) -> tuple[list[Group], Decide] | None:
        if len(s) == 1:
            self._found("node", s[0])  # only reached from a failed test of it with good hosts
            return None
        if len(s) == 2:
            a, b = s
            refs = self._refs(s)
            if len(refs) >= 2:

                def pair(bad: Sequence[bool]) -> None:
                    if bad[0] and bad[1]:
                        self._found("several", a, b)
                    elif bad[0] or bad[1]:
                        self._found("node", a if bad[0] else b)
                    elif tested:
                        self._found("link", a, b)
                    else:
                        self._set("cross", (a,), (b,), False)

                return [(a, refs[0]), (b, refs[1])], pair
            if refs:

                def one(bad: Sequence[bool]) -> None:
                    if bad[0]:
                        self._found("node", a)
                    else:
                        self._prove_good([a])
                        self._set("star", b, (a,), tested)

                return [(a, refs[0])], one
            if tested:
                self._found("pair", a, b)
                return None

            def two(bad: Sequence[bool]) -> None:
                self._found("pair", a, b) if bad[0] else self._found("none")

            return [(a, b)], two
        half_a, half_b = _halves(s)
        groups: list[Group] = [half_a]
        refs = self._refs(s)
        padded = len(half_b) >= 2 or bool(refs)
        if padded:
            groups.append(half_b if len(half_b) >= 2 else (half_b[0], refs[0]))

        def split(bad: Sequence[bool]) -> None:
            bad_a, bad_b = bad[0], (bad[1] if padded else None)
            if bad_a and bad_b:
                self._found("several", *s)
            elif bad_a:
                self._prove_good([h for h in self.names if h not in half_a])  # one fault
                self._set("within", half_a, True)
            elif bad_b:
                self._prove_good([h for h in self.names if h not in half_b])
                self._set("within", half_b, True)
            elif bad_b is None:  # one host unpaired (three hosts, none proven yet)
                self._prove_good(half_a)
                self._set("star", half_b[0], half_a, False)
            else:
                self._prove_good(s)
                self._set("cross", half_a, half_b, False)

        return groups, split

    def _star(self, c: str, p: Group, tested: bool) -> tuple[list[Group], Decide] | None:
        """Node ``c`` or a link from it to ``p`` (good hosts)."""
        if len(p) == 1:
            if not tested:

                def first(bad: Sequence[bool]) -> None:
                    self._set("star", c, p, True) if bad[0] else self._found("none")

                return [(c, p[0])], first
            refs = self._refs((c, *p))
            if not refs:
                self._found("pair", c, p[0])
                return None

            def last(bad: Sequence[bool]) -> None:
                self._found("node", c) if bad[0] else self._found("link", c, p[0])

            return [(c, refs[0])], last
        p1, p2 = _halves(p)

        def half(bad: Sequence[bool]) -> None:
            if bad[0]:
                self._set("star", c, p1, True)
            else:
                self._prove_good([c])
                self._set("cross", (c,), p2, False)

        return [(c, *p1)], half

    def _cross(self, a: Group, b: Group, tested: bool) -> tuple[list[Group], Decide] | None:
        """A link from ``a`` to ``b``; every node good."""
        if len(a) == 1 and len(b) == 1:
            if tested:
                self._found("link", a[0], b[0])
                return None

            def pair(bad: Sequence[bool]) -> None:
                self._found("link", a[0], b[0]) if bad[0] else self._found("none")

            return [(a[0], b[0])], pair
        if len(a) == 1 or len(b) == 1:
            one, many = (a, b) if len(a) == 1 else (b, a)
            m1, m2 = _halves(many)

            def half(bad: Sequence[bool]) -> None:
                # passing: by elimination the rest (proven when the whole failed)
                self._set("cross", one, m1, True) if bad[0] else self._set("cross", one, m2, tested)

            return [self._order((*one, *m1))], half
        a1, a2 = _halves(a)
        b1, b2 = _halves(b)

        def straight(bad: Sequence[bool]) -> None:
            if bad[0] and bad[1]:
                self._found("several", *a, *b)
            elif bad[0]:
                self._set("cross", a1, b1, True)
            elif bad[1]:
                self._set("cross", a2, b2, True)
            else:
                self._set("cross2", a1, a2, b1, b2)

        return [self._order((*a1, *b1)), self._order((*a2, *b2))], straight

    def _cross2(
        self, a1: Group, a2: Group, b1: Group, b2: Group
    ) -> tuple[list[Group], Decide] | None:
        def diagonal(bad: Sequence[bool]) -> None:
            if bad[0] and bad[1]:
                self._found("several", *a1, *a2, *b1, *b2)
            elif bad[0]:
                self._set("cross", a1, b2, True)
            elif bad[1]:
                self._set("cross", a2, b1, True)
            else:
                self._found("none")

        return [self._order((*a1, *b2)), self._order((*a2, *b1))], diagonal

    def _order(self, hosts: Sequence[str]) -> Group:
        return tuple(h for h in self.names if h in set(hosts))


# ----------------------------------------------------------------------------- the proof


def verdict_line(finding: Finding) -> str:
    """The finding in words (``node3 is slow or dead: …``); ``why`` replaces the default
    evidence of a node or link and is added to the others."""
    h, why = finding.hosts, finding.why
    if finding.kind == "node":
        return f"{h[0]} is slow or dead: {why or 'it failed with hosts that pass without it'}"
    if finding.kind == "link":
        return f"the link {h[0]} - {h[1]} is slow or dead: " + (
            why or f"{h[0]} and {h[1]} fail together and pass apart"
        )
    if finding.kind == "pair":
        return f"{h[0]}, {h[1]} or the link between them is slow or dead (two hosts cannot tell)"
    if finding.kind == "none":
        return "no slow or dead node or link among them now: every collective passed"
    if finding.kind == "several":
        return f"more than one fault among {', '.join(h)}" + (f": {why}" if why else "")
    if finding.kind == "unfinished":
        return f"no proof in time; still suspect: {', '.join(h)}" + (f" ({why})" if why else "")
    return "no proof: the collective did not run" + (f": {why}" if why else "")


def proof_lines(
    finding: Finding,
    rounds: Sequence[Round],
    *,
    hosts: Sequence[str],
    unreachable: Sequence[str] = (),
    cut: Sequence[str] = (),
    elapsed: float = 0.0,
) -> list[str]:
    """The proof as the summary prints it under the verdict: the hosts out of reach, then the
    finding with what ran, then each round."""
    lines = [
        f"{h}: unreachable over SSH after the job: no collective run with it" for h in unreachable
    ]
    lines += [
        f"{h}: its data link is down (no peer reaches it): no collective run with it" for h in cut
    ]
    if len(hosts) >= 2:
        n = len(rounds)
        ran = f"collective among {', '.join(hosts)}: {n} round{'s' * (n != 1)}, {elapsed:.1f} s"
        lines.append(f"{verdict_line(finding)} ({ran})")
    for i, r in enumerate(rounds, 1):
        parts = []
        for j, g in enumerate(r.groups):
            note = r.notes[j] if j < len(r.notes) and r.notes[j] else ""
            parts.append(
                f"{'+'.join(g)} {'failed' if r.bad[j] else 'passed'}"
                + (f" ({note})" if note else "")
            )
        lines.append(f"  round {i}: " + "; ".join(parts))
    return lines
