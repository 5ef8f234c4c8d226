"""Stack dumps of a hung job, folded so the odd rank out shows at once.

A hung collective leaves every healthy rank waiting in the same frame and the culprit
somewhere else; folding ranks by their innermost Python frame turns 64 stack dumps into
two groups, which the CLI prints as::

    ranks 0,2-5: wait (distributed_c10d.py:3041)
    rank 1: stuck_loading_batch (ddp_train.py:75)

The dumps themselves (py-spy's and faulthandler's, one :class:`RankStack` per process) are
read by ``fleetctl.phases.stackdumps``. Pure: dumps in, groups out.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleetctl.phases.stackdumps import RankStack, innermost_frame


@dataclass(frozen=True)
class StackGroup:
    """Ranks (or, for launchers, nodes) whose main thread waits in the same innermost frame."""

    frame: str
    ranks: tuple[int, ...] = ()
    launcher_nodes: tuple[int, ...] = ()


def fold(stacks: Iterable[RankStack]) -> list[StackGroup]:
    """Groups by innermost frame: ranks first, the most common frame first; processes that
    are not ranks (launchers) after them, by node."""
    ranks: dict[str, list[int]] = {}
    launchers: dict[str, list[int]] = {}
    for s in stacks:
        frame = innermost_frame(s.text) or "no Python stack"
        if s.rank is None:
            launchers.setdefault(frame, []).append(s.node)
        else:
            ranks.setdefault(frame, []).append(s.rank)

    def order(kv: tuple[str, list[int]]) -> tuple[int, int]:
        return -len(kv[1]), min(kv[1])

    return [StackGroup(f, ranks=tuple(sorted(r))) for f, r in sorted(ranks.items(), key=order)] + [
        StackGroup(f, launcher_nodes=tuple(sorted(n)))
        for f, n in sorted(launchers.items(), key=order)
    ]
