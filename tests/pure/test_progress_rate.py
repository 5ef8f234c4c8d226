"""The progress-rate judge (``fleetctl.job.diagnose.progress_rate``) as a golden table: each
node's printed progress over time in, the node named (or nobody) out. Alike fleets, a
synchronous job's lockstep, missing or mixed markers must never name anyone."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from fleetctl.job.diagnose.progress_rate import ProgressJudge, progress_judge
from fleetctl.remote.kit.progress import compile_own

HOSTS = {0: "node1", 1: "node2", 2: "node3"}
Say = Callable[[int, int], str | None]  # (node rank, its step) -> the line it prints, or None


def STEP(_rank: int, n: int) -> str:
    return f"step {n}"


def _run(
    rates: list[float],
    say: Say = STEP,
    seconds: float = 60.0,
    judge: ProgressJudge | None = None,
    jitter: float = 0.0,
) -> tuple[object, float | None]:
    """Every node prints its step every 0.5 s at its rate (steps per second); the verdict and
    when it came."""
    judge = judge or progress_judge(HOSTS, None, 4)
    rnd = random.Random(3)
    done = [0.0] * len(rates)
    t = 0.0
    while t < seconds:
        t += 0.5
        for rank, rate in enumerate(rates):
            done[rank] += rate * 0.5 * (1 + rnd.uniform(-jitter, jitter))
            line = say(rank, int(done[rank]))
            got = judge.lines(rank, t, [] if line is None else [line])
            if got is not None:
                return got, t
    return None, None


def mnist(_rank: int, n: int) -> str:
    """pytorch/examples mnist's line, 64 samples a step, 938 steps an epoch."""
    epoch, step = divmod(n, 938)
    return f"Train Epoch: {epoch + 1} [{step * 64}/60000 ({100 * step // 938}%)]\tLoss: 0.3"


