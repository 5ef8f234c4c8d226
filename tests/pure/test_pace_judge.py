"""The slow-node judge (``fleetctl.job.diagnose.pace``) as a golden table: rounds of node reports
in, the node named (or nobody) out. Healthy fleets, noisy or alike, must never name anyone."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from fleetctl.job.diagnose.pace import AGREE, PaceJudge, judge_for

HOSTS = {0: "gpu01", 1: "gpu02", 2: "gpu03"}
Row = tuple[float, float | None]  # (busy, throttled) of one node in one round


def _report(busy: float, throttled: float | None, cpu: float = 0.2) -> dict[str, Any]:
    return {"span": 2.0, "ranks": {"0": {"busy": busy, "cpu": cpu}}, "throttled": throttled}


def _judge(rounds: list[list[Row]], hosts: dict[int, str] = HOSTS) -> Any:
    """Feed every round, each node in turn; the verdict and the round it came in."""
    judge = PaceJudge(hosts)
    for i, round_ in enumerate(rounds):
        for rank, (busy, thr) in enumerate(round_):
            got = judge.add(rank, _report(busy, thr))
            if got is not None:
                return got, i
    return None, None


def _noisy(seed: int, n: int = 20, lo: float = 0.2, hi: float = 0.95) -> list[list[Row]]:
    rnd = random.Random(seed)
    return [[(rnd.uniform(lo, hi), None) for _ in HOSTS] for _ in range(n)]


SLOW_GPU = [[(0.2, None), (0.25, None), (0.95, None)]] * 6
CAPPED = [[(0.45, None), (0.4, None), (0.3, 0.6)]] * 6  # the lab's cpu-cap: gloo's threads held
CASES: dict[str, tuple[list[list[Row]], int | None, str]] = {
    # name: (rounds, the node named or None, words its evidence holds)
    "a node computing while its peers wait is named": (SLOW_GPU, 2, "compute ~4.2× longer"),
    "a throttled node whose peers are not is named": (CAPPED, 2, "throttled in 60% of periods"),
    "named once it shows in 4 of the last 6 rounds": (
        [[(0.9, None), (0.9, None), (0.9, None)]] * 3  # start-up: every node busy
        + [SLOW_GPU[0], [(0.3, None), (0.4, None), (0.7, None)]]
        + SLOW_GPU[:3],
        2,
        "peers wait in collectives",
    ),
    "a healthy fleet busy alike names nobody": ([[(0.9, None)] * 3] * 20, None, ""),
    "a healthy fleet waiting alike names nobody": ([[(0.1, None)] * 3] * 20, None, ""),
    "a noisy healthy fleet names nobody": (_noisy(1), None, ""),
    "another noisy healthy fleet names nobody": (_noisy(7, lo=0.05, hi=0.7), None, ""),
    "two slow nodes alike: neither is named": (
        [[(0.2, None), (0.9, None), (0.95, None)]] * 10,
        None,
        "",
    ),
    "weak evidence names nobody": ([[(0.3, None), (0.3, None), (0.55, None)]] * 10, None, ""),
    "peers that are busy too: nobody": ([[(0.6, None), (0.6, None), (0.95, None)]] * 10, None, ""),
    "a suspect that moves between nodes is never named": (
        [[(0.2, None), (0.95, None), (0.2, None)], [(0.2, None), (0.2, None), (0.95, None)]] * 6,
        None,
        "",
    ),
    "three rounds of six are not enough": (
        [SLOW_GPU[0], [(0.5, None)] * 3] * 6,
        None,
        "",
    ),
    "every node throttled (quotas everywhere): nobody": ([[(0.4, 0.5)] * 3] * 10, None, ""),
    "a throttled node that is not the busy one: two stories, nobody": (
        [[(0.2, None), (0.25, 0.6), (0.95, None)]] * 10,
        None,
        "",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_judge_names_the_node_the_others_wait_for_or_nobody(name: str) -> None:
    rounds, want, words = CASES[name]
    got, _ = _judge(rounds)
    if want is None:
        assert got is None, got
        return
    assert got is not None and got.rank == want and got.host == HOSTS[want]
    assert words in got.why
    assert got.line().startswith(f"node {want} ({HOSTS[want]}) slows the job: ")


def test_the_verdict_is_typed_data_with_its_evidence() -> None:
    got, at = _judge(SLOW_GPU)
    assert at == 3  # the 4th round
    d = got.to_dict()
    assert d == {
        "rank": 2,
        "host": "gpu03",
        "busy": 0.95,
        "peers_wait": 0.775,
        "compute_ratio": 4.22,
        "throttled": None,
        "rounds": 4,
        "at_round": 4,  # the job's 4th round of reports named it
        "why": "its ranks compute ~4.2× longer per step; peers wait in collectives 78% of the time",
        "stacks": None,  # py-spy's shares, once sampled (test_slow_stacks.py)
        "progress": None,  # a progress-rate verdict's figures (test_progress_rate.py)
        "seconds": None,  # the judge has no clock: the job stamps it (at_launch)
        "line": "node 2 (gpu03) slows the job: its ranks compute ~4.2× longer per step; peers "
        "wait in collectives 78% of the time",
    }


def test_the_verdict_says_how_long_after_the_launch_it_came_and_keeps_it_with_its_stacks() -> None:
    from fleetctl.job.diagnose.slowstacks import from_replies

    got, _ = _judge(SLOW_GPU)
    assert got.at_launch(None, 1000.0) is got  # no launch time (an older record): as it was
    stamped = got.at_launch(1000.0, 1023.46)
    assert (stamped.seconds, stamped.at_round, stamped.rounds) == (23.5, 4, 4)
    assert got.at_launch(1000.0, 999.0).seconds == 0.0  # a clock stepped back: never negative
    stacked = stamped.with_stacks(from_replies(2, HOSTS, {"error": "no py-spy"}))
    assert stacked.to_dict()["seconds"] == 23.5


def test_a_node_is_named_once_and_a_one_node_job_never() -> None:
    judge = PaceJudge(HOSTS)
    said = [
        judge.add(r, _report(b, t)) for round_ in SLOW_GPU * 3 for r, (b, t) in enumerate(round_)
    ]
    assert len([v for v in said if v is not None]) == 1
    alone = PaceJudge({0: "gpu01"})
    assert all(alone.add(0, _report(0.99, 0.9)) is None for _ in range(20))


def test_a_report_without_rank_samples_or_from_an_unknown_node_is_ignored() -> None:
    judge = PaceJudge(HOSTS)
    assert judge.add(0, {"ranks": {}}) is None
    assert judge.add(0, {"ranks": "nonsense"}) is None
    assert judge.add(7, _report(0.9, None)) is None
    assert judge.fresh == {}


def test_each_round_gives_every_host_a_score_for_the_metrics() -> None:
    """The metrics' slow-node series: a host's busy share over its peers' median, per round
    (1: like its peers), counted rounds so the caller knows when one ended."""
    judge = PaceJudge(HOSTS)
    assert judge.scores() == {} and judge.count == 0
    for rank, busy in enumerate((0.2, 0.25, 0.9)):
        judge.add(rank, _report(busy, None))
    assert judge.count == 1
    assert judge.scores() == {"gpu01": 0.348, "gpu02": 0.455, "gpu03": 4.0}


@pytest.mark.parametrize(("rounds", "named_in"), [(1, 0), (2, 1), (4, 3), (6, 5)])
def test_slow_rounds_is_how_many_rounds_name_the_node_before_it_is_named(
    rounds: int, named_in: int
) -> None:
    """``run --slow-rounds N`` (RunSpec's ``slow_rounds``, handed to the judge by the run):
    a steadily slow node is named in round N; the default is the judge's own 4."""
    from fleetctl.api.runspec import RunSpec

    judge = PaceJudge(HOSTS, RunSpec.build("t.py", slow_rounds=rounds).supervision.slow_rounds)
    seen = []
    for i, round_ in enumerate(SLOW_GPU):
        for rank, (busy, thr) in enumerate(round_):
            if judge.add(rank, _report(busy, thr)) is not None:
                seen.append(i)
    assert seen == [named_in]
    assert RunSpec().supervision.slow_rounds == PaceJudge(HOSTS).agree == 4


def test_a_role_job_is_judged_by_role_never_across_roles() -> None:
    """A parameter server is idle while trainers compute: judged against the trainers it would
    look like their victim. By role, the trainer the other trainers wait for is named; the lone
    server is not judged."""
    hosts = {0: "ps1", 1: "tr1", 2: "tr2", 3: "tr3"}
    roles = {0: "server", 1: "trainer", 2: "trainer", 3: "trainer"}
    judge = judge_for(hosts, roles, AGREE)
    assert [sorted(j.nodes) for j in judge.judges] == [[1, 2, 3]]
    said = []
    for _ in range(6):
        for rank, busy in ((0, 0.05), (1, 0.2), (2, 0.25), (3, 0.95)):
            said.append(judge.add(rank, _report(busy, None)))
    [verdict] = [v for v in said if v is not None]
    assert (verdict.rank, verdict.host) == (3, "tr3") and judge.count == 4
    assert set(judge.scores()) == {"tr1", "tr2", "tr3"}
    whole = judge_for(hosts, None, AGREE)  # no roles: one group of all four
    assert [sorted(j.nodes) for j in whole.judges] == [[0, 1, 2, 3]]


def test_the_monitor_reads_a_role_jobs_roles_through_its_record(tmp_path: Path) -> None:
    """The detached monitor's slow-node watch judges by role: roles.json (golden, as written
    before the records) read through ``RolesRecord``; none, or a malformed one, is no roles."""
    from types import SimpleNamespace

    from fleetctl.job.monitor.slowwatch import _roles
    from fleetctl.job.records.runfolder import RunFolder

    h: Any = SimpleNamespace(folder=RunFolder(tmp_path))
    assert _roles(h) is None
    golden = Path(__file__).parent / "records" / "roles.json"
    (tmp_path / "roles.json").write_bytes(golden.read_bytes())
    assert _roles(h) == {0: "server", 1: "trainer", 2: "trainer"}
    (tmp_path / "roles.json").write_text('{"tasks": [{"rank": "0", "role": "server"}]}')
    assert _roles(h) is None
