"""``fleetctl run --slurm``: the options, and the submit → wait → follow → report flow.

The batch script runs ``fleetctl run --spec FILE`` inside the allocation: FILE holds the
run's ``RunSpec`` (built here from the options, as any run's is) as JSON, without the Slurm and
submit-side groups, so no value is on the batch node's process list and nothing is parsed
twice. The check, launch, first-failure teardown and run folder are the inside run's; this
side submits, shows the queue, streams the script's output and ends with the inside run's
exit code.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from fleetctl.cli.options import spec_options
from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from fleetctl.api.runspec import RunSpec
    from fleetctl.api.slurm import Submission
    from fleetctl.api.types import SlurmEvent
    from fleetctl.cli.options import SSHOptions


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
    from dataclasses import fields

    from fleetctl.api.runspec import Slurm, keyword

    if params.get("slurm"):
        if params.get("no_slurm"):
            raise UsageError("--slurm and --no-slurm contradict each other")
        return
    given = [
        f.metadata["flags"][0]
        for f in fields(Slurm)
        if params.get(f.metadata.get("param") or keyword(f))
    ]
    if params.get("slurm_no_shared_fs"):
        given.append("--slurm-no-shared-fs")
    if given:
        raise UsageError(f"{', '.join(given)}: only with --slurm")


def run_slurm(ctx: click.Context, spec: RunSpec, ssh: SSHOptions) -> None:
    """``fleetctl run --slurm`` of the run ``spec`` (built from the options): see the module
    docstring. Exit codes: the inside run's (0, 3, 4, 130), 2 for a request Slurm refuses, 5
    for ``--queue-timeout``."""
    from fleetctl.api import slurm

    p = ctx.params
    if p.get("full"):
        raise UsageError("--full applies to --dry-run --json without --slurm (the plan)")
    if p.get("slurm_no_shared_fs") and spec.monitor.detach:
        raise UsageError(
            "--slurm-no-shared-fs needs this side to pull the run folder home: no --detach"
        )
    sub = slurm.submission(
        spec,
        runs_dir=p["runs_dir"],
        shared_fs=not p.get("slurm_no_shared_fs"),
        inventory=p.get("inventory"),
        limit=p.get("limit"),
        settings=ssh.settings,
        tail=p["tail"],
        raw_output=bool(p.get("raw_output")),
    )
    if p.get("dry_run"):
        unchecked = sub.check()  # Slurm refusing the job: exit 2 here, as a submission would
        if p.get("as_json"):
            click.echo(json.dumps(sub.dry_run_document(), indent=2))
        else:
            click.echo(sub.script, nl=False)
        for line in _plan_lines(sub, spec):
            click.echo(line, err=True)
        click.echo(
            f"fleetctl: dry run: not checked by Slurm: {unchecked}"
            if unchecked
            else "fleetctl: dry run: Slurm would take it (sbatch --test-only)",
            err=True,
        )
        return
    _submit_and_follow(sub, detach=spec.monitor.detach, as_json=bool(p.get("as_json")))


def _plan_lines(sub: Submission, spec: RunSpec) -> list[str]:
    req = sub.request
    what = sub.program_words(spec)
    return [
        f"fleetctl: dry run: would submit the script above with `sbatch --parsable` "
        f"({req.nodes} node(s){', partition ' + req.partition if req.partition else ''})",
        f"fleetctl: inside the allocation: `fleetctl run` on its {req.nodes} node(s), one "
        f"supervisor per node by srun, {what}",
        f"fleetctl: run folder {req.folder} (the job's output: {req.output}, "
        f"{req.folder}/slurm.err)",
    ]


def _submit_and_follow(sub: Submission, *, detach: bool, as_json: bool) -> None:
    """Submit; unless detached, follow the job to its end (its wait: the record's
    --queue-timeout, ``Submission.asked``) and exit as the run inside did."""
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
        job.wait(on_event=emit, check=True)
        return
    # --json: stdout is the run's document alone (as `run --json`: no live lines), printed
    # whatever the verdict, before its error (if any) ends the command
    try:
        job.wait(on_event=_emit_json, check=True)
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