CASES: dict[str, tuple[list[float], Say, int | None]] = {
    # name: (steps per second by node, what each prints, the node named or None)
    "a node progressing 4x slower is named": ([20, 20, 5], STEP, 2),
    "mnist's lines across epochs: the slow node is named": ([400, 400, 90], mnist, 2),
    "a tqdm bar per node": ([30, 8, 30], lambda _r, n: f"{n}/100000 [00:01<00:09, 3it/s]", 1),
    "an alike fleet names nobody": ([20, 21, 19], STEP, None),
    "a synchronous job's lockstep names nobody": ([20, 20, 20], STEP, None),
    "a node just under half its peers' rate is not named": ([20, 20, 11], STEP, None),
    "two slow nodes alike: neither is named": ([20, 5, 5], STEP, None),
    "peers that are not alike: nobody": ([40, 15, 5], STEP, None),
    "a node printing no markers: nobody": (
        [20, 20, 5],
        lambda r, n: None if r == 0 else f"step {n}",
        None,
    ),
    "nodes printing different shapes: nobody": (
        [20, 20, 5],
        lambda r, n: f"iter {n}" if r == 2 else f"step {n}",
        None,
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_judge_names_the_node_that_falls_behind_or_nobody(name: str) -> None:
    rates, say, want = CASES[name]
    got, at = _run(rates, say)
    if want is None:
        assert got is None, got
        return
    assert got is not None and got.rank == want and got.host == HOSTS[want]  # type: ignore[attr-defined]
    assert at is not None and at <= 20.0, at  # within the window: SPAN + AGREE rounds
    assert "slower (" in got.why  # type: ignore[attr-defined]


def test_a_noisy_but_alike_fleet_never_names_anyone() -> None:
    got, _ = _run([20, 20, 20], jitter=0.6, seconds=120)
    assert got is None, got


def test_the_verdict_is_the_pace_judges_shape_with_a_progress_block() -> None:
    got, _ = _run([20, 20, 5])
    d = got.to_dict()  # type: ignore[attr-defined]
    assert d["rank"] == 2 and d["host"] == "node3" and d["rounds"] == 4
    assert d["busy"] is None and d["peers_wait"] is None and d["stacks"] is None
    assert 3.5 <= d["compute_ratio"] <= 4.5
    p = d["progress"]
    assert p["shape"] == "step" and p["unit"] == "steps" and 4.5 <= p["rate"] <= 5.5
    assert d["line"].startswith("node 2 (node3) slows the job: its ranks progress ~")
    assert "× slower (steps " in d["line"] and " vs " in d["line"] and " s)" in d["line"]


def test_nothing_is_named_once_a_node_has_ended() -> None:
    judge = progress_judge(HOSTS, None, 4)
    judge.end(0)  # a fast node finished: its silence from now is no slowness
    got, _ = _run([20, 20, 5], judge=judge)
    assert got is None


def test_a_role_job_is_judged_by_role() -> None:
    # a parameter server printing no steps at all and two trainers alike: nobody; the
    # trainers' slow one among three trainers is named
    hosts = {0: "ps1", 1: "w1", 2: "w2", 3: "w3"}
    roles = {0: "ps", 1: "worker", 2: "worker", 3: "worker"}
    judge = progress_judge(hosts, roles, 4)
    got, _ = _run([0.5, 20, 20, 5], judge=judge)
    assert got is not None and got.host == "w3"  # type: ignore[attr-defined]
    judge = progress_judge(hosts, roles, 4)
    got, _ = _run([0.5, 20, 20, 20], judge=judge)  # the ps is slowest, but alone in its role
    assert got is None


def test_the_jobs_own_regex_is_what_is_measured() -> None:
    judge = progress_judge(HOSTS, None, 4, compile_own(r"shard (\d+) done"))
    got, _ = _run([20, 20, 5], lambda _r, n: f"shard {n} done; step {3 * n}", judge=judge)
    assert got is not None and got.rank == 2 and got.progress["shape"] == "own"  # type: ignore[attr-defined]


def test_a_withdrawn_verdict_lets_the_judge_go_on() -> None:
    judge = progress_judge(HOSTS, None, 4)
    got, at = _run([20, 20, 5], judge=judge)
    assert got is not None and at is not None and judge.suspects() == {2}
    judge.withdraw()  # the pace judge suspects another node: refused, judged on
    again = None
    for k in range(1, 6):
        t = at + 2.0 * k
        for rank, rate in enumerate([20, 20, 5]):
            again = again or judge.lines(rank, t, [f"step {int(rate * t)}"])
    assert again is not None and again.rank == 2


def test_only_the_span_of_markers_is_kept_whatever_the_line_rate() -> None:
    judge = progress_judge(HOSTS, None, 4)
    for k in range(2000):  # 20 lines a second for 100 s, in shapes never measured together
        t = k / 20
        judge.lines(0, t, [f"step {k}", f"{k}/9999 [00:01<00:09, 3it/s]"])
        judge.lines(1, t, [f"iter {k}"])
    kept = [len(s.points) for per in judge.series.values() for s in per.values()]
    assert kept and max(kept) <= 20 * 12 + 40, kept  # SPAN's worth (a round's lag at most)


def test_a_flood_batch_is_read_by_its_last_lines_only() -> None:
    """A node's batch of thousands of lines costs SCAN regex scans, not thousands: its newest
    markers are read (a count only grows), one buried deeper is not."""
    from fleetctl.job.diagnose.progress_rate import SCAN

    judge = progress_judge(HOSTS, None, 4)
    noise = ["payload line 42 of a log flood"] * 5000
    judge.lines(0, 100.0, ["iter 7 loss 1.0", *noise[:SCAN]])
    assert not any(judge.series.get(0, {}).values()), judge.series
    judge.lines(0, 101.0, [*noise, "iter 9 loss 1.0"])
    assert [k for _, k in judge.series[0]] == ["iter"], judge.series


def test_a_batch_without_any_shapes_word_is_passed_over_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A log flood's batch with none of the shapes' words costs one joined substring test,
    not a parse per line; a single marker line among the noise is still read."""
    from fleetctl.job.diagnose import progress_rate

    calls: list[str] = []
    real = progress_rate.parse

    def counted(line: str, own: object = None) -> list[object]:
        calls.append(line)
        return real(line, own)  # type: ignore[arg-type]

    monkeypatch.setattr(progress_rate, "parse", counted)
    judge = progress_judge(HOSTS, None, 4)
    flood = [f"L0:{i:07d} " + "x" * 40 for i in range(5000)]
    judge.lines(0, 100.0, flood)
    assert calls == []
    judge.lines(0, 101.0, [*flood[:40], "Iter 9 loss 1.0", *flood[:20]])
    assert len(calls) == 61
    assert [k for _, k in judge.series[0]] == ["iter"], judge.series
