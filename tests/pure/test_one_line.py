"""``errors.one_line``: the one way any error becomes a line of a report."""

from __future__ import annotations

from fleetctl.errors import UsageError, one_line


def test_ours_by_its_own_one_line() -> None:
    e = UsageError("node1: rsync failed\n  details below")
    assert one_line(e) == one_line(e, typed=True) == "node1: rsync failed"


def test_any_other_by_its_words_or_its_class() -> None:
    assert one_line(OSError("no  route\nto host")) == "no route to host"
    assert one_line(OSError("no route"), typed=True) == "OSError: no route"
    assert one_line(TimeoutError()) == one_line(TimeoutError(), typed=True) == "TimeoutError"
