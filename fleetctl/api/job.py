"""A job started by ``Fleet.run`` or found again by id (``Job.attach``): its live lines, its
verdict, stopping it.

A job run attached (``detach=False``) runs in a background thread of this process — check,
push, launch, watch, first-failure teardown, collect, exactly ``fleetctl run``'s path — and
stops with it: call :meth:`Job.wait` before the program exits (the nodes' dead-man switch
stops an abandoned job). A detached job, or one attached by id, lives under its node
supervisors; this object reaches it through its run folder as ``fleetctl logs/status/stop``
do.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.api.result import LogLine, RunResult
from fleetctl.errors import FleetctlError, Interrupted, JobFailed

if TYPE_CHECKING:
    from fleetctl.api.lifecycle import (
        CollectReport,
        LogsProblem,
        StacksReport,
        StatusReport,
        StopReport,
    )
    from fleetctl.api.submitted import Submitted
    from fleetctl.job.handle import JobHandle
    from fleetctl.job.jobrecord import JobRecord
    from fleetctl.job.monitor_process import SpawnedMonitor
    from fleetctl.job.result import JobEvent, JobResult
    from fleetctl.job.submit import JobRequest
    from fleetctl.node import Node
    from fleetctl.slurm.submit import SlurmEvent
    from fleetctl.ssh.connection import SSHSettings

LINE_BUFFER = 100_000  # lines held for lines() until read; older ones are dropped (all on disk)
POLL = 2.0  # s between looks at a detached job's record
STOP_WAIT = 60.0  # s a stop waits for the launch to reach every node before stopping it


class WaitTimeout(FleetctlError, TimeoutError):
    """``Job.wait(timeout=…)`` ran out before the job ended (the job runs on)."""


class _Lines:
    """The lines ``lines()`` yields, in arrival order, bounded; closed when no more come."""

    def __init__(self) -> None:
        self.buf: collections.deque[LogLine] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self.dropped = 0

    def put(self, lines: list[LogLine]) -> None:
        with self.cond:
            self.buf.extend(lines)
            while len(self.buf) > LINE_BUFFER:
                self.buf.popleft()
                self.dropped += 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def get(self, timeout: float | None) -> LogLine | None:
        """The next line; None once closed and empty. TimeoutError after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while not self.buf:
                if self.closed:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"no output line within {timeout:g} s")
                self.cond.wait(min(1.0, left) if left is not None else 1.0)
            return self.buf.popleft()


