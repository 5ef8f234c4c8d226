"""torchrun (``python -m torch.distributed.run``) with the static rendezvous.

Every node gets the same ``--nnodes/--master-addr/--master-port`` and its own ``--node-rank``;
``--rdzv-backend=static`` is spelled out (it is torchrun's default, but with ``--nnodes=1`` and
no port torchrun would silently switch to a c10d rendezvous on a random port). The job id is the
rendezvous id, so torchrun's log sub-folder under ``--log-dir`` carries it. Running the node's
own python with ``-m`` means PATH on the node never decides which torchrun runs.
``--redirects=3`` puts each local rank's output in ``torchrun/<job>_*/attempt_N/<local>/
{stdout,stderr}.log``; the node supervisor tails those into whole ``[rank G]`` lines.
A module runs as ``torchrun … -m MODULE``, a shell script as ``torchrun … --no-python bash
SCRIPT`` (each worker is then ``bash SCRIPT ARGS`` with torchrun's env: ``RANK``, ``LOCAL_RANK``…).
Option names checked against torch 2.13 ``torchrun --help``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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

LOG_DIR = "torchrun"  # relative to the node run folder (argv: via run_path)


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    return [
        python_path(node),
        "-m",
        "torch.distributed.run",
        f"--nnodes={ctx.nnodes}",
        f"--node-rank={node.node_rank}",
        f"--nproc-per-node={ctx.nproc_per_node}",
        "--rdzv-backend=static",
        f"--rdzv-id={ctx.job_id}",
        f"--master-addr={ctx.master_addr}",
        f"--master-port={ctx.master_port}",
        f"--log-dir={run_path(node, LOG_DIR)}",
        # each local rank's stdout/stderr into its own files under --log-dir; the supervisor
        # tails them into whole lines tagged with the global rank (torchrun's own --tee would
        # splice partial lines of different ranks)
        "--redirects=3",
        *ctx.launcher_args,
        *program(ctx, node, module=("-m",), shell=("--no-python",)),
    ]


OWNED = frozenset(
    {
        "--nnodes",
        "--node-rank",
        "--nproc-per-node",
        "--rdzv-backend",
        "--rdzv-id",
        "--rdzv-endpoint",
        "--master-addr",
        "--master-port",
        "--log-dir",
        "--standalone",
        "--local-addr",
        "--redirects",
        "--tee",
    }
)

LAUNCHER = Launcher(
    name="torchrun",
    argv=argv,
    module="torch.distributed.run",
    owned=OWNED,
    kinds=frozenset(SCRIPT_KINDS),
    kind_options=frozenset({"-m", "--module", "--no-python"}),
)
