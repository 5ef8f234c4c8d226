"""``fleetctl report JOB [-o FILE]``: the job's offline HTML report, made from its run folder
alone (no node is reached), by the library's ``fleetctl.api.runs.report``."""

from __future__ import annotations

import click

from fleetctl.cli import cli


@cli.command("report")
@click.option(
    "--runs-dir",
    type=click.Path(file_okay=False),
    default="fleet-runs",
    show_default=True,
    help="Where run folders are.",
)
@click.option(
    "-o",
    "--output",
    "out",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="FILE",
    help="Where to write it (default: report.html in the job's run folder).",
)
@click.argument("job")
def report_command(runs_dir: str, out: str | None, job: str) -> None:
    """Write JOB's report: one self-contained HTML file from its run folder alone."""
    from fleetctl.api.runs import report

    path = report(job, runs_dir=runs_dir, out=out)
    click.echo(str(path))
