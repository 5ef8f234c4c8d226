"""Peer waves (``phases/push/waves.py``), the one schedule the env push and ``push --image``
use: which fetcher goes to which server first, who is left for the next wave, how many waves."""

from __future__ import annotations

import pytest

from fleetctl.phases.push.waves import wave, waves_needed


def test_each_server_takes_fanout_fetchers_its_own_first_then_the_others() -> None:
    assigned, rest = wave(["a", "b"], ["n1", "n2", "n3", "n4", "n5"], 2)
    assert assigned == [
        ("n1", ["a", "b"]),
        ("n2", ["a", "b"]),
        ("n3", ["b", "a"]),
        ("n4", ["b", "a"]),
    ]
    assert rest == ["n5"]


def test_fewer_fetchers_than_slots_all_go_in_this_wave() -> None:
    assert wave(["a", "b"], ["n1"], 4) == ([("n1", ["a", "b"])], [])


def test_a_fanout_below_one_still_serves_one_each() -> None:
    assert wave(["a"], ["n1", "n2"], 0) == ([("n1", ["a"])], ["n2"])


def test_no_server_no_wave() -> None:
    assert wave([], ["n1", "n2"], 2) == ([], ["n1", "n2"])


@pytest.mark.parametrize(
    ("pending", "fanout", "waves"),
    [(0, 2, 1), (1, 2, 1), (2, 2, 1), (3, 2, 2), (8, 2, 2), (9, 2, 3), (26, 2, 3), (27, 2, 4)],
)
def test_waves_needed_grows_with_the_holders(pending: int, fanout: int, waves: int) -> None:
    """One holder serves ``fanout``; then 1 + fanout holders serve, and so on."""
    assert waves_needed(pending, fanout) == waves
