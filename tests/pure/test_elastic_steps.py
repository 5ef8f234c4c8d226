"""``run --elastic``: the step a job prints, read from its lines (golden lines), and the spare
that starts from step 0 while the others resumed — said once, with the step of each."""

from __future__ import annotations

import pytest

from fleetctl.job.run.stepwatch import StepWatch, steps

LINES = [
    ("[rank 2] step=41 rank=2 world=3 sum=3", {"step": 41}),
    ("Step 41/1000 loss=0.31", {"step": 41}),
    ("epoch: 3, step: 120", {"epoch": 3, "step": 120}),
    ("Epoch 2 | iter 300 | lr 0.1", {"epoch": 2, "iter": 300}),
    ("iteration #7 done", {"iter": 7}),
    ("global_step=1500", {"step": 1500}),
    ("[rank 0] start rank=0 world=3 loaded=8 step=8 restart=1", {"step": 8}),
    ("max_steps=1000 warmup_steps=10", {}),
    ("stepping into the loop", {}),
    ("rank 0 ready; 41 steps to go", {}),
    ("footstep 3", {}),
]


@pytest.mark.parametrize(("line", "want"), LINES, ids=[x[0][:30] for x in LINES])
def test_the_step_a_line_prints(line: str, want: dict[str, int]) -> None:
    assert steps(line) == want


def test_a_spare_that_starts_from_step_0_while_the_others_resumed_is_said_once() -> None:
    w = StepWatch()
    assert w.lines(0, ["[rank 0] step=40"]) is None
    assert w.lines(1, ["[rank 1] step=41"]) is None
    assert w.lines(2, ["[rank 2] step=41"]) is None
    w.spare(2, "node4")  # node3 was lost: its step=41 speaks for nobody now
    assert w.lines(2, ["[rank 2] loading nothing"]) is None  # no step yet: still watched
    fresh = w.lines(2, ["[rank 2] step=0", "[rank 2] step=1"])
    assert fresh is not None and (fresh.rank, fresh.value, fresh.others) == (2, 0, 41)
    assert fresh.line() == (
        "node4 (spare) started at step 0 while the others are at step 41: does the script "
        "load the newest checkpoint on every start? see docs/commands/run.md, Elastic jobs"
    )
    assert w.lines(2, ["[rank 2] step=0"]) is None  # once


@pytest.mark.parametrize(
    ("first", "others"),
    [
        ("step=42", "step=41"),  # resumed
        ("step=1", "step=2"),  # too early to tell
        ("epoch 0", "step=41"),  # an epoch is no step
        ("loss=0.3", "step=41"),  # prints no step
    ],
)
def test_a_spare_that_resumed_or_cannot_be_judged_says_nothing(first: str, others: str) -> None:
    w = StepWatch()
    w.lines(0, [others])
    w.spare(1, "node4")
    assert w.lines(1, [first]) is None


def test_a_slot_the_job_went_on_without_speaks_for_nobody() -> None:
    w = StepWatch()
    w.lines(0, ["step=1"])
    w.lines(1, ["step=41"])
    w.gone(1)
    w.spare(2, "node4")
    assert w.lines(2, ["step=0"]) is None  # only node 0's step=1 counts: too early to tell
