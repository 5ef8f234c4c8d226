"""The post-mortem's bisection plan as a golden table: which hosts run a collective together in
each round, for one bad node or link among N hosts, within 2·log2 N rounds; and the proof as
the summary prints it."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from fleetctl.health.bisect import Bisect, Finding, Round, max_rounds, proof_lines


def _fails(fault: tuple[str, ...], group: tuple[str, ...]) -> bool:
    """A group fails when the bad node is in it, or both ends of the bad link."""
    return bool(fault) and all(h in group for h in fault)


def _run(n: int, fault: tuple[str, ...]) -> Bisect:
    plan = Bisect([f"n{i}" for i in range(1, n + 1)])
    while groups := plan.groups():
        plan.feed([_fails(fault, g) for g in groups])
    return plan


def _short(hosts: tuple[str, ...], sep: str) -> str:
    return sep.join(h[1:] for h in hosts)


# N, the fault (one host: that node; two: the link between them), each round's groups
# ("!": it failed), what the plan names
GOLDEN = [
    (2, "2", ["1+2!"], "pair 1-2"),  # two hosts cannot tell which end
    (2, "1-2", ["1+2!"], "pair 1-2"),
    (3, "3", ["1+2", "3+1!", "3+2!"], "node 3"),
    (3, "1", ["1+2!", "1+3!"], "node 1"),
    (3, "1-3", ["1+2", "3+1!", "3+2"], "link 1-3"),
    (3, "1-2", ["1+2!", "1+3", "2+3"], "link 1-2"),
    (4, "3", ["1+2 3+4!", "3+1! 4+2"], "node 3"),
    (4, "1-4", ["1+2 3+4", "1+3 2+4", "1+4! 2+3"], "link 1-4"),
    (4, "3-4", ["1+2 3+4!", "3+1 4+2"], "link 3-4"),
    (8, "6", ["1+2+3+4 5+6+7+8!", "5+6! 7+8", "5+1 6+2!"], "node 6"),
    (
        8,
        "1-8",
        ["1+2+3+4 5+6+7+8", "1+2+5+6 3+4+7+8", "1+2+7+8! 3+4+5+6", "1+7 2+8", "1+8! 2+7"],
        "link 1-8",
    ),
    (8, "2-3", ["1+2+3+4! 5+6+7+8", "1+2 3+4", "1+3 2+4", "1+4 2+3!"], "link 2-3"),
    (
        16,
        "11",
        [
            "1+2+3+4+5+6+7+8 9+10+11+12+13+14+15+16!",
            "9+10+11+12! 13+14+15+16",
            "9+10 11+12!",
            "11+1! 12+2",
        ],
        "node 11",
    ),
    (
        16,
        "1-16",
        [
            "1+2+3+4+5+6+7+8 9+10+11+12+13+14+15+16",
            "1+2+3+4+9+10+11+12 5+6+7+8+13+14+15+16",
            "1+2+3+4+13+14+15+16! 5+6+7+8+9+10+11+12",
            "1+2+13+14 3+4+15+16",
            "1+2+15+16! 3+4+13+14",
            "1+15 2+16",
            "1+16! 2+15",
        ],
        "link 1-16",
    ),
    (
        16,
        "9-10",
        [
            "1+2+3+4+5+6+7+8 9+10+11+12+13+14+15+16!",
            "9+10+11+12! 13+14+15+16",
            "9+10! 11+12",
            "9+1 10+2",
        ],
        "link 9-10",
    ),
]


@pytest.mark.parametrize("n,fault,rounds,named", GOLDEN, ids=[f"{g[0]}:{g[1]}" for g in GOLDEN])
def test_each_round_runs_these_groups_and_names_the_fault(
    n: int, fault: str, rounds: list[str], named: str
) -> None:
    plan = _run(n, tuple(f"n{x}" for x in fault.split("-")))
    got = [
        " ".join(
            _short(g, "+") + ("!" if bad else "") for g, bad in zip(r.groups, r.bad, strict=True)
        )
        for r in plan.rounds
    ]
    assert got == rounds
    assert plan.finding is not None
    assert f"{plan.finding.kind} {_short(plan.finding.hosts, '-')}" == named
    assert len(plan.rounds) <= max_rounds(n)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 17])
def test_every_single_fault_is_named_within_two_log2_n_rounds_in_disjoint_groups(n: int) -> None:
    names = [f"n{i}" for i in range(1, n + 1)]
    for fault in [(h,) for h in names] + list(combinations(names, 2)):
        plan = _run(n, fault)
        assert len(plan.rounds) <= max_rounds(n), (fault, plan.rounds)
        for r in plan.rounds:
            hosts = [h for g in r.groups for h in g]
            assert len(hosts) == len(set(hosts)) and all(len(g) >= 2 for g in r.groups)
        f = plan.finding
        assert f is not None
        want = "pair" if n == 2 else ("node" if len(fault) == 1 else "link")
        assert (f.kind, set(f.hosts)) == (want, set(names if n == 2 else fault)), (fault, f)


def test_a_fleet_with_no_fault_passes_every_round_and_names_nobody() -> None:
    plan = _run(16, ())
    assert plan.finding == Finding("none") and len(plan.rounds) == 3


def test_two_faults_are_said_to_be_more_than_one() -> None:
    plan = Bisect(["a", "b", "c", "d"])
    plan.feed([True, True])
    assert plan.finding == Finding("several", ("a", "b", "c", "d"))


def test_the_proof_names_the_host_out_of_reach_the_finding_and_each_round() -> None:
    rounds = [
        Round((("n1", "n2"), ("n3", "n4")), (False, True), ("ok 0.21 GB/s", "hung")),
        Round((("n3", "n1"), ("n4", "n2")), (True, False), ("hung", "ok 0.2 GB/s")),
    ]
    lines = proof_lines(
        Finding("node", ("n3",)),
        rounds,
        hosts=["n1", "n2", "n3", "n4"],
        unreachable=["n5"],
        cut=["n6"],
        elapsed=4.25,
    )
    assert lines == [
        "n5: unreachable over SSH after the job: no collective run with it",
        "n6: its data link is down (no peer reaches it): no collective run with it",
        "n3 is slow or dead: it failed with hosts that pass without it "
        "(collective among n1, n2, n3, n4: 2 rounds, 4.2 s)",
        "  round 1: n1+n2 passed (ok 0.21 GB/s); n3+n4 failed (hung)",
        "  round 2: n3+n1 failed (hung); n4+n2 passed (ok 0.2 GB/s)",
    ]


@pytest.mark.parametrize(
    "finding,line",
    [
        (
            Finding("node", ("gpu3",), "slow node (recv side) busbw 0.0061 GB/s < 0.05 GB/s"),
            "gpu3 is slow or dead: slow node (recv side) busbw 0.0061 GB/s < 0.05 GB/s",
        ),
        (
            Finding("link", ("a", "b")),
            "the link a - b is slow or dead: a and b fail together and pass apart",
        ),
        (
            Finding("pair", ("a", "b")),
            "a, b or the link between them is slow or dead (two hosts cannot tell)",
        ),
        (Finding("none"), "no slow or dead node or link among them now: every collective passed"),
        (
            Finding("unfinished", ("a", "b"), "10 s"),
            "no proof in time; still suspect: a, b (10 s)",
        ),
        (
            Finding("error", (), "a: torch missing"),
            "no proof: the collective did not run: a: torch missing",
        ),
    ],
)
def test_each_finding_reads_as_one_line(finding: Finding, line: str) -> None:
    (got,) = proof_lines(finding, [], hosts=["a", "b"])
    assert got.split(" (collective among")[0] == line


def _result(states: list[str], *, verdict: str | None = None, tail: str = "") -> Any:
    from fleetctl.job.records.result import JobResult, NodeOutcome

    nodes = [NodeOutcome(i, f"n{i + 1}", f"10.0.0.{i + 1}", state=s) for i, s in enumerate(states)]
    failed = next((i for i, s in enumerate(states) if s == "failed"), None)
    if failed is not None and tail:
        nodes[failed].tail.extend(tail.splitlines())
    return JobResult("j1", Path("/nonexistent"), "failed", nodes, failed, verdict=verdict)


@pytest.mark.parametrize(
    "states,verdict,tail,why",
    [
        (["stopped", "lost", "stopped"], None, "", "a lost node"),
        (["stopped", "stopped"], "stalled: no progress on any node for 4 s", "", "a stall"),
        (
            ["failed", "stopped"],
            None,
            "[E] Watchdog caught collective operation timeout",
            "a collective timeout",
        ),
        (
            ["failed", "stopped"],
            None,
            "RuntimeError: Connection closed by peer [10.0.0.2]:3",
            "a collective timeout",
        ),
        (["failed", "stopped"], None, "ZeroDivisionError: division by zero", None),
        (["stopped", "stopped"], "timed out after 4 s", "", None),
    ],
)
def test_the_proof_runs_after_a_stall_a_lost_node_or_a_collective_timeout_only(
    states: list[str], verdict: str | None, tail: str, why: str | None
) -> None:
    from fleetctl.job.diagnose.proof import wanted

    assert wanted(_result(states, verdict=verdict, tail=tail)) == why


def test_the_hosts_a_proof_names_go_to_the_ledger_with_their_reason() -> None:
    from fleetctl.job.diagnose.proof import named_hosts
    from fleetctl.job.run.spares import faulty_hosts

    proof = {
        "unreachable": ["n2"],
        "cut": [],
        "finding": {"kind": "link", "hosts": ["n1", "n3"]},
        "named": ["n2", "n1", "n3"],
    }
    assert named_hosts(proof) == {
        "n2": "unreachable over SSH after the job",
        "n1": "slow or dead link n1 - n3 (post-mortem collective)",
        "n3": "slow or dead link n1 - n3 (post-mortem collective)",
    }
    result = _result(["stopped", "stopped", "stopped"], verdict="stalled")
    result.post_mortem = proof
    assert set(faulty_hosts(result)) == {"n1", "n2", "n3"}
    assert result.proven() == named_hosts(proof)
    assert named_hosts(None) == {} and _result(["stopped"], verdict=None).proven() == {}


def test_the_summary_prints_the_proof_under_a_stall_s_verdict() -> None:
    from fleetctl.cli.render_summary import run_summary_lines

    result = _result(["stopped", "stopped", "stopped"], verdict="stalled: no progress for 3 s")
    result.post_mortem = {
        "lines": [
            "n3 is slow or dead: slow node (recv side) (collective among n1, n2, n3: 1 round, 9 s)",
            "  round 1: n1+n2+n3 failed (n3: slow node (recv side))",
        ]
    }
    lines = run_summary_lines(result)
    assert lines[1:3] == [
        "  post-mortem proof: n3 is slow or dead: slow node (recv side) "
        "(collective among n1, n2, n3: 1 round, 9 s)",
        "    round 1: n1+n2+n3 failed (n3: slow node (recv side))",
    ]
    assert lines[0].startswith("Job j1 failed: stalled: no progress for 3 s")
