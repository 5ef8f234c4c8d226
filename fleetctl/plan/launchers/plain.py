"""plain: ``python SCRIPT ARGS`` once per node, the rank given by env (Kubeflow/OpenPAI style).

No launcher process sits between the supervisor and the script, so the script itself is rank
``NODE_RANK`` of ``NNODES``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``
are set here so ``torch.distributed.init_process_group("env://")`` works unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetctl.plan.launchers.base import LaunchContext, Launcher, python_path, script_path

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    return [python_path(node), script_path(node, ctx.script), *ctx.args]


def env(ctx: LaunchContext, node: NodePlan) -> dict[str, str]:
    return {
        "RANK": str(node.node_rank),
        "WORLD_SIZE": str(ctx.nnodes),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }


LAUNCHER = Launcher(name="plain", argv=argv, env=env, one_process_per_node=True)
