"""paddle: ``python -m paddle.distributed.launch`` in its static ``--ips`` mode.

Checked against paddlepaddle 3.3.1 (``distributed/launch/context/args_envs.py``,
``plugins/__init__.py``, ``controllers/collective.py``):

* ``--ips`` (same list, same order on every node) with no ``--master`` selects
  ``_build_pod_with_args``: the node's rank is ``ips.index(node_ip)``. paddle guesses
  ``node_ip`` with ``gethostbyname(getfqdn())``, which is 127.0.0.1 on many boxes — and an IP
  missing from ``--ips`` silently becomes rank 0 on every node. So each node also gets
  ``--host=<its training address>``; paddle's ``rewrite_host_ip`` plugin only honours a value
  containing a dot, hence :func:`validate` insists on dotted addresses. There is no
  ``--rank`` flag in this mode: the position in ``--ips`` is the rank.
* Endpoints are ``<ip>:<start_port + local_rank>`` and the job's store lives at the first one,
  so ``--start_port`` carries the plan's master port: two jobs on the same hosts stay apart
  when given different ``--master-port`` values.
* GPUs: ``--devices=0,…,K-1`` (``--gpus`` is an alias). CPU (no GPUs known): no device flag,
  ``--nproc_per_node=K`` and paddle falls back to gloo.
* ``--log_dir=log`` (relative to the node run folder) holds ``workerlog.N`` and paddle's
  ``<job>.<pod>.log`` (its endpoints, after a dump of the launcher's environment: paddle 3.3.1
  writes no ``endpoints.log``); ``--job_id`` names those files after the fleet job.

Only flags paddle's parser knows are passed: an unknown one flips paddle into legacy mode.
paddle runs a file named ``*.py`` with its python and executes any other file itself, and has
no ``-m``: only ``.py`` scripts are accepted (:func:`check_script`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import PlanError
from fleetctl.plan.launchers.base import (
    PYTHON,
    LaunchContext,
    Launcher,
    python_path,
    run_path,
    script_path,
)
from fleetctl.plan.launchers.deepspeed import _require_unique

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan

LOG_DIR = "log"  # relative to the node run folder
# "ABORT!!! Out of all 4 trainers, the trainer process with rank=[2, 3] was aborted."
_ABORT = re.compile(r"rank=\[([\d,\s]+)\] was aborted")
# paddle 3.3.1's dumps of the whole environment, relative to the node folder: ``<job>.<pod>.log``
# as ``environ({...})``, ``envlog.N`` as ``KEY=VALUE`` lines, ``backup_env.N.json``
ENV_DUMPS = (f"{LOG_DIR}/envlog.*", f"{LOG_DIR}/backup_env.*.json", f"{LOG_DIR}/*.*.log")


def argv(ctx: LaunchContext, node: NodePlan) -> list[str]:
    if node.gpus:  # paddle takes labels of CUDA_VISIBLE_DEVICES (the plan sets it to these)
        procs = "--devices=" + ",".join(node.gpus)
    elif ctx.gpus_per_node > 0:
        procs = "--devices=" + ",".join(str(i) for i in range(ctx.procs))
    else:
        procs = f"--nproc_per_node={ctx.procs}"
    return [
        python_path(node),
        "-m",
        "paddle.distributed.launch",
        ctx.once("--ips", lambda: f"--ips={ctx.ips_csv}"),
        f"--host={node.train_addr}",
        f"--nnodes={ctx.nnodes}",
        procs,
        f"--start_port={ctx.rdzv_port}",
        f"--job_id={ctx.job_id}",
        f"--log_dir={run_path(node, LOG_DIR)}",
        *ctx.extra_argv,
        script_path(node, ctx.script),
        *ctx.args,
    ]


def check_script(kind: str, script: str) -> None:
    """paddle would execute a Python file not named ``*.py`` directly (no python before it)."""
    if kind == PYTHON and not script.endswith(".py"):
        raise PlanError(
            f"paddle runs only *.py scripts with python (it would execute {script} itself); "
            "name it .py or use --launcher plain or torchrun"
        )


def validate(ctx: LaunchContext, addrs: Mapping[str, str]) -> None:
    _require_unique(addrs, "paddle")
    for host, addr in addrs.items():
        if "." not in addr or ":" in addr:
            raise PlanError(
                f"{host}: training address {addr!r} is not a dotted IPv4 address or FQDN; "
                "paddle ignores --host without a dot and would guess the node's IP "
                "(set fleetctl_addr or fleetctl_nic)"
            )
    if ctx.nnodes > 1:
        for host, addr in addrs.items():
            if addr.startswith("127."):
                raise PlanError(
                    f"{host}: training address {addr} is loopback; paddle refuses 127.0.0.1 in a "
                    "multi-node --ips list (set fleetctl_addr or fleetctl_nic)"
                )


def rank_logs(node_rank: int, nproc: int) -> dict[str, Any]:
    """``<dir>/workerlog.<local>``; paddle also copies workerlog.0 to its stdout (``echo``)."""
    files = [r"workerlog\.([0-9]+)"]
    return {"dir": LOG_DIR, "base": node_rank * nproc, "files": files, "echo": "workerlog.0"}


def rank_files(node_dir: Path, local: int, rank: int) -> list[Path]:
    return [p for p in [node_dir / LOG_DIR / f"workerlog.{local}"] if p.is_file()]


def named_failures(tail: list[str]) -> list[tuple[int, int | None]]:
    """The ranks of paddle's ABORT line (no exit codes: it does not say them)."""
    named: list[tuple[int, int | None]] = []
    for line in tail:
        m = _ABORT.search(line)
        if m:
            named += [(int(x), None) for x in m.group(1).replace(" ", "").split(",") if x]
    return named


OWNED = frozenset(
    {
        "--ips",
        "--host",
        "--nnodes",
        "--devices",
        "--gpus",
        "--nproc-per-node",
        "--start-port",
        "--job-id",
        "--log-dir",
        "--rank",
        "--master",
    }
)

LAUNCHER = Launcher(
    name="paddle",
    argv=argv,
    validate=validate,
    module="paddle.distributed.launch",
    owned=OWNED,
    check_script=check_script,
    port_per_local_rank=True,
    rank_logs=rank_logs,
    rank_files=rank_files,
    named_failures=named_failures,
    env_dumps=ENV_DUMPS,
)
