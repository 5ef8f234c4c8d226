"""Which failing bisection group the post-mortem measures once more: one a preempted transfer
can fail (its figures alone: below a quarter of the best group's median, or one slow figure of
a pair), never a hang or an error, nor a larger group's all-pairs verdict."""

from __future__ import annotations

import pytest

from fleetctl.job.diagnose.proof import _measured_again
from fleetctl.phases.check.collective_judge import CollectiveReport

SLOW = "slow node (recv side) busbw 0.006 GB/s < 0.18 GB/s (0.25 x fleet median 0.73 GB/s)"
CASES = [
    # (failures, hung, hosts, measured again)
    ([], {}, 2, True),  # passed its judge: slow only next to the best group so far
    ([], {}, 4, True),
    ([("a", SLOW)], {}, 2, True),
    ([("a", "slow link a → b busbw 0.01 GB/s < 0.2 GB/s"), ("b", "slow link a → b")], {}, 2, True),
    ([("a", SLOW)], {}, 3, False),  # three or more: every pair measured, its judge stands
    ([("a", "hung: the collective did not complete in time")], {"a": ""}, 2, False),
    ([("a", "collective program ended: no answer")], {}, 2, False),
    ([("a", SLOW), ("b", "cannot import torch")], {}, 2, False),
]


@pytest.mark.parametrize(("failures", "hung", "hosts", "want"), CASES)
def test_a_group_failed_by_its_figures_alone_is_measured_once_more(
    failures: list[tuple[str, str]], hung: dict[str, str], hosts: int, want: bool
) -> None:
    rep = CollectiveReport(order=["a", "b"], failures=failures, hung=hung)
    assert _measured_again(rep, hosts) is want
