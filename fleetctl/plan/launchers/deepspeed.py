"""deepspeed: ``python -m deepspeed.launcher.runner --no_ssh`` on every node with one hostfile.

fleetctl already reaches every node, so deepspeed's own pdsh fan-out is switched off
(``--no_ssh``) and each node runs its local launcher with ``--node_rank``; the hostfile (same on
every node, ``<train_addr> slots=K`` in rank order) only tells deepspeed the world layout. It is
returned as a file for the run phase to write into the node run folder. ``-m
deepspeed.launcher.runner`` is what the ``deepspeed`` console script runs, with the node's own
python so PATH never matters. Flags checked against deepspeed 0.19.8 ``launcher/runner.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from fleetctl.errors import PlanError
from fleetctl.plan.launchers.base import LaunchContext, Launcher, python_path, script_path

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan

HOSTFILE = "hostfile"  # relative to the node run folder


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    return [
        python_path(node),
        "-m",
        "deepspeed.launcher.runner",
        f"--hostfile={HOSTFILE}",
        "--no_ssh",
        f"--node_rank={node.node_rank}",
        f"--master_addr={ctx.master_addr}",
        f"--master_port={ctx.master_port}",
        f"--num_gpus={ctx.nproc_per_node}",
        *ctx.launcher_args,
        script_path(node, ctx.script),
        *ctx.args,
    ]


def files(ctx: LaunchContext, node: NodePlan) -> dict[str, str]:
    lines = [f"{addr} slots={ctx.nproc_per_node}" for addr in ctx.ips]
    return {HOSTFILE: "\n".join(lines) + "\n"}


def validate(ctx: LaunchContext, addrs: Mapping[str, str]) -> None:
    """The hostfile keys nodes by address: two nodes on one address would be one host."""
    _require_unique(addrs, "deepspeed")


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
    }
)

LAUNCHER = Launcher(
    name="deepspeed",
    owned=OWNED,
    argv=argv,
    files=files,
    validate=validate,
    module="deepspeed.launcher.runner",
)
