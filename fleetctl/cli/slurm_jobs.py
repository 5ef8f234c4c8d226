"""``status``/``logs -f`` of a job ``run --slurm`` submitted: the lines Slurm's side adds.

The work is the library's (``Job.attach(id)`` of a submitted job: its executor is
``"sbatch"``; ``status()`` carries Slurm's state, ``stop()`` is a verified ``scancel``,
``submitted.follow()`` the batch script's output); this module only renders it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from fleetctl.api import Job
    from fleetctl.api.lifecycle import StatusReport
    from fleetctl.api.types import SlurmEvent


def show_status(job: Job, report: StatusReport, as_json: bool) -> bool:
    """Slurm's line of a submitted job; True when that is all there is (it never ran
    inside: no node to show)."""
    import json

    if report.slurm is None or job.submitted is None:
        return False
    waiting = not report.nodes and report.status in ("queued", "unknown")
    if as_json:
        if not waiting:
            return False  # the full report (with slurm) follows
        click.echo(json.dumps(report.to_dict(), indent=2))
        return True
    now = report.slurm.get("now")
    click.echo(f"job {job.job_id}: Slurm job {job.submitted.slurm_job_id}: {now}")
    return waiting


def follow_logs(job: Job) -> bool:
    """``logs -f``: the batch script's output, live, until the Slurm job ends; False for a
    job not submitted (its nodes' logs are followed as usual)."""
    sub = job.submitted
    if sub is None:
        return False
    sj = sub.slurm_job_id

    def emit(ev: SlurmEvent) -> None:
        if ev.kind in ("line", "errline"):
            click.echo(ev.text, err=ev.kind == "errline")
        elif ev.kind == "waiting":
            click.echo(f"fleetctl: Slurm job {sj}: {ev.text}", err=True)

    sub.follow(emit)
    return True
