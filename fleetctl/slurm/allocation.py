"""The fleet of a Slurm allocation: ``SLURM_JOB_ID`` + ``SLURM_JOB_NODELIST`` → nodes.

Without an inventory the allocation is the fleet, in Slurm's order; with one, the allocation
selects and orders the inventory's hosts (their vars apply). Every node is marked to be reached
by ``srun`` (``fleetctl.transport.srun``): compute nodes often refuse SSH to users without a job.
Addresses: the node name where it resolves, else Slurm's ``NodeAddr``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetctl.errors import FleetctlError, UsageError
from fleetctl.node import Node

if TYPE_CHECKING:
    from fleetctl.plan.inventory.load import Inventory

SCONTROL_TIMEOUT = 15.0
#: set by the batch script from ``--gres gpu:K``: the GPUs each node's steps get. The batch
#: step's own ``SLURM_GPUS_ON_NODE`` can be more (an exclusive node gives it all of them).
#: Here, not in batch.py: every run asks this module whether it is inside an allocation.
GPUS_VAR = "FLEETCTL_SLURM_GPUS_PER_NODE"


@dataclass(frozen=True)
class Allocation:
    job_id: str
    hosts: tuple[str, ...]
    gpus_per_node: int | None = None


def job_id(env: Mapping[str, str]) -> str | None:
    """The Slurm job this process runs in (``SLURM_JOB_ID``, or the older ``SLURM_JOBID``);
    None outside an allocation. The one reader of these variables (``Fleet.in_slurm``)."""
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None


def from_env(env: Mapping[str, str]) -> Allocation | None:
    """The allocation this process runs in (None outside one)."""
    job = job_id(env)
    if not job:
        return None
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise UsageError(f"SLURM_JOB_ID={job} is set but SLURM_JOB_NODELIST is not")
    gpus = None
    # what each node's steps get, asked for (run --slurm's --gres, --gpus-per-node) before
    # what this step has: a batch step on an exclusive node has all the node's GPUs
    for key in (GPUS_VAR, "SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"):
        if env.get(key):
            gpus = gpus_from(key, env[key])
            if gpus is not None:
                break
    from fleetctl.slurm.hostlist import expand

    return Allocation(job, tuple(expand(nodelist)), gpus)


def gpus_from(key: str, value: str) -> int | None:
    """GPUs per node from a Slurm variable: ``2``, ``gpu:2``, ``gpu:a100:2``, ``0,1`` (ids)."""
    value = value.strip()
    if key == "SLURM_JOB_GPUS":  # the ids of this node's GPUs
        return len([x for x in value.split(",") if x.strip()]) or None
    m = re.search(r"(?:^|:)(\d+)(?:\(|$)", value)
    return int(m.group(1)) if m else None


#: the variables that say what each node's steps get (run --slurm's, --gpus-per-node); without
#: them a batch step's SLURM_GPUS_ON_NODE is the exclusive node's, not a step's
STEP_GPU_VARS = (GPUS_VAR, "SLURM_GPUS_PER_NODE")


def tres_gpus(scontrol_show_job: str) -> int | None:
    """GPUs per node the job asked for, from ``scontrol show job -o``'s ``TresPerNode``
    (``gres:gpu:1``, ``gres/gpu:a100:2``; None: no GPU gres, e.g. ``gres:shard:2``)."""
    m = re.search(r"\bTresPerNode=(\S+)", scontrol_show_job)
    for item in m.group(1).split(",") if m else ():
        parts = re.split(r"[:/=]", item)
        if parts[:2] == ["gres", "gpu"] and parts[-1].isdigit() and len(parts) > 2:
            return int(parts[-1])
    return None


def job_gpus_per_node(job_id: str) -> int | None:
    """What each node's steps get under ``#SBATCH --gres=gpu:K`` (Slurm's word; None where
    Slurm does not say or cannot be asked: the environment's count stands)."""
    argv = ["scontrol", "show", "job", "-o", job_id]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return tres_gpus(p.stdout) if p.returncode == 0 else None


def node_addrs(scontrol_show_node: str) -> dict[str, str]:
    """``scontrol show node -o`` → {NodeName: NodeAddr}."""
    out: dict[str, str] = {}
    for line in scontrol_show_node.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        addr = re.search(r"\bNodeAddr=(\S+)", line)
        if name and addr:
            out[name.group(1)] = addr.group(1)
    return out


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def _scontrol_addrs(hosts: Sequence[str]) -> dict[str, str]:
    argv = ["scontrol", "show", "node", "-o", ",".join(hosts)]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=SCONTROL_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FleetctlError(f"`{' '.join(argv)}` failed: {e}") from e
    if p.returncode != 0:
        raise FleetctlError(f"`{' '.join(argv)}` failed: {p.stderr.strip() or p.returncode}")
    return node_addrs(p.stdout)


def fleet_nodes(
    alloc: Allocation,
    inventory: Sequence[Node] | None,
    *,
    resolves: Callable[[str], bool] = _resolves,
    addrs: Callable[[Sequence[str]], Mapping[str, str]] = _scontrol_addrs,
) -> tuple[Node, ...]:
    """The allocation's nodes in Slurm's order, each marked for srun. Pure given the callables."""
    from fleetctl.transport.srun import srun_vars  # here: `in_slurm` loads no transport

    marks = srun_vars(alloc.job_id)
    if inventory is not None:
        by_name = {n.name: n for n in inventory}
        missing = [h for h in alloc.hosts if h not in by_name]
        if missing:
            raise UsageError(
                f"Slurm job {alloc.job_id}: node(s) {', '.join(missing)} of the allocation are "
                "not in the inventory's selection"
            )
        return tuple(
            dataclasses.replace(
                by_name[h],
                vars={**by_name[h].vars, **marks},
                gpus=by_name[h].gpus if by_name[h].gpus is not None else alloc.gpus_per_node,
            )
            for h in alloc.hosts
        )
    unresolved = [h for h in alloc.hosts if not resolves(h)]
    known = dict(addrs(unresolved)) if unresolved else {}
    return tuple(
        Node(
            name=h,
            address=known.get(h, h),
            gpus=alloc.gpus_per_node,
            vars=dict(marks),
            source=f"Slurm job {alloc.job_id}",
        )
        for h in alloc.hosts
    )


def apply(
    inv: Inventory, *, has_inventory: bool, env: Mapping[str, str] | None = None
) -> Inventory:
    """``inv`` as run inside the current allocation (unchanged outside one)."""
    env = os.environ if env is None else env
    alloc = from_env(env)
    if alloc is None:
        return inv
    if not any(env.get(k) for k in STEP_GPU_VARS):  # a user's own sbatch script: ask Slurm
        asked = job_gpus_per_node(alloc.job_id)
        if asked is not None:
            alloc = dataclasses.replace(alloc, gpus_per_node=asked)
    nodes = fleet_nodes(alloc, inv.nodes if has_inventory else None)
    names = tuple(n.name for n in nodes)
    groups = {g: tuple(h for h in names if h in set(m)) for g, m in inv.groups.items()}
    if not has_inventory:
        groups = {"all": names, "ungrouped": names}
    digest = hashlib.sha256(f"{inv.digest}\0slurm\0{alloc.job_id}\0{','.join(names)}".encode())
    return dataclasses.replace(inv, nodes=nodes, groups=groups, digest=digest.hexdigest())
