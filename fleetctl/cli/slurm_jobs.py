"""``status``/``stop``/``logs -f`` of a job ``run --slurm`` submitted: Slurm's side of it.

A submitted job's controller is the fleetctl inside its batch script, so from outside
``stop`` is ``scancel`` (SIGTERM to that fleetctl first: it tears the ranks down, verified,
and brings the logs home) verified by the queue; ``logs -f`` follows the script's output
files; ``status`` adds Slurm's state to the run folder's. Jobs not submitted this way are
not touched here (each hook returns False and the command goes on as before).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from fleetctl.api.types import SlurmEvent


def status_hook(runs_dir: str, job: str, as_json: bool) -> bool:
    """Print Slurm's line; True when that is all there is (the job never ran inside)."""
    import json

    from fleetctl.api.slurm import SlurmJob

    found = SlurmJob.find(runs_dir, job)
    if found is None:
        return False
    slurm_line = found.slurm_state()
    status = found.status()
    if as_json:
        if status not in (None, "queued"):
            return False  # the run folder's full report (it carries slurm.job_id too)
        click.echo(
            json.dumps(
                {
                    "job_id": found.job_id,
                    "status": status,
                    "slurm": {**found.record, "now": slurm_line},
                },
                indent=2,
            )
        )
        return True
    click.echo(f"job {found.job_id}: Slurm job {found.slurm_job_id}: {slurm_line}")
    return status in (None, "queued")


def stop_hook(runs_dir: str, job: str) -> bool:
    """scancel a submitted job still in Slurm's queue, verified; True when done here."""
    from fleetctl.api.slurm import SlurmJob

    found = SlurmJob.find(runs_dir, job)
    if found is None or not found.queued():
        return False  # not submitted, or already over: the ordinary stop verifies the nodes
    sj = found.slurm_job_id
    click.echo(f"fleetctl: job {found.job_id}: scancel Slurm job {sj}", err=True)
    found.stop()
    click.echo(
        f"fleetctl: job {found.job_id} stopped; Slurm job {sj} gone from the queue, no step left",
        err=True,
    )
    return True


def logs_follow_hook(runs_dir: str, job: str) -> bool:
    """``logs -f``: the batch script's output, live, until the Slurm job ends."""
    from fleetctl.api.slurm import SlurmJob

    found = SlurmJob.find(runs_dir, job)
    if found is None:
        return False
    sj = found.slurm_job_id

    def emit(ev: SlurmEvent) -> None:
        if ev.kind in ("line", "errline"):
            click.echo(ev.text, err=ev.kind == "errline")
        elif ev.kind == "waiting":
            click.echo(f"fleetctl: Slurm job {sj}: {ev.text}", err=True)

    found.follow(emit)
    return True
