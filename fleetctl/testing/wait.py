"""Bounded polling for tests: wait for the condition itself, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    *,
    what: str = "condition",
    interval: float = 0.1,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned), at most ``timeout`` s.

    Raises AssertionError naming ``what`` (and ``detail()``, e.g. a log tail) on timeout, so a
    test waits exactly as long as the condition takes instead of a fixed sleep.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            extra = f"\n{detail()}" if detail is not None else ""
            raise AssertionError(f"{what}: not true after {timeout:g} s{extra}")
        time.sleep(interval)
