"""A job started by ``Fleet.run`` or found again by id (``Job.attach``): its live lines, its
verdict, stopping it.

A ``Job`` is one handle over one executor (``fleetctl.api.executor``), to which it hands every
call: ``direct`` (:mod:`fleetctl.api.direct`: a job on its nodes over SSH, locally or by
``srun`` steps) or ``sbatch`` (:mod:`fleetctl.api.submitted`: a job ``run --slurm`` submitted,
reached through Slurm). A direct job run attached (``detach=False``) runs in a background
thread of this process — check, push, launch, watch, first-failure teardown, collect, exactly
``fleetctl run``'s path — and stops with it: call :meth:`Job.wait` before the program exits
(the nodes' dead-man switch stops an abandoned job). A detached job, or one attached by id,
lives under its node supervisors; it is reached through its run folder as ``fleetctl
logs/status/stop`` do. What only reads the run folder (collect, stacks, logs, the record, the
report) is the same for both executors and done here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.api.executor import WaitTimeout
from fleetctl.api.result import LogLine, RunResult

if TYPE_CHECKING:
    from fleetctl.api.executor import Executor, ExecutorKind
    from fleetctl.api.lifecycle import (
        CollectReport,
        LogsProblem,
        StacksReport,
        StatusReport,
        StopReport,
    )
    from fleetctl.api.submitted import Submitted
    from fleetctl.job.monitor.handle import JobHandle
    from fleetctl.job.monitor.process import SpawnedMonitor
    from fleetctl.job.records.jobrecord import JobRecord
    from fleetctl.job.records.result import JobEvent, JobResult
    from fleetctl.job.run.submit import JobRequest
    from fleetctl.node import Node
    from fleetctl.slurm.submit import SlurmEvent
    from fleetctl.transport.connection import SSHSettings

__all__ = ["Job", "WaitTimeout"]


class Job:
    """One job. Get one from :meth:`Fleet.run` or :meth:`Job.attach`."""

    def __init__(
        self,
        job_id: str,
        runs_dir: str | Path,
        settings: SSHSettings | None = None,
        *,
        executor: Executor | None = None,
    ) -> None:
        """``executor``: what runs the job (default: a direct job reached through its run
        folder, as ``Job.attach`` finds one)."""
        from fleetctl.api.direct import Direct

        self.job_id = job_id
        self.runs_dir = Path(runs_dir)
        self.settings = settings
        self._executor: Executor = executor or Direct.found(job_id, runs_dir, settings)

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
        from fleetctl.job.records.runfolder import RunFolder
        from fleetctl.job.records.runs import latest_attempt
        from fleetctl.transport.connection import SSHSettings

        folder = latest_attempt(runs_dir, job_id)
        settings = SSHSettings(
            known_hosts=known_hosts, accept_new=accept_new, connect_timeout=connect_timeout
        )
        record = folder.load_job()
        found = record.job_id or folder.job_id
        submitted = Submitted.found(RunFolder(Path(runs_dir) / found), record, settings)
        return cls(found, runs_dir, settings, executor=submitted)

    @classmethod
    def _submitted_job(cls, submitted: Submitted, runs_dir: str | Path) -> Job:
        """The job ``Submission.submit`` queued (the sbatch executor)."""
        return cls(submitted.job_id, runs_dir, None, executor=submitted)

    @classmethod
    def _found(cls, job_id: str, runs_dir: str | Path, settings: SSHSettings | None) -> Job:
        """A job that runs (or ran) under its supervisors, reached through its run folder."""
        return cls(job_id, runs_dir, settings)

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
        from fleetctl.api.direct import Direct

        direct = Direct.start(request, on_event=on_event, before=before)
        return cls(direct.job_id, direct.runs_dir, direct.settings, executor=direct)

    @classmethod
    def _run_here(cls, request: JobRequest, *, on_event: Callable[[JobEvent], None] | None) -> Job:
        """Run ``request`` in the calling thread (``Fleet.run(foreground=True)``, the
        command's way: Ctrl-C interrupts it there); the ended (or detached) job."""
        from fleetctl.api.direct import Direct

        direct = Direct.run_here(request, on_event=on_event)
        return cls(direct.job_id, direct.runs_dir, direct.settings, executor=direct)

    @property
    def executor(self) -> ExecutorKind:
        """``"sbatch"``: submitted by ``run --slurm``, reached through Slurm; ``"direct"``:
        run on its nodes over SSH, locally or by ``srun`` steps."""
        return self._executor.kind

    @property
    def submitted(self) -> Submitted | None:
        """The sbatch executor's side of a submitted job (Slurm job id, ``slurm.json``,
        Slurm's state, the batch script's events); None for a direct one."""
        return self._executor.submitted

    @property
    def details(self) -> JobResult | None:
        """A job run here: the job core's whole result (every node's outcome, the phases,
        teardown, collection, attempts; ``to_dict()`` is ``fleetctl run --json``); None
        before it ended and for a job found by id (its record: ``status()``)."""
        return self._executor.details

    @property
    def monitor(self) -> SpawnedMonitor | None:
        """``Fleet.run(detach=True, foreground=True)``: the job monitor started for it."""
        return self._executor.monitor

    # -- reading ----------------------------------------------------------------------------
    @property
    def run_folder(self) -> Path:
        return self.runs_dir / self.job_id

    @property
    def done(self) -> bool:
        """The job ended (for a detached job: as its record says now; for a submitted one:
        it left Slurm's queue)."""
        return self._executor.done

    def lines(self, timeout: float | None = None) -> Iterator[LogLine]:
        """Every node's output lines as they arrive (per node in order), until the job ended.

        A job running here: from its start (up to the last 100,000 unread). A detached or
        attached-by-id job: the collected logs of an ended job, else followed live from the
        nodes. A submitted job: the batch script's output, live, until the Slurm job ended
        (a node's line with its rank and host; fleetctl's own lines with rank -1, host '').
        ``timeout``: seconds to wait for each next line (WaitTimeout)."""
        return self._executor.lines(timeout)

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
        from running inside: QueueTimeout (5, after ``queue_timeout`` s, by default the
        submitted record's ``queue_timeout``; cancelled),
        UsageError (2, it can never start), JobFailed (3, the Slurm job ended before fleetctl
        ran in it), Interrupted (130: Ctrl-C, the Slurm job cancelled, verified)."""
        from fleetctl.api.submitted import Queued

        result = self._executor.wait(timeout, queued=Queued.of(on_event, queue_timeout))
        err = self._executor.error(result) if check else None
        if err is not None:
            raise err
        return result

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
        return self._executor.stop(
            grace,
            collect=collect,
            collect_max=collect_max,
            collect_exclude=collect_exclude,
            ended_too=ended_too,
            check=check,
            on_note=on_note,
        )

    # -- coming back to it ------------------------------------------------------------------
    def status(self) -> StatusReport:
        """``fleetctl status``: the record, every node's state (the supervisors asked while
        the job may run), its monitor and controller, and a hint what to do next. A
        submitted job: with ``slurm`` (Slurm's line in ``now``); while it waits in the queue,
        only the record (no node yet)."""
        return self._executor.status()

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

    def _handle(self) -> JobHandle:
        from fleetctl.job.monitor.handle import JobHandle

        return JobHandle(self.runs_dir, self.job_id, self.settings)

    def __repr__(self) -> str:
        return f"Job({self.job_id!r}, runs_dir={str(self.runs_dir)!r})"
