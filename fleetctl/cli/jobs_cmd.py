"""Coming back to jobs: ``fleetctl runs``, ``status``, ``logs``, ``stop``, ``collect``.

All of them find a job by id (a unique prefix is enough) in ``--runs-dir`` and reach its nodes
through the run folder's ``connect.json``; the work is the library's (``fleetctl.api``:
``runs()``, ``Job.attach(...).status()/logs()/stop()/collect()/stacks()``,
``api.lifecycle.monitor``), and this module only renders it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from fleetctl.api.runspec import RunSpec, Supervision
from fleetctl.cli import cli
from fleetctl.cli.options import (
    Count,
    Seconds,
    SSHOptions,
    collect_max_bytes,
    collect_options,
    field_option,
    given_keywords,
    spec_keywords,
    spec_options,
    ssh_options,
    unset_options,
)
from fleetctl.errors import FleetctlError, JobFailed

runs_dir_option = click.option(
    "--runs-dir",
    type=click.Path(file_okay=False),
    default="fleet-runs",
    show_default=True,
    help="Where run folders are.",
)


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


@cli.command("runs")
@runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def runs_command(runs_dir: str, as_json: bool) -> None:
    """List jobs from the run folders, oldest first."""
    from fleetctl.api import runs

    records = runs(runs_dir)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in records], indent=2))
        return
    if not records:
        click.echo(f"no jobs in {runs_dir}", err=True)
        return
    rows = [("JOB", "LAUNCHER", "NODES", "STATUS", "STARTED", "DURATION", "FIRST FAILURE")]
    for r in records:
        status = r.status + (f" (attempt {r.attempts})" if r.attempts > 1 else "")
        rows.append(
            (
                r.job_id,
                r.launcher or "-",
                str(r.nodes) + (f" (+{len(r.left_out)} left out)" if r.left_out else ""),
                status,
                (r.started or "-").replace("T", " ")[:19],
                _fmt_duration(r.duration),
                r.first_failure or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=False)]
        click.echo("  ".join([*cells, row[-1]]).rstrip())


@cli.command("status")
@runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("job")
def status_command(runs_dir: str, as_json: bool, job: str) -> None:
    """Per-node state of JOB (asks the node supervisors while it may be running)."""
    from fleetctl.api import Job
    from fleetctl.cli.render_summary import member_lines
    from fleetctl.cli.slurm_jobs import show_status

    found = Job.attach(job, runs_dir)
    report = found.status()
    if show_status(found, report, as_json):  # submitted to Slurm, never ran inside yet
        return
    states = report.nodes
    data = report.to_dict()
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    ctl = data.get("controller")
    if ctl is not None and ctl["alive"] is False:
        head = (
            f"{data['status']} per job.json, but its controller (fleetctl run, pid "
            f"{ctl['pid']} on {ctl['host']}) is gone"
        )
    else:
        head = str(data["status"])
    click.echo(
        f"job {data['job_id']}: {head}"
        + (f" (attempt {data['attempt']})" if data["attempt"] > 1 else "")
        + (" (detached)" if data["detached"] else "")
        + (
            f"; {data['running_nodes']} of {len(states)} node(s) running"
            if "running_nodes" in data
            else ""
        )
    )
    mon = data["monitor"]
    if mon is None and data["live"] and data["detached"]:
        click.echo(f"  monitor: none; attach one with `fleetctl monitor {data['job_id']}`")
    elif mon is not None and (mon["alive"] or data["live"]):
        if mon["alive"]:
            click.echo(f"  monitor: pid {mon['pid']} {mon['phase']} (log {mon['log']})")
        else:
            click.echo(
                f"  monitor: pid {mon['pid']} NOT running (last: {mon['phase']}); "
                f"re-attach with `fleetctl monitor {data['job_id']}`"
            )
    for s in states:
        how = ""
        if s.signal is not None:
            how = f" signal {s.signal}"
        elif s.exit_code is not None:
            how = f" exit {s.exit_code}"
        procs = f" {len(s.processes)} process(es)" if s.processes else ""
        why = s.error or s.stop_reason
        if s.state == "absent" and not why:
            why = "no supervisor of the job found on the node"
        err = f" ({why})" if why else ""
        click.echo(f"  [{s.rank} {s.host}] {s.state}{how}{procs}{err}")
    for host, why in sorted(data["left_out"].items()):
        click.echo(f"  [- {host}] left out: {why}")
    for line in member_lines(data.get("members") or []):
        click.echo(line)
    if data.get("hint"):
        click.echo(data["hint"], err=True)


@cli.command("logs")
@runs_dir_option
@click.option("--node", "node", default=None, metavar="RANK|HOST", help="Only this node.")
@click.option("-f", "--follow", is_flag=True, help="Stream live logs until the job ends.")
@click.option(
    "-n", "--lines", type=Count(min=0, max=10**9), default=None, help="Only the last N lines."
)
@click.option(
    "--raw-output",
    is_flag=True,
    help="Pass the job's control sequences to the terminal as they are (default: colours only).",
)
@click.argument("job")
def logs_command(
    runs_dir: str, node: str | None, follow: bool, lines: int | None, raw_output: bool, job: str
) -> None:
    """Show JOB's logs with node prefixes: collected ones, or live from the nodes."""
    from fleetctl import JobEvent, LogLine
    from fleetctl.api import Job
    from fleetctl.cli import render
    from fleetctl.cli.slurm_jobs import follow_logs

    found = Job.attach(job, runs_dir)
    if follow and node is None and follow_logs(found):  # a `run --slurm` job: its output
        return
    live = render.LiveLog(tail="all", raw=raw_output)

    def show(line: LogLine) -> None:
        live(JobEvent("line", line.text, line.node_rank, line.host))

    problem = found.logs(show, node=node, follow=follow, lines=lines)
    if problem.missing:
        names = ", ".join(f"{r} {hh}" for r, hh in problem.missing)
        click.echo(f"fleetctl: no collected logs for node(s) {names}", err=True)
    for rank, err in sorted(problem.errors.items()):
        click.echo(f"fleetctl: [{rank}] logs: {err}", err=True)


