"""``fleetctl run``: plan a job from the inventory and run it on every node.

Everything after SCRIPT goes to the script untouched (fleetctl's own options come first), like
torchrun. ``--dry-run`` stops after planning: no network, nothing started; ``--json`` prints the
plan in the contract shape ``{"job_id", "nodes": [{"host", "address", "node_rank", "nic",
"argv", "env"}…]}``, long fleet-wide values once under ``shared`` (``--full``: on every node).
Without ``--dry-run`` the options go to ``Fleet.run`` (docs/api.md: check → push → launch →
watch → teardown → collect), run in this thread; the result is rendered here.
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from fleetctl.api.names import (
    DEFAULT_LAUNCHER,
    DEFAULT_MASTER_PORT,
)
from fleetctl.cli import cli
from fleetctl.cli.collective_opts import collective_options, collective_settings
from fleetctl.cli.jobs_cmd import lifecycle_options
from fleetctl.cli.options import (
    RegularFile,
    SSHOptions,
    allow_secret_option,
    collect_options,
    collect_settings,
    field_type,
    inventory_option,
    limit_option,
    open_fleet,
    ssh_options,
)
from fleetctl.cli.sections import RUN_EXAMPLES, SectionedCommand, run_sections
from fleetctl.cli.slurm_run import slurm_options
from fleetctl.errors import Interrupted, JobFailed, LogsIncomplete, UsageError

if TYPE_CHECKING:
    from fleetctl.api import Job


def new_job_id(now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>`` in UTC: sorts by start time, random suffix avoids clashes."""
    from fleetctl.api.runrequest import new_job_id as new

    return new(now)


class NprocType(click.ParamType):
    """``--nproc-per-node``: a positive integer or ``auto`` (one per GPU, 1 without GPUs)."""

    name = "N|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from fleetctl.api.checks import Invalid, nproc

        try:
            return nproc(value)
        except Invalid as e:
            self.fail(str(e), param, ctx)


def parse_env_vars(items: tuple[str, ...]) -> dict[str, str]:
    """``K=V`` pairs (``=`` allowed in V); a later K wins. BadParameter names the bad item."""
    from fleetctl.api.checks import Invalid, env_name

    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise Invalid(f"{item!r} is not NAME=VALUE")
            env[env_name(key)] = value
        except Invalid as e:
            raise click.BadParameter(str(e), param_hint="'--env-var'") from None
    return env


