"""``fleetctl run``: plan a job from the inventory and run it on every node.

Everything after SCRIPT goes to the script untouched (fleetctl's own options come first), like
torchrun. ``--dry-run`` stops after planning: no network, nothing started; ``--json`` prints the
plan in the contract shape ``{"job_id", "nodes": [{"host", "address", "node_rank", "nic",
"argv", "env"}…]}``, long fleet-wide values once under ``shared`` (``--full``: on every node).
Without ``--dry-run`` the JobSpec is handed to ``fleetctl.job.run.run_job`` (check → push →
launch → watch → teardown → collect).
"""

from __future__ import annotations

import os
import secrets
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click

from fleetctl.cli import cli
from fleetctl.cli.collective_opts import collective_options, collective_settings
from fleetctl.cli.jobs_cmd import lifecycle_options
from fleetctl.cli.options import (
    Count,
    RegularFile,
    Seconds,
    SSHOptions,
    allow_secret_option,
    collect_options,
    collect_settings,
    inventory_option,
    limit_option,
    load_selected,
    ssh_options,
)
from fleetctl.cli.slurm_run import slurm_options
from fleetctl.errors import Interrupted, JobFailed, LogsIncomplete, UsageError
from fleetctl.plan.launchers import DEFAULT_LAUNCHER, LAUNCHER_NAMES
from fleetctl.plan.rankplan import BACKENDS, DEFAULT_MASTER_PORT, ENV_KEY_RE, JobSpec, format_job_id
from fleetctl.ssh.connection import SSHSettings

if TYPE_CHECKING:
    from fleetctl.job.retry import RetryPolicy
    from fleetctl.job.rolejob import RolePlanner
    from fleetctl.phases.collect import CollectOptions


