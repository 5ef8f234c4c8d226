"""accelerate: ``python -m accelerate.commands.launch`` (what ``accelerate launch`` runs).

Every node gets the same ``--num_machines/--main_process_ip/--main_process_port`` and its own
``--machine_rank``; ``--num_processes`` is the job's total (accelerate divides it by the number
of machines). With two processes or more ``--multi_gpu`` sends accelerate down its
``torch.distributed.run`` path (its ``multi_gpu_launcher``), the static rendezvous spelled out
as for torchrun, so a failed rank ends with torch's error summary (parsed as torchrun's). No
``--log_dir``: accelerate has ``--tee`` but no ``--redirects``, so the ranks print to the
launcher's console (``console.log``), with no per-rank files. A module runs with ``--module
MODULE``, a shell script with ``--no_python bash SCRIPT``. The plan sets CUDA_VISIBLE_DEVICES
for GPU lists; no ``--gpu_ids``. Flags checked against accelerate's ``commands/launch.py``
(``launch_command_parser``, ``launch_command``); accelerate is not a test dependency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetctl.plan.launchers import torchrun
from fleetctl.plan.launchers.base import (
    SCRIPT_KINDS,
    LaunchContext,
    Launcher,
    program,
    python_path,
)

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    world = ctx.nnodes * ctx.nproc_per_node
    return [
        python_path(node),
        "-m",
        "accelerate.commands.launch",
        f"--num_machines={ctx.nnodes}",
        f"--machine_rank={node.node_rank}",
        f"--main_process_ip={ctx.master_addr}",
        f"--main_process_port={ctx.master_port}",
        f"--num_processes={world}",
        *(["--multi_gpu"] if world > 1 else []),  # accelerate refuses it for one process
        "--rdzv_backend=static",
        *ctx.launcher_args,
        *program(ctx, node, module=("--module",), shell=("--no_python",)),
    ]


OWNED = frozenset(
    {
        "--num-machines",
        "--machine-rank",
        "--main-process-ip",
        "--main-process-port",
        "--num-processes",
        "--multi-gpu",
        "--cpu",
        "--tpu",
        "--rdzv-backend",
    }
)

LAUNCHER = Launcher(
    name="accelerate",
    argv=argv,
    module="accelerate.commands.launch",
    owned=OWNED,
    kinds=frozenset(SCRIPT_KINDS),
    kind_options=frozenset({"-m", "--module", "--no-python"}),
    named_failures=torchrun.named_failures,
)
