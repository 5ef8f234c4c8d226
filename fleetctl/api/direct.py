"""The direct executor: a job run on its nodes over SSH, locally or as ``srun`` steps, with
this process as its controller or reached through its run folder.

Three ways in: :meth:`Direct.start` runs the job attached in a background thread (check,
push, launch, watch, first-failure teardown, collect: exactly ``fleetctl run``'s path), and
it stops with this process; :meth:`Direct.run_here` runs it in the calling thread (the
command's way); :meth:`Direct.found` reaches a detached job, or one found again by id, through
its run folder and node supervisors as ``fleetctl logs/status/stop`` do. A run started here
that detached becomes the last kind once its thread ended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.api.executor import POLL, ExecutorKind, LineFeed, WaitTimeout
from fleetctl.api.result import LogLine, RunResult
from fleetctl.errors import FleetctlError, Interrupted, JobFailed

if TYPE_CHECKING:
    from fleetctl.api.lifecycle import StatusReport, StopReport
    from fleetctl.api.submitted import Queued, Submitted
    from fleetctl.job.monitor.handle import JobHandle
    from fleetctl.job.monitor.process import SpawnedMonitor
    from fleetctl.job.records.result import JobEvent, JobResult
    from fleetctl.job.run.submit import JobRequest
    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings

STOP_WAIT = 60.0  # s a stop waits for the launch to reach every node before stopping it


class Direct:
    """One direct job: its run here (thread, live lines, verdict), or its run folder."""

    kind: ExecutorKind = "direct"
    submitted: Submitted | None = None  # a direct job has no Slurm side

    def __init__(
        self,
        job_id: str,
        runs_dir: str | Path,
        settings: SSHSettings | None = None,
        *,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> None:
        self.job_id = job_id
        self.runs_dir = Path(runs_dir)
        self.settings = settings
        self._on_event = on_event
        self._lines = LineFeed()
        self._thread: threading.Thread | None = None
        self._result: RunResult | None = None
        self._error: BaseException | None = None
        self._ended = threading.Event()
        self._launching = threading.Event()
        self._reached: set[int] = set()  # ranks whose start was reported (started or ended)
        self._stop_asked = threading.Event()
        self._callback_errors: list[str] = []
        self._following = False
        self._details: JobResult | None = None
        self._monitor: SpawnedMonitor | None = None

    # -- starting ---------------------------------------------------------------------------
    @classmethod
    def found(cls, job_id: str, runs_dir: str | Path, settings: SSHSettings | None) -> Direct:
        """A job that runs (or ran) under its supervisors, reached through its run folder."""
        job = cls(job_id, runs_dir, settings)
        job._ended.set()  # nothing runs in this process
        job._lines.close()
        return job

    @classmethod
    def start(
        cls,
        request: JobRequest,
        *,
        on_event: Callable[[JobEvent], None] | None,
        before: Callable[[Sequence[Node], SSHSettings | None], None] | None = None,
    ) -> Direct:
        """Run ``request`` attached, in a background thread. ``before``: the run's own
        before-launch hook, called after the stop check."""
        options = request.options
        job = cls(request.spec.job_id, options.runs_dir, options.settings, on_event=on_event)

        def hook(nodes: Sequence[Node], settings: SSHSettings | None) -> None:
            job._before_launch()
            if before is not None:
                before(nodes, settings)
                job._before_launch()

        request = dataclasses.replace(
            request, options=dataclasses.replace(options, before_launch=hook)
        )
        job._thread = threading.Thread(
            target=job._run, args=(request,), daemon=True, name=f"fleetctl-job-{job.job_id}"
        )
        job._thread.start()
        return job

    @classmethod
    def run_here(
        cls, request: JobRequest, *, on_event: Callable[[JobEvent], None] | None
    ) -> Direct:
        """Run ``request`` in the calling thread (Ctrl-C interrupts it there); the ended (or
        detached) job."""
        from fleetctl.job.run.submit import submit

        options = request.options
        job = cls(request.spec.job_id, options.runs_dir, options.settings)
        try:
            done = submit(request, on_event=on_event or (lambda ev: None))
            job._details, job._monitor = done.result, done.monitor
            job._result = job._verdict(done.result)
        finally:
            job._lines.close()
            job._ended.set()
        return job

    @property
    def details(self) -> JobResult | None:
        return self._details

    @property
    def monitor(self) -> SpawnedMonitor | None:
        return self._monitor

    @property
    def run_folder(self) -> Path:
        return self.runs_dir / self.job_id

    def _verdict(self, r: JobResult) -> RunResult:
        from fleetctl.job.records.state import JobStatus
        from fleetctl.phases.collect import interrupted

        if r.status == JobStatus.INTERRUPTED or interrupted(r.collected):
            code = 130
        else:
            code = r.exit_code if r.exit_code in (0, 4) else 3  # 4: logs incomplete
        record = r.to_record()
        record.errors = [*record.errors, *self._callback_errors]
        return RunResult.from_record(record, r.folder, exit_code=code)

    def _run(self, request: JobRequest) -> None:
        from fleetctl.job.run.submit import submit

        try:
            done = submit(request, on_event=self._event)
            self._details = done.result
            self._result = self._verdict(done.result)
        except BaseException as e:  # raised again by wait(), in the caller's thread
            self._error = e
        finally:
            self._lines.close()
            self._ended.set()

    def _event(self, ev: JobEvent) -> None:
        if ev.kind == "lines" and ev.rank is not None:
            self._lines.put([LogLine(ev.rank, ev.host or "", t) for t in ev.lines])
        elif ev.kind == "line" and ev.rank is not None:
            self._lines.put([LogLine(ev.rank, ev.host or "", ev.text)])
        elif ev.kind == "phase" and ev.text.startswith("launching"):
            self._launching.set()
        elif ev.kind in ("started", "exit", "lost") and ev.rank is not None:
            self._reached.add(ev.rank)
        if self._on_event is not None:
            try:
                self._on_event(ev)
            except Exception as e:  # the job goes on; the callback is not called again
                self._callback_errors.append(f"on_event raised {type(e).__name__}: {e}")
                self._on_event = None

    def _before_launch(self) -> None:
        """Called by the run right before the plan and launch: a stop asked meanwhile ends
        the job here, before anything started."""
        if self._stop_asked.is_set():
            raise Interrupted(f"job {self.job_id}: stopped before launch")

    # -- reading ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        if self._thread is not None and not self._ended.is_set():
            return False
        if self._thread is not None and self._error is not None:
            return True
        if self._result is not None and not self._result.detached:
            return True
        with self._handle() as h:
            return not h.live

    def lines(self, timeout: float | None = None) -> Iterator[LogLine]:
        """The run's lines (started here), then the run folder's: the collected logs of an
        ended job, else followed live from the nodes."""
        while True:
            line = self._lines.get(timeout)
            if line is None:
                break
            yield line
        if self._thread is not None and self._result is not None and self._result.detached:
            self._thread = None  # from here on, like a job attached by id
        if self._thread is None and not self._following:
            self._following = True
            yield from self._records_lines(timeout)

    def _records_lines(self, timeout: float | None) -> Iterator[LogLine]:
        from fleetctl.job.monitor.logs import follow_logs

        with self._handle() as h:
            chosen, missing = h.select(None), []
            for rank, host in chosen:
                path = h.collected_log(rank, host)
                if path is None:
                    missing.append((rank, host))
                    continue
                with path.open(encoding="utf-8", errors="replace") as f:
                    for text in f:
                        yield LogLine(rank, host, text.rstrip("\n"))
            if not missing or not h.live:
                return
            feed = LineFeed()

            def follow() -> None:
                try:
                    follow_logs(
                        h, missing, lambda r, hh, t: feed.put([LogLine(r, hh, t)]), follow=True
                    )
                finally:
                    feed.close()

            t = threading.Thread(target=follow, daemon=True, name=f"fleetctl-logs-{self.job_id}")
            t.start()
            while True:
                line = feed.get(timeout)
                if line is None:
                    break
                yield line
            t.join(5.0)

    # -- waiting ----------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, *, queued: Queued | None = None) -> RunResult:
        """The run's result (here) or the record's once its monitor, or a collection from
        here, wrote how it ended. ``queued`` is a submitted job's."""
        if queued is not None:
            raise queued.refused()
        deadline = None if timeout is None else time.monotonic() + timeout
        ran_here = self._thread is None and self._details is not None
        if ran_here and self._result is not None and not self._result.detached:
            return self._result  # ended in this thread (``foreground=True``)
        try:
            if self._thread is not None:
                while not self._ended.wait(0.2):
                    if deadline is not None and time.monotonic() > deadline:
                        raise WaitTimeout(f"job {self.job_id} still running after {timeout:g} s")
                if self._error is not None:
                    raise self._error
                assert self._result is not None
                if not self._result.detached:
                    return self._result
            return self._wait_record(deadline, timeout)
        except KeyboardInterrupt:
            with contextlib.suppress(FleetctlError):
                self.stop(grace=0.0)
            raise

    def _wait_record(self, deadline: float | None, timeout: float | None) -> RunResult:
        """A job under its supervisors: its record, once its monitor (or, with none,
        a collection from here, as ``fleetctl collect`` does) wrote how it ended."""
        from fleetctl.job.monitor.process import monitor_status

        while True:
            with self._handle() as h:
                if not h.live:
                    return RunResult.from_record(h.job, h.folder.path)
                mon = monitor_status(h.job)
                if not (mon and mon["alive"]) and h.job.status != "starting":
                    running = [s for s in h.status() if s.state == "running" or s.processes]
                    if not running:
                        h.collect()
                        continue
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"job {self.job_id} still running after {timeout:g} s")
            time.sleep(POLL)

    def error(self, result: RunResult) -> FleetctlError | None:
        """``wait(check=True)``'s error: the command's (``RunResult.error()``)."""
        return result.error()

    # -- stopping ---------------------------------------------------------------------------
    def stop(
        self,
        grace: float = 5.0,
        *,
        collect: bool = True,
        collect_max: int | None = None,
        collect_exclude: Sequence[str] | None = None,
        ended_too: bool = False,
        check: bool = True,
        on_note: Callable[[str], None] | None = None,
    ) -> StopReport | None:
        """The run here stops before its launch or has every node stopped (None: its
        ``wait()`` says how it ended); otherwise ``fleetctl stop`` through the run folder."""
        if self._thread is not None and not self._ended.is_set():
            self._stop_asked.set()
            self._stop_running(grace)
            return None
        from fleetctl.api import lifecycle

        with self._handle() as h:
            if not h.live and not ended_too:
                return None
            options = lifecycle.collect_options(h, collect_max, collect_exclude)
            report = lifecycle.stop(h, grace, collect=collect, options=options, on_note=on_note)
        if check and not report.verified:
            raise JobFailed(f"job {report.job_id}: teardown could not verify every node")
        return report

    def _stop_running(self, grace: float) -> None:
        """The run here stops at its launch, or — launched — every node is told to stop
        (``stop-request.json``, then the teardown); the run sees its nodes end as stopped,
        not failed, and collects."""
        deadline = time.monotonic() + STOP_WAIT
        while not self._launching.is_set():
            if self._ended.wait(0.1):
                return
            if time.monotonic() > deadline:
                raise JobFailed(f"job {self.job_id}: not launched after {STOP_WAIT:g} s")
        with self._handle() as h:
            ranks = {np.node_rank for np in h.plan.nodes}
            while not ranks <= self._reached and not self._ended.is_set():
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if self._ended.is_set():
                return
            h.stop(grace)
        self._ended.wait(STOP_WAIT)

    # -- coming back to it ------------------------------------------------------------------
    def status(self) -> StatusReport:
        from fleetctl.api import lifecycle

        with self._handle() as h:
            return lifecycle.status(h)

    def _handle(self) -> JobHandle:
        from fleetctl.job.monitor.handle import JobHandle

        return JobHandle(self.runs_dir, self.job_id, self.settings)