class Job:
    """One job. Get one from :meth:`Fleet.run` or :meth:`Job.attach`."""

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
        self._lines = _Lines()
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
        self._submitted: Submitted | None = None  # the sbatch executor's side, if submitted

    # -- starting ---------------------------------------------------------------------------
    @classmethod
    def attach(
        cls,
        job_id: str,
        runs_dir: str | Path = "fleet-runs",
        *,
        known_hosts: str | None = None,
        accept_new: bool = False,
        connect_timeout: float = 10.0,
    ) -> Job:
        """The job ``job_id`` (a unique prefix is enough) of ``runs_dir``, running or ended:
        ``fleetctl logs/status/stop``'s way back to it. RunFolderError if there is none.

        The run folder says which executor made it (job.json ``executor``): a job ``run
        --slurm`` submitted (``"sbatch"``) is reached through Slurm from here — its
        ``status()`` carries Slurm's state, ``lines()`` follow the batch script's output,
        ``stop()`` is a verified ``scancel`` — every other job through its nodes."""
        from fleetctl.api.submitted import Submitted
        from fleetctl.job.records import latest_attempt
        from fleetctl.ssh.connection import SSHSettings

        folder = latest_attempt(runs_dir, job_id)
        settings = SSHSettings(
            known_hosts=known_hosts, accept_new=accept_new, connect_timeout=connect_timeout
        )
        record = folder.load_job()
        job = cls._found(record.job_id or folder.job_id, runs_dir, settings)
        if record.executor in (None, "sbatch"):  # None: a folder older than the field
            from fleetctl.job.runfolder import RunFolder

            job._submitted = Submitted.of(RunFolder(Path(runs_dir) / job.job_id))
        return job

    @classmethod
    def _submitted_job(cls, submitted: Submitted, runs_dir: str | Path) -> Job:
        """The job ``Submission.submit`` queued (the sbatch executor)."""
        job = cls._found(submitted.job_id, runs_dir, None)
        job._submitted = submitted
        return job

    @property
    def executor(self) -> str:
        """``"sbatch"``: submitted by ``run --slurm``, reached through Slurm; ``"direct"``:
        run on its nodes over SSH, locally or by ``srun`` steps."""
        return "direct" if self._submitted is None else "sbatch"

    @property
    def submitted(self) -> Submitted | None:
        """The sbatch executor's side of a submitted job (Slurm job id, ``slurm.json``,
        Slurm's state, the batch script's events); None for a direct one."""
        return self._submitted

    @classmethod
    def _found(cls, job_id: str, runs_dir: str | Path, settings: SSHSettings | None) -> Job:
        """A job that runs (or ran) under its supervisors, reached through its run folder."""
        job = cls(job_id, runs_dir, settings)
        job._ended.set()  # nothing runs in this process
        job._lines.close()
        return job

    @classmethod
    def _start(
        cls,
        request: JobRequest,
        *,
        on_event: Callable[[JobEvent], None] | None,
        before: Callable[[Sequence[Node], SSHSettings | None], None] | None = None,
    ) -> Job:
        """Run ``request`` attached, in a background thread (Fleet.run's work). ``before``:
        the run's own before-launch hook, called after the stop check."""
        import dataclasses

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
    def _run_here(cls, request: JobRequest, *, on_event: Callable[[JobEvent], None] | None) -> Job:
        """Run ``request`` in the calling thread (``Fleet.run(foreground=True)``, the
        command's way: Ctrl-C interrupts it there); the ended (or detached) job."""
        from fleetctl.job.submit import submit

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
        """A job run here: the job core's whole result (every node's outcome, the phases,
        teardown, collection, attempts; ``to_dict()`` is ``fleetctl run --json``); None
        before it ended and for a job found by id (its record: ``status()``)."""
        return self._details

    @property
    def monitor(self) -> SpawnedMonitor | None:
        """``Fleet.run(detach=True, foreground=True)``: the job monitor started for it."""
        return self._monitor

    def _verdict(self, r: JobResult) -> RunResult:
        from fleetctl.job.state import JobStatus
        from fleetctl.phases.collect import interrupted

        if r.status == JobStatus.INTERRUPTED or interrupted(r.collected):
            code = 130
        else:
            code = r.exit_code if r.exit_code in (0, 4) else 3  # 4: logs incomplete
        record = r.to_record()
        record.errors = [*record.errors, *self._callback_errors]
        return RunResult.from_record(record, r.folder, exit_code=code)

    def _run(self, request: JobRequest) -> None:
        from fleetctl.job.submit import submit

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
    def run_folder(self) -> Path:
        return self.runs_dir / self.job_id

    @property
    def done(self) -> bool:
        """The job ended (for a detached job: as its record says now; for a submitted one:
        it left Slurm's queue)."""
        if self._submitted is not None:
            return not self._submitted.queued()
        if self._thread is not None and not self._ended.is_set():
            return False
        if self._thread is not None and self._error is not None:
            return True
        if self._result is not None and not self._result.detached:
            return True
        with self._handle() as h:
            return not h.live

    def lines(self, timeout: float | None = None) -> Iterator[LogLine]:
        """Every node's output lines as they arrive (per node in order), until the job ended.

        A job running here: from its start (up to the last 100,000 unread). A detached or
        attached-by-id job: the collected logs of an ended job, else followed live from the
        nodes. A submitted job: the batch script's output, live, until the Slurm job ended
        (a node's line with its rank and host; fleetctl's own lines with rank -1, host '').
        ``timeout``: seconds to wait for each next line (WaitTimeout)."""
        if self._submitted is not None:
            yield from self._submitted.lines(timeout)
            return
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
        from fleetctl.job.logs import follow_logs

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
            feed = _Lines()

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

    def wait(
        self,
        timeout: float | None = None,
        *,
        check: bool = False,
        on_event: Callable[[SlurmEvent], None] | None = None,
        queue_timeout: float | None = None,
    ) -> RunResult:
        """Block until the job ended; its :class:`RunResult`, whatever the verdict. Raises
        what stopped it before launch (CheckError, PushError, …), WaitTimeout after
        ``timeout`` (the job runs on); ``check``: a result that is not ``ok`` raises its
        error (``RunResult.error()``: JobFailed 3, LogsIncomplete 4, Interrupted 130).
        Ctrl-C while waiting stops the job on every node, then raises KeyboardInterrupt.

        A submitted job (``executor == "sbatch"``): waits in the queue, then follows it to
        its end (``on_event``: the batch script's ``SlurmEvent``s), with the same result
        (``exit_code``: the inside run's; ``slurm``: the Slurm job). It raises what kept it
        from running inside: QueueTimeout (5, after ``queue_timeout`` s; cancelled),
        UsageError (2, it can never start), JobFailed (3, the Slurm job ended before fleetctl
        ran in it), Interrupted (130: Ctrl-C, the Slurm job cancelled, verified)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._submitted is not None:
            sub = self._submitted
            while deadline is not None and sub.queued():  # the job runs on after a timeout
                if time.monotonic() > deadline:
                    raise WaitTimeout(f"job {self.job_id} still running after {timeout:g} s")
                time.sleep(POLL)
            result = sub.wait(on_event, queue_timeout=queue_timeout)
            err = sub.error(result) if check else None
            if err is not None:
                raise err
            return result
        if on_event is not None or queue_timeout is not None:
            from fleetctl.errors import UsageError

            raise UsageError("wait(on_event=, queue_timeout=): only for a submitted job")
        result = self._wait(deadline, timeout)
        err = result.error() if check else None
        if err is not None:
            raise err
        return result

    def _wait(self, deadline: float | None, timeout: float | None) -> RunResult:
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
        from fleetctl.job.monitor_process import monitor_status

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
        """Stop the job on every node, verify nothing is left and collect its logs (as
        ``fleetctl stop``). A job running here that has not launched yet stops before its
        launch; :meth:`wait` then raises Interrupted (None is returned). JobFailed if a node
        could not be verified clean (``check=False``: the report says so, nothing raised).
        ``ended_too``: a job whose record says it ended is torn down and verified all the
        same (the command's way). ``collect_max``/``collect_exclude``: bytes per node and
        globs left on the nodes, instead of the run's. ``on_note``: one line per step.

        A submitted job still in Slurm's queue: ``scancel``, SIGTERM to the fleetctl inside
        first (it stops the ranks on every node, verified, and collects), then verified gone
        from the queue with every step (SlurmError if not); the report holds that teardown
        and ``slurm``. One that left the queue is stopped as any other (``ended_too``)."""
        if self._submitted is not None and self._submitted.queued():
            sj = self._submitted.slurm_job_id
            if on_note is not None:
                on_note(f"job {self.job_id}: scancel Slurm job {sj}")
            report = self._submitted.stop()
            if report is not None:
                if on_note is not None:
                    on_note(f"job {self.job_id}: Slurm job {sj} gone from the queue, no step left")
                if check and not report.verified:
                    raise JobFailed(f"job {report.job_id}: teardown could not verify every node")
                return report
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

    # -- coming back to it ------------------------------------------------------------------
    def status(self) -> StatusReport:
        """``fleetctl status``: the record, every node's state (the supervisors asked while
        the job may run), its monitor and controller, and a hint what to do next. A
        submitted job: with ``slurm`` (Slurm's line in ``now``); while it waits in the queue,
        only the record (no node yet)."""
        from fleetctl.api import lifecycle

        def inside() -> StatusReport:
            with self._handle() as h:
                return lifecycle.status(h)

        return inside() if self._submitted is None else self._submitted.status(inside)

    def collect(
        self, *, collect_max: int | None = None, collect_exclude: Sequence[str] | None = None
    ) -> CollectReport:
        """``fleetctl collect``: what of every node's run folder is not home yet, brought
        home; a job nobody watched to its end gets its final record from the nodes'."""
        from fleetctl.api import lifecycle

        with self._handle() as h:
            return lifecycle.collect(h, lifecycle.collect_options(h, collect_max, collect_exclude))

    def stacks(self) -> StacksReport:
        """``fleetctl stacks``: every process's Python stack on every node of the live job
        (it goes on running), folded by innermost frame and saved in the run folder."""
        from fleetctl.api import lifecycle

        with self._handle() as h:
            return lifecycle.stacks(h)

    def logs(
        self,
        show: Callable[[LogLine], None],
        *,
        node: str | None = None,
        follow: bool = False,
        lines: int | None = None,
    ) -> LogsProblem:
        """``fleetctl logs``: each node's lines into ``show`` (``node``: one, by rank or host),
        the collected ones or, while the job may run (and with ``follow``), live from the
        nodes; ``lines``: the last N only. Returns which nodes had none and follow errors."""
        from fleetctl.api import lifecycle

        with self._handle() as h:
            return lifecycle.logs(
                h,
                node,
                lambda r, host, text: show(LogLine(r, host, text)),
                follow=follow,
                lines=lines,
            )

    def report(self, out: str | Path | None = None) -> Path:
        """Write the job's offline HTML report from its run folder (``fleetctl report``;
        default ``<run folder>/report.html``); the path written."""
        from fleetctl.api.runs import report

        return report(self.job_id, runs_dir=self.runs_dir, out=out)

    @property
    def record(self) -> JobRecord:
        """job.json as it is now (``JobRecord``)."""
        with self._handle() as h:
            return h.job

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

    def _handle(self) -> JobHandle:
        from fleetctl.job.handle import JobHandle

        return JobHandle(self.runs_dir, self.job_id, self.settings)

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, runs_dir={str(self.runs_dir)!r})"
