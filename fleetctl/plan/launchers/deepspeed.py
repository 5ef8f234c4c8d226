"""deepspeed: ``python -m deepspeed.launcher.runner --no_ssh`` on every node with one hostfile.

fleetctl already reaches every node, so deepspeed's own pdsh fan-out is switched off
(``--no_ssh``) and each node runs its local launcher with ``--node_rank``; the hostfile (same on
every node, ``<train_addr> slots=K`` in rank order) only tells deepspeed the world layout. It is
returned as a file for the run phase to write into the node run folder. ``-m
deepspeed.launcher.runner`` is what the ``deepspeed`` console script runs, with the node's own
python so PATH never matters. A module runs with ``--module MODULE``, a shell script with
``--no_python --no_local_rank bash SCRIPT`` (without ``--no_local_rank`` deepspeed would put
``--local_rank=N`` between ``bash`` and the script; the rank is in ``LOCAL_RANK``). Flags
checked against deepspeed 0.19.8 ``launcher/runner.py`` and ``launcher/launch.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import PlanError
from fleetctl.plan.launchers.base import (
    SCRIPT_KINDS,
    LaunchContext,
    Launcher,
    program,
    python_path,
    run_path,
)

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan

HOSTFILE = "hostfile"  # relative to the node run folder
# deepspeed.launcher.launch writes each rank's stdout+stderr to <dir>/<YYYYmmddHHMMSS>_rank<G>.log
# (G: the global rank); relative to the node run folder
LOG_DIR = "deepspeed"


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    return [
        python_path(node),
        "-m",
        "deepspeed.launcher.runner",
        f"--hostfile={run_path(node, HOSTFILE)}",
        "--no_ssh",
        f"--node_rank={node.node_rank}",
        f"--master_addr={ctx.master_addr}",
        f"--master_port={ctx.rdzv_port}",
        f"--enable_each_rank_log={run_path(node, LOG_DIR)}",
        *ctx.once("gpu selection", lambda: _gpu_selection(ctx)),
        *ctx.extra_argv,
        *program(ctx, node, module=("--module",), shell=("--no_python", "--no_local_rank")),
    ]


def _gpu_selection(ctx: LaunchContext) -> list[str]:
    """``--num_gpus=K``, or with GPU lists ``--include=addr:2,3@…`` (deepspeed then sets
    CUDA_VISIBLE_DEVICES on each node to exactly those; the two flags exclude each other)."""
    if not ctx.gpu_lists:
        return [f"--num_gpus={ctx.procs}"]
    parts = [f"{addr}:{','.join(ids)}" for addr, ids in zip(ctx.ips, ctx.gpu_lists, strict=True)]
    return ["--include=" + "@".join(parts)]


def files(ctx: LaunchContext, node: NodePlan) -> dict[str, str]:
    return {HOSTFILE: ctx.once(HOSTFILE, lambda: _hostfile(ctx))}


def _hostfile(ctx: LaunchContext) -> str:
    if ctx.gpu_lists:  # slots are indices 0..slots-1: cover the highest one listed
        slots = [max(int(i) for i in ids) + 1 for ids in ctx.gpu_lists]
    else:
        slots = [ctx.procs] * len(ctx.ips)
    lines = [f"{addr} slots={n}" for addr, n in zip(ctx.ips, slots, strict=True)]
    return "\n".join(lines) + "\n"


RANK_LOG = r".+_rank([0-9]+)\.log"  # the node's rule and rank_files' alike


def rank_logs(node_rank: int, nproc: int) -> dict[str, Any]:
    """``<dir>/<time>_rank<G>.log``: named by global rank (base 0)."""
    return {"dir": LOG_DIR, "base": 0, "files": [RANK_LOG]}


def rank_files(node_dir: Path, local: int, rank: int) -> list[Path]:
    """Named by global rank; one per launch (sorted by its time stamp). The glob's ``*`` also
    takes an empty stamp (a bare ``_rank2.log``): the node's rule decides, exactly."""
    import re

    rule = re.compile(RANK_LOG)
    found = sorted(node_dir.glob(f"{LOG_DIR}/*_rank{rank}.log"))
    return [p for p in found if (m := rule.fullmatch(p.name)) and int(m.group(1)) == rank]


def validate(ctx: LaunchContext, addrs: Mapping[str, str]) -> None:
    """The hostfile keys nodes by address: two nodes on one address would be one host."""
    _require_unique(addrs, "deepspeed")
    for host, ids in zip(addrs, ctx.gpu_lists, strict=False):  # empty: no lists at all
        if not ids or not all(i.isdigit() for i in ids):
            raise PlanError(
                f"{host}: deepspeed selects GPUs by index (--include); fleetctl_gpus "
                f"{','.join(ids) or '(a count)'} must list indices on every node"
            )


def _require_unique(addrs: Mapping[str, str], launcher: str) -> None:
    seen: dict[str, str] = {}
    for host, addr in addrs.items():
        if addr in seen:
            raise PlanError(
                f"hosts {seen[addr]} and {host} share training address {addr}; {launcher} "
                "identifies nodes by address (set fleetctl_addr or fleetctl_nic per host)"
            )
        seen[addr] = host


OWNED = frozenset(
    {
        "--hostfile",
        "-h",
        "--no-ssh",
        "--node-rank",
        "--master-addr",
        "--master-port",
        "--num-gpus",
        "--num-nodes",
        "--include",
        "-i",
        "--exclude",
        "-e",
        "--launcher",
        "--force-multi",
        "--enable-each-rank-log",
    }
)

LAUNCHER = Launcher(
    name="deepspeed",
    owned=OWNED,
    argv=argv,
    files=files,
    validate=validate,
    module="deepspeed.launcher.runner",
    kinds=frozenset(SCRIPT_KINDS),
    kind_options=frozenset({"--module", "--no-python"}),
    sets_visible_devices=True,  # from --include
    rank_logs=rank_logs,
    rank_files=rank_files,
)
