"""bench/ab.py's phase split: a run's wall and controller CPU cut by job.json's phase marks."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_runs_phases_split_its_wall_and_cpu_from_start_to_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from ab import phase_split

    def mark(text: str, at: str, cpu: float, child: float = 0.0) -> dict:
        return {"phase": text, "at": f"2026-11-30T02:00:{at}Z", "cpu": cpu, "child_cpu": child}

    phases = [
        mark("connecting to 8 node(s)", "00.150", 0.150, 0.002),
        mark("checking nodes", "00.165", 0.163, 0.002),
        mark("pushing code", "00.500", 0.270, 0.010),
        mark("launching plain on 8 node(s), job j", "00.520", 0.280, 0.010),
        mark("attempt 2 of 2: job j.2", "00.600", 0.300, 0.010),  # a phase of no known name
        mark("launching plain on 8 node(s), job j.2", "00.700", 0.320, 0.010),
        mark("collecting logs into x", "00.900", 0.390, 0.010),
        mark("done: succeeded", "00.950", 0.430, 0.010),
    ]
    began = 1796004000.0  # 2026-11-30T02:00:00Z
    got = phase_split(phases, began, began + 1.0)
    assert list(got) == [
        "start", "connecting", "checking", "pushing", "launching", "attempt", "collecting", "end",
    ]  # fmt: skip
    rounded = {k: (round(w, 3), round(c, 3)) for k, (w, c) in got.items()}
    assert rounded == {
        "start": (0.15, 0.152),  # own + children's CPU at the first mark
        "connecting": (0.015, 0.013),
        "checking": (0.335, 0.115),
        "pushing": (0.02, 0.01),
        "launching": (0.28, 0.09),  # both launches summed: 0.08 + 0.2 s, 0.02 + 0.07 s
        "attempt": (0.1, 0.02),
        "collecting": (0.05, 0.04),
        "end": (0.05, 0.0),  # done → exit: wall only
    }
