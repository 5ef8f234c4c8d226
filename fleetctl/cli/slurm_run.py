"""``fleetctl run --slurm``: the options, and the submit → wait → follow → report flow.

The batch script runs ``fleetctl run`` inside the allocation with the job options given here
(every option the user set, except the Slurm and submit-side ones), so the check, launch,
first-failure teardown and run folder are the inside run's; this side submits, shows the
queue, streams the script's output and ends with the inside run's exit code.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from fleetctl.cli.options import Seconds
from fleetctl.errors import FleetctlError, Interrupted, UsageError

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
    }
)


def slurm_options(f: Any) -> Any:
    """``fleetctl run``'s Slurm options (``--slurm`` and what it asks Slurm for; ``--no-slurm``)."""
    options = [
        click.option(
            "--slurm",
            is_flag=True,
            help="Submit the job to Slurm (sbatch) and follow it; needs --nodes N. Inside the "
            "allocation fleetctl runs the job as without Slurm (docs/slurm.md).",
        ),
        click.option("--partition", default=None, metavar="P", help="--slurm: the partition."),
        click.option(
            "--gres", default=None, metavar="gpu:K|shard:K", help="--slurm: per-node GRES."
        ),
        click.option(
            "--time",
            "slurm_time",
            default=None,
            metavar="T",
            help="--slurm: the job's time limit (Slurm's format: 30, 1:00:00, 1-00:00:00).",
        ),
        click.option("--account", default=None, metavar="A", help="--slurm: the account."),
        click.option(
            "--sbatch-arg",
            "sbatch_args",
            multiple=True,
            metavar="ARG",
            help="--slurm: one more #SBATCH line, verbatim (--sbatch-arg=--qos=high). Repeatable.",
        ),
        click.option(
            "--queue-timeout",
            type=Seconds(min=1),
            default=None,
            help="--slurm: not started this long → scancel, exit 5 (default: wait).",
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
        )
        if params.get(name)
    ]
    if given:
        raise UsageError(f"{', '.join(given)}: only with --slurm")


def forwarded_options(ctx: click.Context) -> list[str]:
    """The options the user set, as argv for the run inside the allocation."""
    from click.core import ParameterSource

    out: list[str] = []
    for p in ctx.command.params:
        if not isinstance(p, click.Option) or p.name in _NOT_FORWARDED or p.name is None:
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


def _python_path() -> str:
    """Where this fleetctl is imported from, for the batch script's PYTHONPATH."""
    import fleetctl

    return str(Path(fleetctl.__file__).resolve().parent.parent)


def run_slurm(ctx: click.Context) -> None:
    """``fleetctl run --slurm``: see the module docstring. Exit codes: the inside run's
    (0, 3, 4, 130), 2 for a request Slurm refuses, 5 for ``--queue-timeout``."""
    from fleetctl.cli.run_cmd import new_job_id
    from fleetctl.slurm.batch import (
        RUN_ID_VAR,
        BatchRequest,
        check_gres,
        check_time,
        inside_command,
        render,
    )

    p = ctx.params
    if p.get("job_file") is not None:
        raise UsageError("--slurm: role jobs (--job) are not submitted to Slurm yet")
    if p.get("script") is None:
        raise UsageError("missing SCRIPT")
    if p.get("nodes_wanted") is None:
        raise UsageError("--slurm needs --nodes N (the nodes to ask Slurm for)")
    if p.get("as_json"):
        raise UsageError("--slurm: no --json yet (the run folder's job.json has the result)")
    job_id = new_job_id()
    runs_dir = os.path.abspath(p["runs_dir"])
    folder = os.path.join(runs_dir, job_id)
    inner = [*forwarded_options(ctx), f"--runs-dir={runs_dir}"]
    command = inside_command(sys.executable, inner, p["script"], p["script_args"])
    paths = [_python_path(), *(os.environ.get("PYTHONPATH") or "").split(os.pathsep)]
    env = {RUN_ID_VAR: job_id, "PYTHONPATH": os.pathsep.join(dict.fromkeys(x for x in paths if x))}
    req = BatchRequest(
        nodes=p["nodes_wanted"],
        job_id=job_id,
        folder=folder,
        chdir=os.getcwd(),
        command=command,
        partition=p.get("partition"),
        gres=check_gres(p["gres"]) if p.get("gres") else None,
        time=check_time(p["slurm_time"]) if p.get("slurm_time") else None,
        account=p.get("account"),
        extra=tuple(p.get("sbatch_args") or ()),
        env=env,
    )
    script = render(req)
    if p.get("dry_run"):
        click.echo(script, nl=False)
        for line in _plan_lines(req, p):
            click.echo(line, err=True)
        return
    _submit_and_follow(req, script, detach=bool(p.get("detach")), p=p)


def _plan_lines(req: Any, p: dict[str, Any]) -> list[str]:
    return [
        f"fleetctl: dry run: would submit the script above with `sbatch --parsable` "
        f"({req.nodes} node(s){', partition ' + req.partition if req.partition else ''})",
        f"fleetctl: inside the allocation: `fleetctl run` on its {req.nodes} node(s), one "
        f"supervisor per node by srun, launcher {p.get('launcher')}, SCRIPT {p['script']}",
        f"fleetctl: run folder {req.folder} (the job's output: {req.output}, "
        f"{req.folder}/slurm.err)",
    ]


