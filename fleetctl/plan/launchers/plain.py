"""plain: ``python SCRIPT ARGS`` once per node, the rank given by env (Kubeflow/OpenPAI style).

No launcher process sits between the supervisor and the script, so the script itself is rank
``NODE_RANK`` of ``NNODES``: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``
are set here so ``torch.distributed.init_process_group("env://")`` works unchanged. A module
runs as ``python -m MODULE``, a shell script as ``bash SCRIPT``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetctl.plan.launchers.base import (
    SCRIPT_KINDS,
    SHELL,
    LaunchContext,
    Launcher,
    program,
    python_path,
)

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    if ctx.kind == SHELL:
        return program(ctx, node)
    return [python_path(node), *program(ctx, node)]


def env(ctx: LaunchContext, node: NodePlan) -> dict[str, str]:
    return {
        "RANK": str(node.node_rank),
        "WORLD_SIZE": str(ctx.nnodes),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }


LAUNCHER = Launcher(
    name="plain",
    argv=argv,
    env=env,
    one_process_per_node=True,
    one_process=True,
    takes_args=False,
    kinds=frozenset(SCRIPT_KINDS),
)
