"""``fleetctl run`` as one call: the run (or the attempt loop), and for a detached job its
monitor — everything the CLI asked for around the job, so the CLI only parses and renders.

:func:`submit` takes a :class:`JobRequest` (the job spec, its nodes, how to run it, the retry
policy, detach and monitor wishes, a role planner) and returns a :class:`Submitted`: the final
attempt's result, every attempt, and the monitor that watches a detached job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.api.runspec import Monitor, Observe
from fleetctl.errors import FleetctlError, UsageError
from fleetctl.job.records.report import ReportWriter, write_run_report
from fleetctl.job.records.state import JobStatus
from fleetctl.job.run.retry import RetryPolicy

if TYPE_CHECKING:
    from fleetctl.job.monitor.exposition import MetricsEndpoint
    from fleetctl.job.monitor.hooks import Hooks
    from fleetctl.job.monitor.metrics import JobMetrics
    from fleetctl.job.monitor.process import SpawnedMonitor
    from fleetctl.job.records.result import JobEvent, JobResult
    from fleetctl.job.run.job import RunOptions
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec


@dataclass(frozen=True)
class JobRequest:
    """One ``fleetctl run``: what to run where, and what to do around it."""

    spec: JobSpec
    nodes: Sequence[Node]
    options: RunOptions  # check, push, timeouts, settings, runs dir, detach, role planner
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    monitor: Monitor = field(default_factory=Monitor)  # detached: a job monitor, its limit
    # writes report.html into the job's run folder when it ends (the API's
    # ``fleetctl.report.write_report``; None: no report)
    report: ReportWriter | None = None
    observe: Observe = field(default_factory=Observe)  # metrics while it lasts, hooks at its end

    def __post_init__(self) -> None:
        if self.options.detach and self.retry.tries > 1:
            raise UsageError("--detach and retries do not mix: nobody watches a detached job")
        if self.options.detach and not self.monitor.monitor and self.observe.asked():
            raise UsageError(
                "--metrics-addr/--metrics-textfile/--on-failure/--on-end of a detached job are "
                "served and run by its job monitor: not with --no-monitor"
            )
        if self.options.detach and not self.monitor.monitor and self.options.supervision.limited():
            raise UsageError(
                "--timeout/--stall-timeout/--startup-timeout of a detached job are enforced by "
                "its job monitor: not with --no-monitor"
            )

    @property
    def hooks(self) -> Hooks | None:
        """``--on-failure``/``--on-end``, run once the job ended (None: none asked)."""
        from fleetctl.job.monitor.hooks import Hooks

        return Hooks.of(self.observe)


@dataclass
class Submitted:
    """What :func:`submit` did: the final result, and for a detached job its monitor."""

    result: JobResult
    monitor: SpawnedMonitor | None = None

    @property
    def detached(self) -> bool:
        """The job runs on under its supervisors (the CLI prints its id and returns)."""
        r = self.result
        return r.detached and r.status == JobStatus.RUNNING


def submit(request: JobRequest, on_event: Callable[[JobEvent], None]) -> Submitted:
    """Run the job — once, or attempt after attempt while the retry policy says so — and
    start the monitor of a detached job that runs everywhere. Its metrics are served from
    before the first node is reached to the end (``--metrics-addr``: a busy address stops the
    run before it starts); its hooks run once it ended, whatever they do never its outcome."""
    endpoint = _metrics_endpoint(request)
    options = request.options
    if endpoint is not None and options.detach:  # the address is free: its monitor serves it
        endpoint.stop()
        endpoint = None
    elif endpoint is not None:
        options = dataclasses.replace(options, observer=endpoint.metrics)
    try:
        done = _submit(dataclasses.replace(request, options=options), on_event)
    except FleetctlError as e:
        if request.hooks:  # could not start (check, push, plan): a failure to tell about
            from fleetctl.job.monitor.hooks import run_hooks

            job_id = request.spec.job_id
            folder = Path(options.runs_dir) / job_id
            if folder.is_dir():
                run_hooks(
                    request.hooks, job_id, "error", folder, reason=e.one_line(), on_event=on_event
                )
        raise
    finally:
        if endpoint is not None:
            endpoint.stop()
    if request.hooks and not done.detached:
        from fleetctl.job.monitor.hooks import run_hooks

        r = done.result
        run_hooks(request.hooks, r.job_id, r.status, r.folder, result=r, on_event=on_event)
    return done


def _metrics_endpoint(request: JobRequest) -> MetricsEndpoint | None:
    """The run's metrics, listening already (None: not asked for)."""
    from fleetctl.job.monitor.exposition import endpoint_for

    tries = request.retry.tries

    def metrics() -> JobMetrics:  # imported only when the run is observed
        from fleetctl.job.monitor.metrics import JobMetrics

        return JobMetrics(max_attempts=tries)

    endpoint = endpoint_for(request.observe, metrics)
    return None if endpoint is None else endpoint.start()


def _submit(request: JobRequest, on_event: Callable[[JobEvent], None]) -> Submitted:
    from fleetctl.job.records.result import JobEvent
    from fleetctl.job.run.job import run_job

    options = request.options
    if options.planner is not None and options.completion is None:
        options = dataclasses.replace(options, completion=options.planner.policy)
    if options.relay is not None and options.relay.resume is not None:
        from fleetctl.job.run.resume import check_files

        check_files(options.relay, options.settings, options.push)  # before anything
    want = options.hosts.nodes
    spares = want is not None and want < len(request.nodes)
    if request.retry.tries == 1 and not spares:
        from fleetctl.job.run.spares import remember_proven

        result = run_job(request.spec, request.nodes, options, on_event=on_event)
        remember_proven(result)  # run_attempts remembers every faulty host itself
    else:
        from fleetctl.job.run.attempts import run_attempts

        out = run_attempts(request.spec, request.nodes, options, request.retry, on_event=on_event)
        if len(out.attempts) > 1:
            text = "; ".join(
                f"#{a.attempt} {a.status}" + (f" ({a.ended_by})" if a.ended_by else "")
                for a in out.attempts
            )
            on_event(JobEvent("notice", f"attempts: {text}"))
        result = out.final
    done = Submitted(result)
    if done.detached and request.monitor.monitor:
        done.monitor = _start_monitor(request, options, result)
    elif request.report is not None and not done.detached:
        write_run_report(request.report, result.folder, result.job_id, on_event)
    return done


def _start_monitor(request: JobRequest, options: RunOptions, result: JobResult) -> SpawnedMonitor:
    from fleetctl.job.monitor.decide import DEFAULT_LOST_TIMEOUT
    from fleetctl.job.monitor.process import spawn_monitor
    from fleetctl.job.monitor.watch import completion_record
    from fleetctl.job.records.runfolder import RunFolder

    folder = RunFolder(result.folder)
    record = completion_record(options.completion)
    if record is not None:  # the role job's min_failed, for the monitor to apply
        with folder.editing_job() as job:
            job.completion = record
    return spawn_monitor(
        folder.path,
        settings=options.settings,
        lost_after=request.monitor.monitor_lost_timeout or DEFAULT_LOST_TIMEOUT,
        sup=options.supervision,
        observe=request.observe,
        report=request.report is not None,
    )