def _submit_and_follow(req: Any, script: str, *, detach: bool, p: dict[str, Any]) -> None:
    from fleetctl.job.runfolder import RunFolder
    from fleetctl.slurm.batch import ERROR_FILE, SlurmError
    from fleetctl.slurm.submit import SlurmClient, SlurmEvent, run_submitted

    client = SlurmClient()
    run = RunFolder.create(Path(req.folder).parent, req.job_id)
    record: dict[str, Any] = {
        "job_id": None,  # until sbatch answers: the job may start before this side goes on
        "state": "SUBMITTING",
        "nodes": req.nodes,
        "partition": req.partition,
        "gres": req.gres,
        "time": req.time,
        "account": req.account,
        "script": "sbatch.sh",
        "output": "slurm.out",
        "error": ERROR_FILE,
        "detached": detach,
    }
    run.write_slurm(record, script)  # before sbatch: the batch job adopts the folder by it
    _write_queued_job(run, p, detach)
    try:
        slurm_job = client.sbatch(script)
    except FleetctlError:
        shutil.rmtree(run.path, ignore_errors=True)  # nothing was queued: no folder either
        raise
    record.update(job_id=slurm_job, state="PENDING")
    run.write_slurm(record)
    _record_slurm_job(run, slurm_job)
    click.echo(f"fleetctl: job {req.job_id} submitted as Slurm job {slurm_job}", err=True)
    if detach:
        click.echo(
            f"fleetctl: follow with `fleetctl logs -f {req.job_id}`, end with "
            f"`fleetctl stop {req.job_id}` (scancel {slurm_job})",
            err=True,
        )
        click.echo(f"{slurm_job} {req.job_id}")
        return

    def on_state(info: Any) -> None:
        record.update(state=info.state, reason=info.reason, nodelist=info.nodes)
        run.write_slurm(record)

    def emit(ev: SlurmEvent) -> None:
        if ev.kind == "line":
            click.echo(ev.text)
        elif ev.kind == "errline":
            click.echo(ev.text, err=True)
        elif ev.kind == "waiting":
            click.echo(f"fleetctl: Slurm job {ev.job_id}: {ev.text}", err=True)
        elif ev.kind == "started":
            click.echo(f"fleetctl: Slurm job {ev.job_id} running on {ev.text}", err=True)
        elif ev.kind in ("cancelling", "cancelled", "cancel_failed"):
            click.echo(f"fleetctl: Slurm job {ev.job_id}: {ev.kind}: {ev.text}", err=True)

    try:
        info = run_submitted(
            client,
            slurm_job,
            Path(req.output),
            emit,
            queue_timeout=p.get("queue_timeout"),
            on_state=on_state,
            error=Path(req.folder) / ERROR_FILE,
        )
    except KeyboardInterrupt:
        _mark_job(run, "interrupted", "the submitter was stopped: scancel")
        raise Interrupted(f"job {req.job_id}: Slurm job {slurm_job} cancelled") from None
    except FleetctlError as e:
        if not isinstance(e, SlurmError):
            _mark_job(run, "cancelled", e.one_line())
        raise
    _report(run, req.job_id, slurm_job, info)


def _write_queued_job(run: Any, p: dict[str, Any], detach: bool) -> None:
    """job.json before the job starts: ``runs``/``status``/``stop`` see it while queued; the
    run inside the allocation replaces it (with the Slurm job id again)."""
    from fleetctl.job.jobrecord import JobRecord

    run.write_job(
        JobRecord(
            job_id=run.job_id,
            status="queued",
            detached=detach,
            launcher=p.get("launcher"),
            folder=str(run.path),
        )
    )


def _record_slurm_job(run: Any, slurm_job: str) -> None:
    """The Slurm job id into job.json, unless the run inside has written it already."""
    with run.editing_job() as job:
        job.extra.setdefault("slurm", {"job_id": slurm_job})


def _mark_job(run: Any, status: str, verdict: str) -> None:
    """The job never ran inside (still queued, or refused): say how it ended."""
    from fleetctl.errors import RunFolderError

    try:
        with run.editing_job() as job:
            if job.status == "queued":
                job.status, job.verdict = status, verdict
    except (OSError, RunFolderError):
        pass


def _report(run: Any, job_id: str, slurm_job: str, info: Any) -> None:
    """The inside run's verdict and exit code (its own summary lines were streamed)."""
    from fleetctl.errors import JobFailed, RunFolderError
    from fleetctl.job.records import describe_failure
    from fleetctl.slurm.batch import SlurmJobFailed

    try:
        job = run.load_job()
    except RunFolderError:
        job = None
    status = job.status if job is not None else None
    if info.state == "COMPLETED" and not info.exit_code and status == "succeeded":
        return
    code = info.exit_code if info.exit_code else None
    if status in (None, "queued"):
        _mark_job(run, "failed", f"Slurm job {slurm_job} ended {info.state} before the run")
        raise JobFailed(
            f"job {job_id}: Slurm job {slurm_job} ended {info.state} before fleetctl ran "
            f"inside it; see {run.path / 'slurm.err'}"
        )
    if status == "interrupted":
        raise Interrupted(f"job {job_id}: Slurm job {slurm_job} {info.state}: interrupted")
    ff = job.first_failure.to_dict() if job.first_failure is not None else None
    what = describe_failure(ff) or job.verdict or status
    if status == "succeeded" and code == 4:
        what = "succeeded, but LOGS INCOMPLETE (the inside run's lines above say which)"
    raise SlurmJobFailed(
        f"job {job_id} (Slurm job {slurm_job}, {info.state}): {what}",
        exit_code=code if code in (2, 3, 4) else 3,
    )
