"""accelerate: ``python -m accelerate.commands.launch`` (what ``accelerate launch`` runs).

Every node gets the same ``--num_machines/--main_process_ip/--main_process_port`` and its own
``--machine_rank``; ``--num_processes`` is the job's total (accelerate divides it by the number
of machines). With two processes or more ``--multi_gpu`` sends accelerate down its
``torch.distributed.run`` path (its ``multi_gpu_launcher``), the static rendezvous spelled out
as for torchrun: torch's agent starts the node's ranks with ``RANK``/``LOCAL_RANK``/
``WORLD_SIZE``, and a failed rank ends with torch's error summary (parsed as torchrun's).

CPU nodes (no GPUs in the plan): the same path, with ``ACCELERATE_USE_CPU=true`` (what
accelerate's ``--cpu`` sets for the script), so an unchanged ``Accelerator()`` in every rank
joins one ``MULTI_CPU`` (gloo) world of all the plan's ranks. Without it, ``Accelerator()``
finds no CUDA and each rank runs alone (``DistributedType.NO``, one world per process), and
``--cpu`` itself is no way out: it takes accelerate's ``simple_launcher``, one process per
machine with no ``RANK``/``WORLD_SIZE`` (accelerate leaves those to mpirun), so each machine
runs alone too (both seen with accelerate 1.15.0, ``commands/launch.py``/``utils/launch.py``).

Rank logs as torchrun's: accelerate has ``--log_dir`` but no ``--redirects``; torch's parser
reads ``PET_REDIRECTS`` from the env for an option accelerate does not pass (``_filter_args``
keeps torch's defaults), so ``PET_REDIRECTS=3`` puts each local rank's output in
``torchrun/<job>_*/attempt_N/<local>/{stdout,stderr}.log`` (``PET_RDZV_ID``: the job id, as
torchrun's ``--rdzv-id``), tailed by the supervisor into ``[rank G]`` lines, and a failed
rank's own traceback is what the summary shows, not torch's ``ChildFailedError``. One process
in all (no torch agent): the launcher's console is the rank's log. A module runs with
``--module MODULE``, a shell script with ``--no_python bash SCRIPT``. The plan sets
CUDA_VISIBLE_DEVICES for GPU lists; no ``--gpu_ids``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.plan.launchers import torchrun
from fleetctl.plan.launchers.base import (
    SCRIPT_KINDS,
    LaunchContext,
    Launcher,
    console_log,
    program,
    python_path,
    run_path,
)

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan

LOG_DIR = torchrun.LOG_DIR  # torch's agent writes it, in torchrun's layout


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    world = ctx.nnodes * ctx.procs
    return [
        python_path(node),
        "-m",
        "accelerate.commands.launch",
        f"--num_machines={ctx.nnodes}",
        f"--machine_rank={node.node_rank}",
        f"--main_process_ip={ctx.master_addr}",
        f"--main_process_port={ctx.rdzv_port}",
        f"--num_processes={world}",
        *(["--multi_gpu"] if world > 1 else []),  # accelerate refuses it for one process
        "--rdzv_backend=static",
        f"--log_dir={run_path(node, LOG_DIR)}",
        *ctx.extra_argv,
        *program(ctx, node, module=("--module",), shell=("--no_python",)),
    ]


def env(ctx: LaunchContext, node: NodePlan) -> dict[str, str]:
    out = {"PET_REDIRECTS": "3", "PET_RDZV_ID": ctx.job_id}
    if not ctx.gpus_per_node:  # one gloo world on the CPU, not one job per rank
        out["ACCELERATE_USE_CPU"] = "true"
    return out


def rank_files(node_dir: Path, local: int, rank: int) -> list[Path]:
    """torch's per-rank files; one process in all (no torch agent): the console."""
    return torchrun.rank_files(node_dir, local, rank) or console_log(node_dir, local, rank)


OWNED = frozenset(
    {
        "--num-machines",
        "--machine-rank",
        "--main-process-ip",
        "--main-process-port",
        "--num-processes",
        "--multi-gpu",
        "--tpu",
        "--rdzv-backend",
        "--log-dir",
        "--tee",  # the ranks' output is in their own files already (PET_REDIRECTS)
    }
)
# Refused with their own reason: what the user meant is done another way.
REFUSED = {
    "--cpu": (
        "accelerate's --cpu runs one process per machine with no RANK/WORLD_SIZE (no world); "
        "on nodes without GPUs fleetctl already runs one CPU world (ACCELERATE_USE_CPU=true), "
        "on GPU nodes pass --env-var ACCELERATE_USE_CPU=true instead"
    ),
}

LAUNCHER = Launcher(
    name="accelerate",
    argv=argv,
    env=env,
    module="accelerate.commands.launch",
    owned=OWNED,
    refused=REFUSED,
    kinds=frozenset(SCRIPT_KINDS),
    kind_options=frozenset({"-m", "--module", "--no-python"}),
    rank_logs=torchrun.rank_logs,
    rank_files=rank_files,
    named_failures=torchrun.named_failures,
)
