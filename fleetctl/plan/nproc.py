"""How many processes each node runs, from the job's ``--nproc-per-node`` and every node's
GPU count: one number for the whole fleet, or a PlanError naming the odd hosts. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleetctl.errors import PlanError

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import JobSpec


def processes_per_node(
    spec: JobSpec, gpus: Mapping[str, int], *, one_per_node: bool
) -> tuple[int, int]:
    """(processes per node, GPUs per node used by the launcher; 0 = CPU)."""
    counts = Counter(gpus.values())
    uniform = len(counts) == 1
    if one_per_node:
        if spec.procs not in ("auto", 1):
            raise PlanError(
                f"launcher {spec.launcher!r} runs one process per node; "
                f"--nproc-per-node must be 1 or auto, got {spec.procs}"
            )
        return 1, next(iter(counts)) if uniform else 0
    if spec.procs == "auto":
        if not uniform:
            raise PlanError(_mixed_gpus_message(gpus, counts))
        count = next(iter(counts))
        return max(count, 1), count
    k = int(spec.procs)
    if 0 in counts and not uniform:
        none = ", ".join(h for h, c in gpus.items() if c == 0)
        raise PlanError(
            f"{none}: no GPUs known while other nodes have GPUs; CPU and GPU nodes cannot share "
            "one job (set fleetctl_gpus)"
        )
    short = [h for h, c in gpus.items() if 0 < c < k]
    if short:
        have = ", ".join(f"{h} has {gpus[h]}" for h in short)
        raise PlanError(f"--nproc-per-node {k} needs {k} GPUs per node but {have}")
    return k, (k if 0 not in counts else 0)


def _mixed_gpus_message(gpus: Mapping[str, int], counts: Counter[int]) -> str:
    # The most common count is "normal" (ties: node 0's); the others are the odd hosts.
    first = next(iter(gpus.values()))
    top = max(counts.values())
    normal = first if counts[first] == top else counts.most_common(1)[0][0]
    odd = [f"{h} has {c}" for h, c in gpus.items() if c != normal]
    return (
        f"mixed GPU counts: {', '.join(odd)} while the others have {normal}; every node must "
        "run the same number of processes (fix fleetctl_gpus or pass --nproc-per-node)"
    )