def new_job_id(now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>`` in UTC: sorts by start time, random suffix avoids clashes."""
    return format_job_id(now or datetime.now(timezone.utc), secrets.token_hex(3))


def _adopted_job_id() -> str | None:
    """Inside the batch job ``run --slurm`` submitted: its job id (and run folder)."""
    from fleetctl.slurm.batch import adopted_job_id

    return adopted_job_id(os.environ)


MAX_NPROC = 4096  # per node: a typo's world size must not reach the planner


class NprocType(click.ParamType):
    """``--nproc-per-node``: a positive integer or ``auto`` (one per GPU, 1 without GPUs)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        elif str(value).strip().lower() == "auto":
            return "auto"
        else:
            try:
                n = int(str(value))
            except ValueError:
                self.fail(f"{value!r} is neither a positive integer nor 'auto'", param, ctx)
        if n < 1:
            self.fail(f"{value!r} is not a positive integer", param, ctx)
        if n > MAX_NPROC:
            self.fail(f"{value!r} is more than {MAX_NPROC} processes per node", param, ctx)
        return n


def parse_env_vars(items: tuple[str, ...]) -> dict[str, str]:
    """``K=V`` pairs (``=`` allowed in V); a later K wins. BadParameter names the bad item."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not ENV_KEY_RE.match(key):
            raise click.BadParameter(
                f"{item!r} is not NAME=VALUE with a valid variable name", param_hint="--env-var"
            )
        env[key] = value
    return env


@cli.command(
    "run",
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@inventory_option
@limit_option
@ssh_options(fanout_help=None)  # a job needs every node at once
@click.option(
    "--launcher",
    type=click.Choice(LAUNCHER_NAMES),
    default=DEFAULT_LAUNCHER,
    show_default=True,
    help="How each node starts its processes.",
)
@click.option(
    "--nproc-per-node",
    "nproc",
    type=NprocType(),
    default="auto",
    show_default=True,
    help="Processes per node; auto = one per GPU (all nodes must agree), 1 without GPUs.",
)
@click.option(
    "--master-port",
    type=click.IntRange(1, 65535),
    default=None,
    help=f"Rendezvous port on node 0 (paddle: its start port). Default: the first port from "
    f"{DEFAULT_MASTER_PORT} that is free and not held by another fleetctl job, claimed for "
    "this job; given, that port or a clear refusal.",
)
@click.option(
    "--launcher-arg",
    "launcher_args",
    multiple=True,
    metavar="ARG",
    help="Passed to the launcher after fleetctl's own flags, before SCRIPT (repeatable): "
    "--launcher-arg=--max-restarts=3. Options fleetctl sets (--nnodes, --node-rank, --ips, "
    "--hostfile, …) are refused.",
)
@click.option(
    "--env-var",
    "env_vars",
    multiple=True,
    metavar="NAME=VALUE",
    help="Extra env for every node; wins over fleetctl_env. Repeatable.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="Hint for the script (FLEET_BACKEND); default: the script decides.",
)
@click.option(
    "--code-dir",
    "--code",
    "code_dir",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="Local folder shipped to the nodes; SCRIPT must be inside it "
    "(default: the git work tree holding SCRIPT, else SCRIPT's folder).",
)
@allow_secret_option
@click.option("--dry-run", is_flag=True, help="Plan only: print what would run, start nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--full",
    is_flag=True,
    help="With --dry-run --json: every node's env, argv and files written out in full (as "
    "plan.json has them), not long fleet-wide values once under 'shared'; grows with nodes².",
)
@click.option(
    "--env",
    "env_archive",
    type=RegularFile(),
    default=None,
    help="conda-pack archive to push and run the job in (default: fleetctl_env_archive).",
)
@click.option("--no-check", is_flag=True, help="Skip the preflight check (connect only).")
@click.option(
    "--nodes",
    "nodes_wanted",
    type=Count(min=1),
    default=None,
    metavar="N",
    help="Run on N hosts of the selection (inventory order) that pass the check; the others "
    "are spares that replace a host failing later (with --max-retries).",
)
@click.option(
    "--checkpoint-dir",
    default=None,
    metavar="DIR",
    help="With --max-retries: the folder whose files rank 0's node relays to every node of a "
    "retry (relative to the job's work folder, or absolute on the nodes; default: the work "
    "folder).",
)
@click.option(
    "--allow-busy-gpus",
    is_flag=True,
    help="GPUs with another job's processes or memory in use are a warning, not a failure.",
)
@click.option(
    "--grace",
    type=Seconds(min=0),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when the job is stopped.",
)
@click.option(
    "--lost-timeout",
    type=Seconds(min=1, max=60),
    default=5.0,
    show_default=True,
    help="A node silent this long (no heartbeat) is lost: the job is stopped everywhere.",
)
@click.option(
    "--deadman",
    type=Seconds(min=2, max=10),
    default=10.0,
    show_default=True,
    help="Node side: no heartbeat from fleetctl this long and the node stops the job itself.",
)
@click.option(
    "--timeout",
    "timeout",
    type=Seconds(min=1),
    default=None,
    help="Wall-clock limit from launch: then the job is stopped everywhere (exit 3).",
)
@click.option(
    "--stall-timeout",
    type=Seconds(min=1),
    default=None,
    help="No output line from any node this long: the job is stalled and stopped (exit 3).",
)
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False),
    default="fleet-runs",
    show_default=True,
    help="Where run folders (plan, job.json, events, logs) are written.",
)
@click.option(
    "--tail",
    default="all",
    show_default=True,
    metavar="all|RANK|none",
    help="Live log lines from every node, one node only (e.g. 0), or none.",
)
@click.option(
    "--raw-output",
    is_flag=True,
    help="Pass the job's control sequences to the terminal as they are (default: colours "
    "only; the logs on disk are always byte-exact).",
)
@click.option(
    "--before",
    default=None,
    metavar="FILE:TASK",
    help="A Fabric task (fabfile.py:prepare) run on every node, each with its Connection, "
    "after the check and push, before the launch; failing on a node stops the run there.",
)
@click.option(
    "--image",
    default=None,
    metavar="IMAGE",
    help="Run each node's launcher in one container of IMAGE (over the inventory's "
    "fleetctl_image); see docs/containers.md.",
)
@click.option(
    "--container-runtime",
    default=None,
    metavar="podman|docker|apptainer",
    help="The runtime for --image (default: the first found on the node).",
)
@lifecycle_options
@collect_options
@collective_options
@slurm_options
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(
    inventory: str | None,
    limit: str | None,
    launcher: str,
    nproc: int | str,
    master_port: int | None,
    env_vars: tuple[str, ...],
    backend: str | None,
    code_dir: str | None,
    dry_run: bool,
    as_json: bool,
    full: bool,
    env_archive: str | None,
    no_check: bool,
    grace: float,
    lost_timeout: float,
    deadman: float,
    timeout: float | None,
    stall_timeout: float | None,
    runs_dir: str,
    tail: str,
    raw_output: bool,
    image: str | None,
    container_runtime: str | None,
    script: str | None,
    script_args: tuple[str, ...],
    ssh: SSHOptions,
    **lifecycle: Any,
) -> None:
    """Run SCRIPT [ARGS...] on every node of the inventory (default: this machine alone),
    or the roles of a job file (--job)."""
    from fleetctl.cli.slurm_run import check_flags, run_slurm
    from fleetctl.job.submit import RetryRequest

    check_flags(lifecycle)
    if lifecycle["slurm"]:  # submitted: the same run happens inside the allocation
        return run_slurm(click.get_current_context())
    if container_runtime is not None:
        from fleetctl.plan.runtimes import runtime

        runtime(container_runtime)  # a usage error before anything is read
    env = parse_env_vars(env_vars)
    if full and not (dry_run and as_json):
        raise UsageError("--full applies to --dry-run --json (the plan printed as JSON)")
    if tail not in ("all", "none") and not tail.isdigit():
        raise click.BadParameter(f"{tail!r}: use all, none or a node rank", param_hint="--tail")
    job_file: str | None = lifecycle["job_file"]
    env_style: str | None = lifecycle["env_style"]
    detach: bool = lifecycle["detach"]
    retry = RetryRequest(
        max_retries=lifecycle["max_retries"],
        retry_on=tuple(lifecycle["retry_on"]),
        no_retry_on=tuple(lifecycle["no_retry_on"]),
        backoff=lifecycle["retry_backoff"],
    )
    if env_style is not None and job_file is None:
        raise UsageError("--env-style names role env variables: it needs a role job (--job FILE)")
    if job_file is not None and lifecycle["launcher_args"]:
        raise UsageError(
            "--launcher-arg applies to SCRIPT's launcher; a role job (--job) sets "
            "each role's command in the job file"
        )
    if job_file is not None and script is not None:
        raise UsageError(f"--job {job_file} replaces SCRIPT; got {script!r} too")
    kind, folder = None, ""
    if job_file is None:
        if script is None:
            raise UsageError("missing SCRIPT (or --job FILE)")
        from fleetctl.plan.script_arg import resolve

        # SCRIPT or -m MODULE: what it is, the job's folder in the code (the script's own)
        prog = resolve(script, script_args, code_dir, launcher, lifecycle["launcher_args"])
        script, kind, folder, script_args = prog.script, prog.kind, prog.folder, prog.args
        code_dir = prog.code_dir
    from fleetctl.phases.checkpoints import checkpoint_dir_arg

    checkpoint_dir = checkpoint_dir_arg(lifecycle["checkpoint_dir"])
    before = None
    if lifecycle["before"] is not None:  # loaded now: a bad FILE:TASK fails before the check
        if inventory is None:
            raise UsageError("--before runs a Fabric task over SSH: it needs an inventory (-i)")
        from fleetctl.api.before import load_task

        before = load_task(lifecycle["before"])
    inv = load_selected(inventory, limit)
    in_slurm = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if in_slurm and not lifecycle["no_slurm"]:
        from fleetctl.slurm import allocation  # inside an allocation: its nodes, via srun

        inv = allocation.apply(inv, has_inventory=inventory is not None)
    want = lifecycle["nodes_wanted"]
    if want is not None and want > len(inv.nodes):
        raise UsageError(f"--nodes {want}: the selection has only {len(inv.nodes)} host(s)")
    now = datetime.now(timezone.utc)
    spec = JobSpec(
        script=script or "",
        job_id=_adopted_job_id() or new_job_id(now),
        args=script_args,
        launcher=launcher,
        nproc_per_node=nproc,
        master_port=master_port or DEFAULT_MASTER_PORT,
        master_port_fixed=master_port is not None,
        launcher_args=tuple(lifecycle["launcher_args"]),
        env=env,
        backend=backend,
        created=now.isoformat(timespec="seconds"),
        kind=kind,
        folder=folder,
        image=image,
        container_runtime=container_runtime,
    )
    planner = None
    job_retry = None
    if job_file is not None:  # role job (fleetctl.plan.roles): the job file replaces SCRIPT
        from fleetctl.job.rolejob import load_role_job

        role_job = load_role_job(
            job_file,
            inv.nodes,
            inv.groups,
            spec,
            code_dir=code_dir,
            env_style=env_style,
            detach=detach,
        )
        spec, code_dir, planner = role_job.spec, role_job.code_dir, role_job.planner
        job_retry = planner.job.retry
        timeout = timeout if timeout is not None else planner.job.timeout
        stall_timeout = stall_timeout if stall_timeout is not None else planner.job.stall_timeout
        nodes = planner.nodes
        plan_now = planner.dry_plan if dry_run else None
    else:
        nodes = inv.nodes
        plan_now = None
        if dry_run:
            from fleetctl.plan.rankplan import make_plan

            def plan_now(spec: JobSpec) -> Any:
                return make_plan(inv.nodes, spec)

    # what the real run would refuse, a dry run refuses too
    retry_policy = retry.policy(job_retry)
    collect = collect_settings(lifecycle["collect_max"], lifecycle["collect_exclude"])
    if plan_now is not None:
        plan = plan_now(spec)
        if as_json:
            click.echo(plan.to_json(compact=not full))
        else:
            from fleetctl.cli import render

            render.print_plan(plan, inventory=inv.path)
        return
    _run_for_real(
        spec,
        nodes,
        code_dir=code_dir,
        env_archive=env_archive,
        check=not no_check,
        grace=grace,
        lost_timeout=lost_timeout,
        deadman=deadman,
        timeout=timeout,
        stall_timeout=stall_timeout,
        runs_dir=runs_dir,
        tail=tail,
        raw_output=raw_output,
        as_json=as_json,
        inventory=inv.path,
        limit=limit,
        settings=ssh.settings,
        detach=detach,
        planner=planner,
        retry=retry_policy,
        monitor=not lifecycle["no_monitor"],
        monitor_lost_timeout=lifecycle["monitor_lost_timeout"],
        allow_secrets=tuple(lifecycle["allow_secrets"]),
        allow_busy_gpus=lifecycle["allow_busy_gpus"],
        nodes_wanted=lifecycle["nodes_wanted"],
        checkpoint_dir=checkpoint_dir,
        collect=collect,
        before=before,
        collective=collective_settings(
            lifecycle["collective"],
            lifecycle["collective_size"],
            lifecycle["collective_min"],
            lifecycle["collective_floor"],
            lifecycle["collective_timeout"],
        )
        or (planner.job.collective if planner is not None else None),  # the job file's key
    )


def _run_for_real(
    spec: JobSpec,
    nodes: Any,
    *,
    code_dir: str,
    env_archive: str | None,
    check: bool,
    grace: float,
    lost_timeout: float,
    deadman: float,
    timeout: float | None,
    stall_timeout: float | None,
    runs_dir: str,
    tail: str,
    raw_output: bool,
    as_json: bool,
    inventory: str | None,
    limit: str | None,
    settings: SSHSettings | None,
    detach: bool,
    planner: RolePlanner | None,
    retry: RetryPolicy,
    monitor: bool,
    monitor_lost_timeout: float | None,
    allow_secrets: tuple[str, ...] = (),
    collect: CollectOptions | None = None,
    allow_busy_gpus: bool = False,
    nodes_wanted: int | None = None,
    checkpoint_dir: str | None = None,
    before: Any = None,
    collective: Any = None,
) -> None:
    """check → push → launch → watch → teardown → collect, with live logs; exit 0/3/130."""
    import json

    from fleetctl.cli import render, render_summary
    from fleetctl.job.run import RunOptions
    from fleetctl.job.submit import JobRequest, submit

    options = RunOptions(
        runs_dir=runs_dir,
        check=check,
        grace=grace,
        lost_timeout=lost_timeout,
        deadman=deadman,
        timeout=timeout,
        stall_timeout=stall_timeout,
        code=os.path.abspath(code_dir),
        env_archive=env_archive,
        settings=settings,
        detach=detach,
        planner=planner,
        inventory=inventory,
        limit=limit,
        allow_secrets=allow_secrets,
        allow_busy_gpus=allow_busy_gpus,
        collect=collect,
        nodes_wanted=nodes_wanted,
        checkpoint_dir=checkpoint_dir,
        before_launch=before,
        collective=collective,
    )
    request = JobRequest(
        spec,
        nodes,
        options,
        retry=retry,
        monitor=monitor,
        monitor_lost_timeout=monitor_lost_timeout,
    )
    live = render.LiveLog(tail="none" if as_json else tail, raw=raw_output)
    done = submit(request, on_event=live)
    result = done.result
    if done.detached:
        for line in render.detached_lines(result, done.monitor, monitor_wanted=monitor):
            click.echo(line, err=True)
        click.echo(result.job_id)
        return
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        for line in render_summary.run_summary_lines(result):
            click.echo(line, err=True)
    if result.status == "interrupted":
        raise Interrupted(f"job {result.job_id} interrupted; stopped on every node")
    from fleetctl.phases.collect import interrupted

    if interrupted(result.collected):
        raise Interrupted(
            f"job {result.job_id} {result.status}, but LOGS INCOMPLETE: log collection "
            f"interrupted; `fleetctl collect {result.job_id}` fetches the rest"
        )
    if result.exit_code == LogsIncomplete.exit_code:
        raise LogsIncomplete(
            f"job {result.job_id} succeeded, but LOGS INCOMPLETE from "
            f"{', '.join(result.logs_incomplete)}: `fleetctl collect {result.job_id}` fetches "
            "the rest"
        )
    if result.exit_code:
        ff = result.failed_node
        what = (
            f"node {ff.rank} ({ff.host}) failed first: {ff.how()}"
            if ff
            else result.verdict or result.status
        )
        raise JobFailed(f"job {result.job_id}: {what}")
