"""``status``/``stop``/``logs -f`` of a job ``run --slurm`` submitted: Slurm's side of it.

A submitted job's controller is the fleetctl inside its batch script, so from outside
``stop`` is ``scancel`` (SIGTERM to that fleetctl first: it tears the ranks down, verified,
and brings the logs home) verified by the queue; ``logs -f`` follows the script's output
files; ``status`` adds Slurm's state to the run folder's. Jobs not submitted this way are
not touched here (each hook returns False and the command goes on as before).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def _submitted(runs_dir: str, job: str) -> tuple[Any, dict[str, Any]] | None:
    from fleetctl.errors import RunFolderError
    from fleetctl.job.runfolder import load_run

    try:
        folder = load_run(runs_dir, job)
    except RunFolderError:
        return None  # the command's own lookup reports it
    record = folder.load_slurm()
    return (folder, record) if record and record.get("job_id") else None


def _job_status(folder: Any) -> str | None:
    from fleetctl.errors import RunFolderError

    try:
        return str(folder.load_job().status)
    except RunFolderError:
        return None


def status_hook(runs_dir: str, job: str, as_json: bool) -> bool:
    """Print Slurm's line; True when that is all there is (the job never ran inside)."""
    import json

    from fleetctl.slurm.queue import describe
    from fleetctl.slurm.submit import SlurmClient

    found = _submitted(runs_dir, job)
    if found is None:
        return False
    folder, record = found
    sj = str(record["job_id"])
    info = SlurmClient().show(sj)
    pos = SlurmClient().position(sj) if info is not None and info.state == "PENDING" else None
    slurm_line = describe(info, pos) if info is not None else f"{record.get('state')} (last seen)"
    status = _job_status(folder)
    if as_json:
        if status not in (None, "queued"):
            return False  # the run folder's full report (it carries slurm.job_id too)
        click.echo(
            json.dumps(
                {"job_id": folder.job_id, "status": status, "slurm": {**record, "now": slurm_line}},
                indent=2,
            )
        )
        return True
    click.echo(f"job {folder.job_id}: Slurm job {sj}: {slurm_line}")
    return status in (None, "queued")


def stop_hook(runs_dir: str, job: str) -> bool:
    """scancel a submitted job still in Slurm's queue, verified; True when done here."""
    from fleetctl.slurm.submit import SlurmClient

    found = _submitted(runs_dir, job)
    if found is None:
        return False
    folder, record = found
    sj = str(record["job_id"])
    slurm = SlurmClient()
    if not (slurm.queued(sj) or slurm.queued(sj, steps=True)):
        return False  # already over: the ordinary stop verifies the nodes
    click.echo(f"fleetctl: job {folder.job_id}: scancel Slurm job {sj}", err=True)
    slurm.cancel(sj, graceful=True)
    record["state"] = "CANCELLED"
    folder.write_slurm(record)
    with_status = _job_status(folder)
    if with_status == "queued":
        with folder.editing_job() as rec:
            rec.status, rec.verdict = "cancelled", "fleetctl stop: scancel before it started"
    click.echo(
        f"fleetctl: job {folder.job_id} stopped; Slurm job {sj} gone from the queue, no step left",
        err=True,
    )
    return True


def logs_follow_hook(runs_dir: str, job: str) -> bool:
    """``logs -f``: the batch script's output, live, until the Slurm job ends."""
    from fleetctl.slurm.batch import ERROR_FILE, OUTPUT_FILE
    from fleetctl.slurm.submit import SlurmClient, SlurmEvent, follow, wait_started

    found = _submitted(runs_dir, job)
    if found is None:
        return False
    folder, record = found
    sj = str(record["job_id"])
    slurm = SlurmClient()

    def emit(ev: SlurmEvent) -> None:
        if ev.kind in ("line", "errline"):
            click.echo(ev.text, err=ev.kind == "errline")
        elif ev.kind == "waiting":
            click.echo(f"fleetctl: Slurm job {sj}: {ev.text}", err=True)

    info = slurm.show(sj)
    out, err = Path(folder.path) / OUTPUT_FILE, Path(folder.path) / ERROR_FILE
    if info is not None and info.pending:
        info = wait_started(slurm, sj, emit, queue_timeout=None)
    follow(slurm, sj, out, emit, err)
    return True
