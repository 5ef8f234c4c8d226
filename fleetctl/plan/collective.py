"""``--collective``'s options as one plain record (pure): what the check's benchmark
(``phases/check/collective.py``, judged by ``collective_judge.py``), ``RunSpec``'s
``Collective`` group and a role job file's ``collective:`` key all carry. Here, below them
all, so the job file's parser (``plan/roles``) holds the value it parsed without importing
the check that runs it."""

from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20
DEFAULT_SIZE = 32 * MiB
DEFAULT_MIN_FRACTION = 0.5
DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class CollectiveOptions:
    """``--collective``: bytes per transfer, the verdict's thresholds, the time limit (s)."""

    size: int = DEFAULT_SIZE
    min_fraction: float = DEFAULT_MIN_FRACTION
    floor: float | None = None  # GB/s busbw every node and link must reach
    timeout: float = DEFAULT_TIMEOUT
    iters: int = 3
    backend: str | None = None  # None: nccl where torch sees a GPU, gloo otherwise
