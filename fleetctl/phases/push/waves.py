"""Peer waves, written once for the env archive (``peers.py``) and ``push --image``
(``image.py``): every node holding the file serves up to ``fanout`` fetchers a wave, and a
fetcher that keeps it serves the next wave, so the controller's uplink carries it about once.
Which fetcher goes to which server, and how many waves that takes, is here; starting and stopping
the servers (``serving.py``) and what a fetch does stay with each caller. Pure.

The checkpoint relay (``relay.py``) is no wave: every target fetches from the one source, whose
tar is applied and removed, never served on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

F = TypeVar("F")
S = TypeVar("S")


def wave(
    live: Sequence[S], pending: Sequence[F], fanout: int
) -> tuple[list[tuple[F, list[S]]], list[F]]:
    """This wave's fetchers, each with the servers to try in order (its own slot's first, then
    the others as ``live`` orders them), and the fetchers left for the next wave. Each live
    server takes up to ``fanout`` fetchers (at least one); no server, no wave."""
    slots = [srv for srv in live for _ in range(max(1, fanout))]
    batch = [
        (f, [slots[i]] + [srv for srv in live if srv is not slots[i]])
        for i, f in enumerate(pending[: len(slots)])
    ]
    return batch, list(pending[len(slots) :])


def waves_needed(pending: int, fanout: int) -> int:
    """How many waves serve ``pending`` fetchers from one holder (a server's lifetime)."""
    holders, waves = 1, 1
    while pending > holders * fanout:
        pending -= holders * fanout
        holders += holders * fanout
        waves += 1
    return waves
