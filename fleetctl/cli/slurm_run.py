"""``fleetctl run --slurm``: the options, and the submit → wait → follow → report flow.

The batch script runs ``fleetctl run`` inside the allocation with the job options given here
(every option the user set, except the Slurm and submit-side ones; carried in a file,
``run --spec``, so that no value is on the batch node's process list), so the check, launch,
first-failure teardown and run folder are the inside run's; this side submits, shows the
queue, streams the script's output and ends with the inside run's exit code.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from fleetctl.cli.options import spec_options
from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from fleetctl.api.slurm import Submission
    from fleetctl.api.types import SlurmEvent

#: run_command's parameters that belong to this side, not to the run inside the allocation
_NOT_FORWARDED = frozenset(
    {
        "slurm",
        "no_slurm",
        "partition",
        "gres",
        "slurm_time",
        "account",
        "sbatch_args",
        "queue_timeout",
        "dry_run",
        "detach",
        "no_monitor",
        "monitor_lost_timeout",
        "runs_dir",
        "nodes_wanted",
        "as_json",
        "full",
        "script",
        "script_args",
        "job_file",  # --job: the submission passes its copy in the run folder, and --code
        "slurm_no_shared_fs",
        "spec_file",  # run --spec: the run inside reads its options from the file
    }
)


def slurm_options(f: Any) -> Any:
    """``fleetctl run``'s Slurm options: ``--slurm``, what it asks Slurm for (``RunSpec``'s
    Slurm group), ``--slurm-no-shared-fs``; ``--no-slurm``."""
    options = [
        click.option(
            "--slurm",
            is_flag=True,
            help="Submit the job to Slurm (sbatch) and follow it; needs --nodes N. Inside the "
            "allocation fleetctl runs the job as without Slurm (docs/slurm.md).",
        ),
        spec_options("slurm"),
        click.option(
            "--slurm-no-shared-fs",
            is_flag=True,
            help="--slurm: the batch host cannot see --runs-dir; follow and pull the run "
            "folder home through srun steps (the code must still be on a shared filesystem).",
        ),
        click.option(
            "--no-slurm",
            is_flag=True,
            help="Inside a Slurm allocation, ignore it: run on the inventory (or this machine) "
            "over SSH as outside Slurm.",
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def check_flags(params: dict[str, Any]) -> None:
    """Slurm options given without --slurm are mistakes, not no-ops."""
    if params.get("slurm"):
        if params.get("no_slurm"):
            raise UsageError("--slurm and --no-slurm contradict each other")
        return
    given = [
        flag
        for name, flag in (
            ("partition", "--partition"),
            ("gres", "--gres"),
            ("slurm_time", "--time"),
            ("account", "--account"),
            ("sbatch_args", "--sbatch-arg"),
            ("queue_timeout", "--queue-timeout"),
            ("slurm_no_shared_fs", "--slurm-no-shared-fs"),
        )
        if params.get(name)
    ]
    if given:
        raise UsageError(f"{', '.join(given)}: only with --slurm")


def forwarded_options(ctx: click.Context) -> list[str]:
    """The options the user set, as argv for the run inside the allocation."""
    from click.core import ParameterSource

    skip = _NOT_FORWARDED | ({"code_dir"} if ctx.params.get("job_file") else set())
    out: list[str] = []
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name in skip or p.name is None:
            continue
        source = ctx.get_parameter_source(p.name)
        if source not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            continue
        value = ctx.params.get(p.name)
        long = next((o for o in p.opts if o.startswith("--")), p.opts[0])
        if p.is_flag:
            if value:
                out.append(long)
            elif p.secondary_opts:
                out.append(p.secondary_opts[0])
        elif p.multiple:
            out += [f"{long}={v}" for v in value]
        elif value is not None:
            out.append(f"{long}={value}")
    return out


def run_slurm(ctx: click.Context) -> None:
    """``fleetctl run --slurm``: see the module docstring. Exit codes: the inside run's
    (0, 3, 4, 130), 2 for a request Slurm refuses, 5 for ``--queue-timeout``."""
    from fleetctl.api import slurm

    p = ctx.params
    if p.get("full"):
        raise UsageError("--full applies to --dry-run --json without --slurm (the plan)")
    if p.get("slurm_no_shared_fs") and p.get("detach"):
        raise UsageError(
            "--slurm-no-shared-fs needs this side to pull the run folder home: no --detach"
        )
    sub = slurm.submission(
        p["script"],
        p["script_args"],
        nodes=p["nodes_wanted"],
        job_file=p.get("job_file"),
        code=p.get("code_dir") if p.get("job_file") else None,
        shared_fs=not p.get("slurm_no_shared_fs"),
        options=forwarded_options(ctx),
        runs_dir=p["runs_dir"],
        partition=p.get("partition"),
        gres=p.get("gres"),
        time=p.get("slurm_time"),
        account=p.get("account"),
        sbatch_args=tuple(p.get("sbatch_args") or ()),
        launcher=p.get("launcher"),
    )
    if p.get("dry_run"):
        unchecked = sub.check()  # Slurm refusing the job: exit 2 here, as a submission would
        if p.get("as_json"):
            click.echo(json.dumps(_dry_run_document(sub), indent=2))
        else:
            click.echo(sub.script, nl=False)
        for line in _plan_lines(sub, p):
            click.echo(line, err=True)
        click.echo(
            f"fleetctl: dry run: not checked by Slurm: {unchecked}"
            if unchecked
            else "fleetctl: dry run: Slurm would take it (sbatch --test-only)",
            err=True,
        )
        return
    _submit_and_follow(sub, detach=bool(p.get("detach")), p=p)


def _dry_run_document(sub: Submission) -> dict[str, Any]:
    req = sub.request
    return {
        "dry_run": True,
        "job_id": req.job_id,
        "nodes": req.nodes,
        "folder": req.folder,
        "sbatch_script": sub.script,
        "command": list(req.command),
        "spec": {"file": req.spec_file, "argv": list(req.spec or ())},
        "job_file": None
        if sub.job_file is None
        else {"from": sub.job_file[0], "copy": sub.job_file[1]},
    }


def _plan_lines(sub: Submission, p: dict[str, Any]) -> list[str]:
    req = sub.request
    what = (
        f"the role job {sub.job_file[0]} (copied to {sub.job_file[1]} at submit)"
        if sub.job_file
        else f"launcher {p.get('launcher')}, SCRIPT {p['script']}"
    )
    return [
        f"fleetctl: dry run: would submit the script above with `sbatch --parsable` "
        f"({req.nodes} node(s){', partition ' + req.partition if req.partition else ''})",
        f"fleetctl: inside the allocation: `fleetctl run` on its {req.nodes} node(s), one "
        f"supervisor per node by srun, {what}",
        f"fleetctl: run folder {req.folder} (the job's output: {req.output}, "
        f"{req.folder}/slurm.err)",
    ]


def _submit_and_follow(sub: Submission, *, detach: bool, p: dict[str, Any]) -> None:
    as_json = bool(p.get("as_json"))
    job = sub.submit(detach=detach)
    submitted = job.submitted
    assert submitted is not None  # the sbatch executor's job
    slurm_job = submitted.slurm_job_id
    click.echo(f"fleetctl: job {job.job_id} submitted as Slurm job {slurm_job}", err=True)
    if detach:
        click.echo(
            f"fleetctl: follow with `fleetctl logs -f {job.job_id}`, end with "
            f"`fleetctl stop {job.job_id}` (scancel {slurm_job})",
            err=True,
        )
        if as_json:
            click.echo(json.dumps({"job_id": job.job_id, "slurm": {"job_id": slurm_job}}))
        else:
            click.echo(f"{slurm_job} {job.job_id}")
        return
    if not as_json:
        job.wait(on_event=emit, queue_timeout=p.get("queue_timeout"), check=True)
        return
    # --json: stdout is the run's document alone (as `run --json`: no live lines), printed
    # whatever the verdict, before its error (if any) ends the command
    try:
        job.wait(on_event=_emit_json, queue_timeout=p.get("queue_timeout"), check=True)
    finally:
        doc = submitted.document()
        if doc is not None:
            click.echo(json.dumps(doc, indent=2))


def _emit_json(ev: SlurmEvent) -> None:
    if ev.kind != "line":  # the job's stdout lines are in slurm.out; the rest as without --json
        emit(ev)


def emit(ev: SlurmEvent) -> None:
    """One submitter event on the terminal: the job's lines as they are, the rest on stderr."""
    if ev.kind == "line":
        click.echo(ev.text)
    elif ev.kind == "errline":
        click.echo(ev.text, err=True)
    elif ev.kind == "waiting":
        click.echo(f"fleetctl: Slurm job {ev.job_id}: {ev.text}", err=True)
    elif ev.kind == "started":
        click.echo(f"fleetctl: Slurm job {ev.job_id} running on {ev.text}", err=True)
    elif ev.kind == "pulled":
        click.echo(f"fleetctl: Slurm job {ev.job_id}: run folder pulled from {ev.text}", err=True)
    elif ev.kind in ("cancelling", "cancelled", "cancel_failed"):
        click.echo(f"fleetctl: Slurm job {ev.job_id}: {ev.kind}: {ev.text}", err=True)