@cli.command("stop")
@runs_dir_option
@click.option(
    "--grace",
    type=Seconds(min=0),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@click.option("--no-collect", is_flag=True, help="Do not bring the logs home afterwards.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@collect_options
@click.argument("job")
def stop_command(
    runs_dir: str,
    grace: float,
    no_collect: bool,
    as_json: bool,
    collect_max: str | None,
    collect_exclude: tuple[str, ...],
    job: str,
) -> None:
    """Stop JOB on every node (by job id), verify nothing is left, collect its logs."""
    from fleetctl.api import Job

    # a `run --slurm` job still in the queue: scancel, verified (the library's)
    stopped = Job.attach(job, runs_dir).stop(
        grace,
        collect=not no_collect,
        collect_max=collect_max_bytes(collect_max),
        collect_exclude=collect_exclude,
        ended_too=True,
        check=False,
        on_note=lambda text: click.echo(f"fleetctl: {text}", err=True),
    )
    assert stopped is not None  # a job attached by id is never running in this process
    report, data = stopped.teardown, stopped.to_dict()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        for n in report.nodes:
            what = (
                n.error
                or n.skipped
                or (f"LEFT: {n.remaining}" if n.remaining else f"stopped {len(n.found)}")
            )
            click.echo(f"  [{n.rank} {n.host}] {what}", err=True)
        verdict = "verified: nothing left on any node" if report.verified else "NOT verified"
        click.echo(f"fleetctl: job {data['job_id']} stopped; {verdict}", err=True)
    if not report.verified:
        raise JobFailed(f"job {data['job_id']}: teardown could not verify every node")


@cli.command("stacks")
@runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.argument("job")
def stacks_command(runs_dir: str, as_json: bool, job: str) -> None:
    """Dump the Python stack of every process of live JOB on every node, folded by frame."""
    from fleetctl.api import Job
    from fleetctl.cli import render

    dumped = Job.attach(job, runs_dir).stacks()
    report, saved, groups = dumped.report, dumped.saved, dumped.groups
    nothing = FleetctlError(
        f"job {dumped.job_id}: no stack dumped on any of {len(report.nodes)} node(s)"
        + ("" if as_json else " (see the lines above)")
    )
    if as_json:
        click.echo(json.dumps(dumped.to_dict(), indent=2))
        if not groups:
            raise nothing
        return
    for line in render.stack_lines(groups):
        click.echo(line)
    for n in report.nodes:
        if n.error or not n.processes:
            click.echo(
                f"  [{n.rank} {n.host}] {n.error or 'no Python process of the job'}", err=True
            )
        for why in sorted({p["error"] for p in n.processes if p.get("error")}):
            click.echo(f"  [{n.rank} {n.host}] not dumped: {why}", err=True)
    if not groups:
        raise nothing
    click.echo(f"fleetctl: every dump saved in {saved}", err=True)


@cli.command("collect")
@runs_dir_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@collect_options
@click.argument("job")
def collect_command(
    runs_dir: str,
    as_json: bool,
    collect_max: str | None,
    collect_exclude: tuple[str, ...],
    job: str,
) -> None:
    """Bring JOB's node logs home into its run folder (and record how a detached job ended).

    Files already home (same size and mtime) are not copied again; the cap and excludes are
    the run's unless given here (e.g. a larger --collect-max fetches what was over the cap)."""
    from fleetctl.api import Job

    collected = Job.attach(job, runs_dir).collect(
        collect_max=collect_max_bytes(collect_max), collect_exclude=collect_exclude
    )
    results, data = collected.collected, collected.to_dict()
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        from fleetctl.cli.render_collect import collect_lines

        for line in collect_lines(results):
            click.echo(line, err=True)
        click.echo(f"fleetctl: job {data['job_id']}: {data['status']}", err=True)
    sys.stdout.flush()
    missing = [c.host for c in results if c.incomplete]
    if missing:
        from fleetctl.errors import LogsIncomplete

        raise LogsIncomplete(
            f"job {data['job_id']}: logs still incomplete from {', '.join(missing)}"
        )


@cli.command("monitor")
@runs_dir_option
@ssh_options(fanout_help=None)
@click.option(
    "--poll", type=Seconds(min=0.2, max=3600), default=None, help="Seconds between polls (2)."
)
@click.option(
    "--lost-timeout",
    "lost_after",
    type=Seconds(min=1),
    default=None,
    help="A node unreachable this long is lost: the job is stopped (60).",
)
@unset_options(Supervision.MONITORED)  # the run's, each unset: its last monitor's
@click.option(
    "--chase-lost",
    type=Seconds(min=0),
    default=1800.0,
    show_default=True,
    help="After the job ended, seconds to keep trying to stop it on lost nodes.",
)
@spec_options("observe")
@field_option("report")
@click.argument("job")
def monitor_command(
    runs_dir: str,
    ssh: SSHOptions,
    poll: float | None,
    lost_after: float | None,
    chase_lost: float,
    job: str,
    no_report: bool,
    **params: Any,
) -> None:
    """Watch detached JOB until it ends: on the first failure stop it everywhere, then
    collect its logs. `fleetctl run --detach` starts one; run it by hand to re-attach a
    watcher whose monitor died. Signals end the watcher only, never the job."""
    import signal
    import threading
    from datetime import datetime, timezone

    from fleetctl.api import lifecycle

    given = given_keywords(params, Supervision.MONITORED)
    observe = RunSpec().replace(**spec_keywords(params, "observe")).observe
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)

    def note(text: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        click.echo(f"{stamp} fleetctl monitor: {text}", err=True)

    outcome = lifecycle.monitor(
        runs_dir,
        job,
        ssh.settings,
        poll=poll,
        lost_after=lost_after,
        given=given,
        chase_lost=chase_lost,
        stop_event=stop,
        on_note=note,
        observe=observe,
        report=not no_report,
    )
    note(f"done: {outcome}")
