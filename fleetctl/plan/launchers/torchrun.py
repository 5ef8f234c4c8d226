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

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
# its ChildFailedError summary: "rank      : 3 (local_rank: 1)" then "exitcode  : 1 (pid: …)"
_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")


# run --elastic: a c10d rendezvous on node 0's training address (node 0's agent hosts its
# store, said outright: torch's guess by host name fails where the name is not that address).
# A round waits up to 60 s for the world (a spare's start and relay) and closes 2 s after the
# last expected node joined; a peer's agent is dropped after 3 missed 2 s keep-alives. Every
# membership change restarts the workers (torchrun counts only failures as restarts).
ELASTIC_RDZV_CONF = "join_timeout=60,last_call_timeout=2,close_timeout=10,keep_alive_interval=2"
ELASTIC_MAX_RESTARTS = 3


def env(ctx: LaunchContext, node: NodePlan) -> dict[str, str]:
    """run --elastic: every round's rank 0 publishes the workers' master address anew. With
    torch's shared store (its default) an agent that stays rank 0 publishes it only in its
    first round, and a spare joining a later round waits for it until it times out (torch
    2.13)."""
    return {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} if ctx.elastic is not None else {}


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    if ctx.elastic is not None:
        world = [
            f"--nnodes={ctx.elastic}",
            f"--nproc-per-node={ctx.procs}",
            "--rdzv-backend=c10d",
            f"--rdzv-id={ctx.job_id}",
            f"--rdzv-endpoint={ctx.master_addr}:{ctx.rdzv_port}",
            f"--rdzv-conf={ELASTIC_RDZV_CONF},is_host={str(node.node_rank == 0).lower()}",
            f"--max-restarts={ELASTIC_MAX_RESTARTS}",
            f"--local-addr={node.train_addr or node.address}",
        ]
    else:
        world = [
            f"--nnodes={ctx.nnodes}",
            f"--node-rank={node.node_rank}",
            f"--nproc-per-node={ctx.procs}",
            "--rdzv-backend=static",
            f"--rdzv-id={ctx.job_id}",
            f"--master-addr={ctx.master_addr}",
            f"--master-port={ctx.rdzv_port}",
        ]
    return [
        python_path(node),
        "-m",
        "torch.distributed.run",
        *world,
        f"--log-dir={run_path(node, LOG_DIR)}",
        # each local rank's stdout/stderr into its own files under --log-dir; the supervisor
        # tails them into whole lines tagged with the global rank (torchrun's own --tee would
        # splice partial lines of different ranks)
        "--redirects=3",
        *ctx.extra_argv,
        *program(ctx, node, module=("-m",), shell=("--no-python",)),
    ]


def rank_logs(node_rank: int, nproc: int) -> dict[str, Any]:
    """``<dir>/<run>/attempt_K/<local>/{stdout,stderr}.log`` (any depth)."""
    files = [rf"(?:.*/)?([0-9]+)/{name}\.log" for name in ("stdout", "stderr")]
    return {"dir": LOG_DIR, "base": node_rank * nproc, "files": files, "deep": True}


def rank_files(node_dir: Path, local: int, rank: int) -> list[Path]:
    """Every attempt of torchrun's restarts, in order."""
    found = sorted(node_dir.glob(f"{LOG_DIR}/*/attempt_*/{local}/std*.log"))
    return [p for p in found if p.name in ("stdout.log", "stderr.log")]


def named_failures(tail: list[str]) -> list[tuple[int, int | None]]:
    """The ranks of torchrun's error summary, each with the exit code on the lines after it."""
    named: list[tuple[int, int | None]] = []
    for i, line in enumerate(tail):
        m = _RANK.match(line)
        if m:
            code = None
            for nxt in tail[i + 1 : i + 3]:
                e = _EXIT.match(nxt)
                if e:
                    code = int(e.group(1))
            named.append((int(m.group(1)), code))
    return named


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
    env=env,
    module="torch.distributed.run",
    owned=OWNED,
    kinds=frozenset(SCRIPT_KINDS),
    kind_options=frozenset({"-m", "--module", "--no-python"}),
    rank_logs=rank_logs,
    rank_files=rank_files,
    named_failures=named_failures,
    elastic=True,
)
