"""A detached job's progress, judged by its monitor: each supervisor's tally of its ranks'
markers (``remote/kit/progress.py: Tally``, pace.json's ``progress``) placed in the monitor's
clock (``job/monitor/slowwatch.py: placed``) and fed to the same progress-rate judge as an
attached run's lines. Golden cases of the record, and the judge fed by real tallies."""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl.job.diagnose.progress_rate import progress_judge
from fleetctl.job.monitor.slowwatch import placed
from fleetctl.remote.kit.progress import Tally

HOSTS = {0: "node1", 1: "node2", 2: "node3"}

PLACED: list[tuple[str, dict[str, Any], list[tuple[str, str, float, float]]]] = [
    # (case, the status's pace entry, the counts in the monitor's clock at 50.0)
    (
        "a count said 1.5 s before status answered is placed 1.5 s before the poll",
        {"seq": 3, "now": 1000.0, "report": {"progress": [["", "mnist", 998.5, 640]]}},
        [("", "mnist", 48.5, 640.0)],
    ),
    (
        "a node's clock an hour ahead: the same place (only its own clock is compared)",
        {"seq": 3, "now": 4600.0, "report": {"progress": [["2", "step", 4598.5, 7.0]]}},
        [("2", "step", 48.5, 7.0)],
    ),
    ("a report with no progress (attached or older)", {"seq": 1, "report": {"ranks": {}}}, []),
    (
        "no node clock (an older supervisor's status): nothing placed",
        {"seq": 1, "report": {"progress": [["", "step", 1.0, 2.0]]}},
        [],
    ),
    (
        "malformed rows are passed over, the good one kept",
        {
            "seq": 2,
            "now": 10.0,
            "report": {
                "progress": [
                    ["", "step", 9.0],
                    ["", "step", "9", 2],
                    [1, "step", 9.0, 2],
                    7,
                    ["", "step", True, 2],
                    ["", "iter", 9.0, 4],
                ]
            },
        },
        [("", "iter", 49.0, 4.0)],
    ),
]


@pytest.mark.parametrize(("case", "pace", "want"), PLACED, ids=[p[0][:50] for p in PLACED])
def test_a_nodes_tallied_counts_are_placed_in_the_monitors_clock(
    case: str, pace: dict[str, Any], want: list[tuple[str, str, float, float]]
) -> None:
    assert placed(pace, 50.0) == want, case


def _monitor(rates: list[float], skews: list[float], seconds: float = 60.0) -> tuple[Any, float]:
    """Three nodes print mnist's lines at their rates (steps/s, 64 samples a step, 100 steps
    an epoch) into their supervisors' tallies (each on its own clock); every 2 s each reports
    and the monitor polls, as a detached job runs. The verdict and when it came (or None)."""
    clocks = [0.0, 0.0, 0.0]
    tallies = [Tally(clock=lambda i=i: clocks[i] + skews[i]) for i in range(3)]
    judge = progress_judge(HOSTS, None, 4)
    done, t = [0.0] * 3, 0.0
    while t < seconds:
        for _ in range(20):  # lines every 0.1 s between two reports
            t += 0.1
            for i, rate in enumerate(rates):
                clocks[i] = t
                before = int(done[i])
                done[i] += rate * 0.1
                for n in range(before + 1, int(done[i]) + 1):
                    epoch, step = divmod(n, 100)
                    line = f"Train Epoch: {epoch + 1} [{step * 64}/6400 ({step}%)]\tLoss: 0.3"
                    tallies[i].line(line.encode())
        for i in range(3):
            pace = {"seq": 1, "now": t + skews[i], "report": {"progress": tallies[i].report()}}
            judge.counts(i, placed(pace, t + 0.05))  # status answered 50 ms later
        got = judge.tick(t + 0.05)
        if got is not None:
            return got, t
    return None, t


def test_a_monitor_names_the_node_whose_tally_falls_behind_whatever_its_clock() -> None:
    verdict, at = _monitor([10.0, 2.5, 10.0], skews=[0.0, 3600.0, -7.5])
    assert verdict is not None and (verdict.rank, verdict.host) == (1, "node2")
    assert verdict.progress is not None and verdict.progress["shape"] == "mnist"
    assert 3.0 <= verdict.compute_ratio <= 5.0, verdict
    assert at <= 24.0, at  # the span (12 s) and 4 agreeing rounds
    assert "its ranks progress ~4.0× slower (samples " in verdict.why, verdict.why


def test_a_monitor_names_nobody_in_an_alike_fleet_of_skewed_clocks() -> None:
    verdict, _ = _monitor([10.0, 9.0, 10.5], skews=[0.0, 3600.0, -7.5])
    assert verdict is None
