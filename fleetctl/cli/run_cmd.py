"""``fleetctl run``: plan a job from the inventory and run it on every node.

Everything after SCRIPT goes to the script untouched (fleetctl's own options come first), like
torchrun. ``--dry-run`` stops after planning: no network, nothing started; ``--json`` prints the
plan in the contract shape ``{"job_id", "nodes": [{"host", "address", "node_rank", "nic",
"argv", "env"}…]}``, long fleet-wide values once under ``shared`` (``--full``: on every node).
Without ``--dry-run`` the options go to ``Fleet.run`` (docs/api.md: check → push → launch →
watch → teardown → collect), run in this thread; the result is rendered here.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from fleetctl.api.runspec import RunSpec
from fleetctl.cli import cli
from fleetctl.cli.options import (
    Checked,
    SSHOptions,
    inventory_option,
    limit_option,
    open_fleet,
    parse_env_vars,
    spec_keywords,
    spec_options,
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


class NprocType(Checked):
    """``--nproc-per-node``: a positive integer or ``auto`` (one per GPU, 1 without GPUs)."""

    def __init__(self) -> None:
        from fleetctl.api.checks import nproc

        super().__init__(nproc, "N|auto")


__all__ = ["NprocType", "new_job_id", "parse_env_vars", "run_command"]


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
@spec_options("program", "hosts", "supervision")
@click.option("--dry-run", is_flag=True, help="Plan only: print what would run, start nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--full",
    is_flag=True,
    help="With --dry-run --json: every node's env, argv and files written out in full (as "
    "plan.json has them), not long fleet-wide values once under 'shared'; grows with nodes².",
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
@spec_options("container", "monitor", "retry", "collection", "collective", "observe")
@slurm_options
@click.option(
    "--spec",
    "spec_file",
    default=None,
    hidden=True,
    metavar="FILE",
    help="The whole run from FILE (what `run --slurm`'s batch script runs: no option value on "
    "the batch node's process list).",
)
@click.argument("script", required=False)
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def run_command(
    inventory: str | None,
    limit: str | None,
    dry_run: bool,
    as_json: bool,
    full: bool,
    runs_dir: str,
    tail: str,
    raw_output: bool,
    script: str | None,
    script_args: tuple[str, ...],
    ssh: SSHOptions,
    **params: Any,
) -> None:
    """Run SCRIPT [ARGS...] on every node of the inventory (default: this machine alone),
    or the roles of a job file (--job)."""
    from fleetctl.cli.slurm_run import check_flags, run_slurm

    ctx = click.get_current_context()
    if params["spec_file"] is not None:
        return _run_spec(ctx, params["spec_file"])
    check_flags(params)
    if params["slurm"] and params["elastic"]:  # refused before sbatch, not in the allocation
        raise UsageError("--elastic: not with --slurm yet (SSH nodes only)")
    slurm = params["slurm"]
    # RunSpec's fields, as its keywords (checked by the record, as a library call's)
    keywords = spec_keywords(
        params,
        *("program", "hosts", "supervision", "retry", "container", "monitor", "collection"),
        *("collective", "observe", "slurm") if slurm else ("collective", "observe"),
    )
    if full and not (dry_run and as_json) and not slurm:
        raise UsageError("--full applies to --dry-run --json (the plan printed as JSON)")
    if tail not in ("all", "none") and not tail.isdigit():
        raise click.BadParameter(f"{tail!r}: use all, none or a node rank", param_hint="--tail")
    if dry_run and not slurm:  # the plan alone: no check runs (--slurm ships it inside)
        keywords["collective"] = None
    # the whole request, checked before the inventory is read (as Fleet.run's keywords are)
    spec = RunSpec.build(script, *script_args, **keywords)
    if slurm:  # submitted: the same run happens inside the allocation, from this record
        return run_slurm(ctx, spec, ssh)
    _run(
        spec,
        inventory=inventory,
        limit=limit,
        ssh=ssh,
        runs_dir=runs_dir,
        tail=tail,
        raw_output=raw_output,
        dry_run=dry_run,
        as_json=as_json,
        full=full,
        no_slurm=params["no_slurm"],
    )


def _run(
    spec: RunSpec,
    *,
    inventory: str | None,
    limit: str | None,
    ssh: SSHOptions,
    runs_dir: str,
    tail: str,
    raw_output: bool,
    dry_run: bool = False,
    as_json: bool = False,
    full: bool = False,
    no_slurm: bool = False,
) -> None:
    """Run (or plan) the checked record on the selection: inside a Slurm allocation its nodes
    (srun steps), else the inventory's over SSH (or this machine)."""
    from fleetctl.api import Fleet

    if Fleet.in_slurm() and not no_slurm:  # inside an allocation: its nodes, via srun
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
    live = None
    if not dry_run:
        from fleetctl.cli import render

        live = render.LiveLog(tail="none" if as_json else tail, raw=raw_output)
    ran = fleet.run_spec(spec, dry_run=dry_run, foreground=True, on_event=live)
    from fleetctl.api import Job

    if not isinstance(ran, Job):  # --dry-run: the plan
        if as_json:
            click.echo(ran.to_json(compact=not full))
        else:
            from fleetctl.cli import render

            render.print_plan(ran, inventory=fleet.inventory)
        return
    _render_run(ran, as_json=as_json, monitor_wanted=spec.monitor.monitor)


def _run_spec(ctx: click.Context, path: str) -> None:
    """``run --spec FILE`` (what ``run --slurm``'s batch script runs): the record and the
    selection the file holds (fleetctl.slurm.specfile), built from its JSON without a second
    parse of options; nothing else on the command line."""
    from click.core import ParameterSource

    from fleetctl.api.slurm import read_spec
    from fleetctl.api.types import SSHSettings
    from fleetctl.cli.options import DEFAULT_FANOUT

    given = [
        name
        for name in ctx.params
        if name != "spec_file" and ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
    ]
    if given:
        raise UsageError(f"--spec {path}: the whole run is in the file; got {given[0]} too")
    spec, inside = read_spec(path)
    settings = SSHSettings(
        known_hosts=inside.known_hosts,
        accept_new=inside.accept_new,
        connect_timeout=inside.connect_timeout,
    )
    if inside.tail not in ("all", "none") and not inside.tail.isdigit():
        raise UsageError(f"--spec {path}: 'inside': tail {inside.tail!r} is not all|RANK|none")
    _run(
        spec,
        inventory=inside.inventory,
        limit=inside.limit,
        ssh=SSHOptions(settings, DEFAULT_FANOUT),
        runs_dir=inside.runs_dir,
        tail=inside.tail,
        raw_output=inside.raw_output,
    )


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
        ff, slow = result.failed_node, result.slow
        what = result.verdict or result.status
        if ff is not None:  # the node named slow (--on-slow stop) failed first with its evidence
            named = slow is not None and slow.get("rank") == ff.rank
            how = f"slows the job ({slow['why']})" if named else ff.how()  # type: ignore[index]
            what = f"node {ff.rank} ({ff.host}) failed first: {how}"
        raise JobFailed(f"job {result.job_id}: {what}")