@cli.command(
    "run",
    cls=SectionedCommand,
    sections=run_sections(),
    examples=RUN_EXAMPLES,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@inventory_option
@limit_option
@ssh_options(fanout_help=None)  # a job needs every node at once
@click.option(
    "--launcher",
    type=field_type("launcher"),
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
    type=field_type("master_port"),
    default=None,
    help=f"Rendezvous port on node 0 (paddle: its start port). Default: the first port from "
    f"{DEFAULT_MASTER_PORT} that is free and not held by another fleetctl job, claimed for "
    "this job; given, that port or a clear refusal.",
)
@click.option(
    "--launcher-arg",
    "launcher_args",
    type=field_type("launcher_args"),
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
    type=field_type("backend"),
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
    type=field_type("nodes"),
    default=None,
    metavar="N",
    help="Run on N hosts of the selection (inventory order) that pass the check; the others "
    "are spares that replace a host failing later (with --max-retries).",
)
@click.option(
    "--checkpoint-dir",
    type=field_type("checkpoint_dir"),
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
    type=field_type("grace"),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when the job is stopped.",
)
@click.option(
    "--lost-timeout",
    type=field_type("lost_timeout"),
    default=5.0,
    show_default=True,
    help="A node silent this long (no heartbeat) is lost: the job is stopped everywhere.",
)
@click.option(
    "--deadman",
    type=field_type("deadman"),
    default=10.0,
    show_default=True,
    help="Node side: no heartbeat from fleetctl this long and the node stops the job itself.",
)
@click.option(
    "--timeout",
    "timeout",
    type=field_type("timeout"),
    default=None,
    help="Wall-clock limit from launch: then the job is stopped everywhere (exit 3).",
)
@click.option(
    "--stall-timeout",
    type=field_type("stall_timeout"),
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
    type=field_type("before"),
    default=None,
    metavar="FILE:TASK",
    help="A Fabric task (fabfile.py:prepare) run on every node, each with its Connection, "
    "after the check and push, before the launch; failing on a node stops the run there.",
)
@click.option(
    "--image",
    type=field_type("image"),
    default=None,
    metavar="IMAGE",
    help="Run each node's launcher in one container of IMAGE (over the inventory's "
    "fleetctl_image); see docs/containers.md.",
)
@click.option(
    "--container-runtime",
    type=field_type("container_runtime"),
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

    check_flags(lifecycle)
    if lifecycle["slurm"]:  # submitted: the same run happens inside the allocation
        return run_slurm(click.get_current_context())
    env = parse_env_vars(env_vars)
    if full and not (dry_run and as_json):
        raise UsageError("--full applies to --dry-run --json (the plan printed as JSON)")
    if tail not in ("all", "none") and not tail.isdigit():
        raise click.BadParameter(f"{tail!r}: use all, none or a node rank", param_hint="--tail")
    in_slurm = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if in_slurm and not lifecycle["no_slurm"]:  # inside an allocation: its nodes, via srun
        from fleetctl.api import Fleet

        s = ssh.settings
        fleet = Fleet.slurm(
            inventory,
            limit,
            known_hosts=s.known_hosts,
            accept_new=s.accept_new,
            connect_timeout=s.connect_timeout,
            runs_dir=runs_dir,
        )
    else:
        fleet = open_fleet(inventory, limit, ssh, runs_dir=runs_dir)
    collect = collect_settings(lifecycle["collect_max"], lifecycle["collect_exclude"])
    collective = (
        None
        if dry_run
        else collective_settings(
            lifecycle["collective"],
            lifecycle["collective_size"],
            lifecycle["collective_min"],
            lifecycle["collective_floor"],
            lifecycle["collective_timeout"],
        )
    )
    live = None
    if not dry_run:
        from fleetctl.cli import render

        live = render.LiveLog(tail="none" if as_json else tail, raw=raw_output)
    ran = fleet.run(
        script,
        *script_args,
        launcher=launcher,
        nproc_per_node=nproc,
        env=env,
        stall_timeout=stall_timeout,
        timeout=timeout,
        detach=lifecycle["detach"],
        code=code_dir,
        env_archive=env_archive,
        check=not no_check,
        master_port=master_port,
        launcher_args=tuple(lifecycle["launcher_args"]),
        backend=backend,
        grace=grace,
        lost_timeout=lost_timeout,
        deadman=deadman,
        max_retries=lifecycle["max_retries"],
        retry_on=tuple(lifecycle["retry_on"]),
        no_retry_on=tuple(lifecycle["no_retry_on"]),
        retry_backoff=lifecycle["retry_backoff"],
        allow_secrets=tuple(lifecycle["allow_secrets"]),
        allow_busy_gpus=lifecycle["allow_busy_gpus"],
        before=lifecycle["before"],
        job_file=lifecycle["job_file"],
        env_style=lifecycle["env_style"],
        nodes=lifecycle["nodes_wanted"],
        checkpoint_dir=lifecycle["checkpoint_dir"],
        image=image,
        container_runtime=container_runtime,
        collective=collective,
        collect=collect,
        monitor=not lifecycle["no_monitor"],
        monitor_lost_timeout=lifecycle["monitor_lost_timeout"],
        dry_run=dry_run,
        foreground=True,
        on_event=live,
    )
    from fleetctl.api import Job

    if not isinstance(ran, Job):  # --dry-run: the plan
        if as_json:
            click.echo(ran.to_json(compact=not full))
        else:
            from fleetctl.cli import render

            render.print_plan(ran, inventory=fleet.inventory)
        return
    _render_run(ran, as_json=as_json, monitor_wanted=not lifecycle["no_monitor"])


def _render_run(job: Job, *, as_json: bool, monitor_wanted: bool) -> None:
    """The ended (or detached) job: its summary or JSON, and the exit status 0/3/4/130."""
    import json

    from fleetctl.cli import render, render_summary

    result = job.details
    assert result is not None
    if result.detached and result.status == "running":  # runs on under its supervisors
        for line in render.detached_lines(result, job.monitor, monitor_wanted=monitor_wanted):
            click.echo(line, err=True)
        click.echo(result.job_id)
        return
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        for line in render_summary.run_summary_lines(result):
            click.echo(line, err=True)
    verdict = job.wait()
    if result.status == "interrupted":
        raise Interrupted(f"job {result.job_id} interrupted; stopped on every node")
    if verdict.exit_code == Interrupted.exit_code:  # the logs' collection was interrupted
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
