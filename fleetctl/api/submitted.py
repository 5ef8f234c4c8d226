"""The sbatch executor: a job ``run --slurm`` submitted, reached from outside its allocation.

Its controller is the fleetctl inside the batch script, so from here ``stop`` is ``scancel``
(SIGTERM to that fleetctl first: it tears the ranks down, verified, and brings the logs
home) verified by the queue, the live lines are the script's output file, and the status is
Slurm's beside the run folder's. It has the executor interface (``fleetctl.api.executor``):
:class:`fleetctl.api.job.Job` holds one of these for a job whose run folder says ``executor:
"sbatch"`` and hands ``status()``, ``lines()``, ``wait()`` and ``stop()`` to it; what the run
inside left in the run folder (its nodes' states, a stop once the job left the queue) is
reached through a :class:`fleetctl.api.direct.Direct` of the same folder. The command line
(``status``/``stop``/``logs -f`` and ``run --slurm``) calls the same methods.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.api.direct import Direct
from fleetctl.api.executor import ExecutorKind, LineFeed, wait_until
from fleetctl.api.result import LogLine
from fleetctl.errors import FleetctlError, Interrupted, JobFailed

if TYPE_CHECKING:
    from fleetctl.api.lifecycle import StatusReport, StopReport
    from fleetctl.api.result import RunResult
    from fleetctl.api.runspec import Slurm
    from fleetctl.job.monitor.process import SpawnedMonitor
    from fleetctl.job.records.files import SlurmRecord
    from fleetctl.job.records.jobrecord import JobRecord
    from fleetctl.job.records.result import JobResult
    from fleetctl.job.records.runfolder import RunFolder
    from fleetctl.slurm.queue import JobInfo
    from fleetctl.slurm.submit import SlurmClient, SlurmEvent
    from fleetctl.transport.connection import SSHSettings

#: ``[rank host] text``: a node's line as the run inside prints it (cli/render.LiveLog)
_NODE_LINE = re.compile(r"^(?:\x1b\[[0-9;]*m)?\[(\d+) ([^\]\s]+)\](?:\x1b\[0m)? ?(.*)$")


def log_line(text: str) -> LogLine:
    """One line of the batch script's output as a :class:`LogLine`: a node's line keeps its
    rank and host; fleetctl's own lines (the inside run's, Slurm's) are rank -1, host ''."""
    m = _NODE_LINE.match(text)
    if m is None:
        return LogLine(-1, "", text)
    return LogLine(int(m.group(1)), m.group(2), m.group(3))


@dataclasses.dataclass(frozen=True)
class Queued:
    """What waiting for a submitted job takes that a direct one has no use for (``Job.wait``'s
    ``on_event`` and ``queue_timeout``): handed on as one value, read here only."""

    on_event: Callable[[SlurmEvent], None] | None = None  # the batch script's SlurmEvents
    queue_timeout: float | None = None  # s in the queue; None: the submitted record's

    @classmethod
    def of(
        cls, on_event: Callable[[SlurmEvent], None] | None, queue_timeout: float | None
    ) -> Queued | None:
        """None when neither is given (what every executor takes)."""
        return None if on_event is None and queue_timeout is None else cls(on_event, queue_timeout)

    @staticmethod
    def refused() -> FleetctlError:
        """A direct job's answer to them."""
        from fleetctl.errors import UsageError

        return UsageError("wait(on_event=, queue_timeout=): only for a submitted job")


class Submitted:
    """A submitted job: its run folder here, its Slurm job id, ``slurm.json``; the run inside
    through :class:`Direct` of the same folder (``settings``: to reach its nodes)."""

    kind: ExecutorKind = "sbatch"
    details: JobResult | None = None  # the run's whole result is the inside fleetctl's
    monitor: SpawnedMonitor | None = None

    def __init__(
        self,
        run: RunFolder,
        slurm_job_id: str,
        record: SlurmRecord,
        client: SlurmClient | None = None,
        settings: SSHSettings | None = None,
        *,
        asked: Slurm | None = None,
    ) -> None:
        from fleetctl.api.runspec import Slurm
        from fleetctl.slurm.submit import SlurmClient

        self._run = run
        # what the submission asked of Slurm (its queue limit: wait()'s); none when attached
        self.asked = asked or Slurm()
        self.slurm_job_id = slurm_job_id
        self.record = record  # slurm.json: state, nodes, partition, …
        self._client = client or SlurmClient()
        self._inside = Direct.found(run.job_id, run.path.parent, settings)

    @classmethod
    def of(cls, run: RunFolder, settings: SSHSettings | None = None) -> Submitted | None:
        """The Slurm side of ``run``; None when it was not submitted (or sbatch never
        answered: nothing was queued)."""
        record = run.load_slurm()
        if not (record and record.job_id):
            return None
        return cls(run, record.job_id, record, settings=settings)

    @classmethod
    def found(
        cls, run: RunFolder, record: JobRecord, settings: SSHSettings | None
    ) -> Submitted | None:
        """``Job.attach``'s executor for ``run`` when its job.json (``record``) says
        ``executor: "sbatch"``, or says nothing (a folder older than the field) and
        slurm.json names a Slurm job; None: a direct job."""
        if record.executor not in (None, "sbatch"):
            return None
        return cls.of(run, settings)

    @property
    def submitted(self) -> Submitted:
        """The Slurm side (``Job.submitted``): this executor itself."""
        return self

    @property
    def job_id(self) -> str:
        return self._run.job_id

    @property
    def run_folder(self) -> Path:
        return Path(self._run.path)

    # -- reading ----------------------------------------------------------------------------
    def job_status(self) -> str | None:
        """job.json's status (``queued`` until the run inside starts; None: unreadable)."""
        from fleetctl.errors import RunFolderError

        try:
            return str(self._run.load_job().status)
        except RunFolderError:
            return None

    def inside_ended(self) -> bool:
        """The run inside has written its end to job.json (False while it is unreadable)."""
        from fleetctl.errors import RunFolderError

        try:
            return self._run.load_job().finished
        except RunFolderError:
            return False

    def slurm_state(self) -> str:
        """Slurm's view now, one line (state, reason, queue position), or the last seen."""
        from fleetctl.slurm.queue import describe

        sj = self.slurm_job_id
        info = self._client.show(sj)
        if info is None:
            return f"{self.record.state} (last seen)"
        pos = self._client.position(sj) if info.state == "PENDING" else None
        return describe(info, pos)

    def queued(self) -> bool:
        """Still in Slurm's queue (pending or running, or a step left)."""
        sj = self.slurm_job_id
        return self._client.queued(sj) or self._client.queued(sj, steps=True)

    @property
    def done(self) -> bool:
        """It left Slurm's queue."""
        return not self.queued()

    def status(self) -> StatusReport:
        """``fleetctl status``: the run folder's report (every node asked) once the run
        inside has started, else what the queued record says; either way with ``slurm``
        (slurm.json plus ``now``: Slurm's line)."""
        from fleetctl.api.lifecycle import StatusReport

        slurm = {**self.record.to_dict(), "now": self.slurm_state()}
        status = self.job_status()
        if status not in (None, "queued"):
            report = self._inside.status()
        else:
            report = StatusReport(
                job_id=self.job_id,
                status=status or "unknown",
                detached=self.record.detached,
                live=status == "queued",
                folder=str(self.run_folder),
                attempt=1,
                nodes=[],
                left_out={},
            )
        report.slurm = slurm
        return report

    def document(self) -> dict[str, Any] | None:
        """``run --slurm --json``: the document ``fleetctl run --json`` prints (the run
        inside wrote it as job.json: the same keys and values), its ``slurm`` naming the Slurm
        job and its last state; None while the run inside has not written it (queued, or it
        never ran)."""
        from fleetctl.errors import RunFolderError

        try:
            job = self._run.load_job()
        except RunFolderError:
            return None
        if job.status in ("queued", "cancelled") and not job.nodes:
            return None
        doc = job.to_dict()
        said = doc.get("slurm")
        slurm: dict[str, Any] = said if isinstance(said, dict) else {}
        doc["slurm"] = {**slurm, "job_id": self.slurm_job_id, "state": self.record.state}
        return doc

    def follow(self, on_event: Callable[[SlurmEvent], None]) -> None:
        """``logs -f``: the batch script's output and error lines, live, until it ends
        (waiting in the queue first, with a ``waiting`` event on every change). Reads only:
        stopping the follower leaves the job alone."""
        from fleetctl.slurm.batch import ERROR_FILE, OUTPUT_FILE
        from fleetctl.slurm.submit import follow, wait_started

        sj = self.slurm_job_id
        info = self._client.show(sj)
        out, err = self.run_folder / OUTPUT_FILE, self.run_folder / ERROR_FILE
        if info is not None and info.pending:
            info = wait_started(self._client, sj, on_event, queue_timeout=None)
        follow(self._client, sj, out, on_event, err, ended=self.inside_ended)

    def lines(self, timeout: float | None = None) -> Iterator[LogLine]:
        """The batch script's output lines (stdout, then stderr as they come) as
        :class:`LogLine`, until the Slurm job ended; :meth:`follow`'s errors raised here.
        ``timeout``: seconds to wait for each next line (WaitTimeout)."""
        feed = LineFeed()
        error: list[BaseException] = []

        def work() -> None:
            try:
                self.follow(
                    lambda ev: (
                        feed.put([log_line(ev.text)]) if ev.kind in ("line", "errline") else None
                    )
                )
            except BaseException as e:  # raised again in the reader's thread
                error.append(e)
            finally:
                feed.close()

        t = threading.Thread(target=work, daemon=True, name=f"fleetctl-slurm-{self.job_id}")
        t.start()
        while (line := feed.get(timeout)) is not None:
            yield line
        t.join(5.0)
        if error:
            raise error[0]

    # -- waiting ----------------------------------------------------------------------------
    def wait(self, timeout: float | None = None, *, queued: Queued | None = None) -> RunResult:
        """Wait in the queue, stream the output (``on_event``: ``waiting``, ``started``,
        ``line``, ``errline``, ``cancelling``, …), then the inside run's verdict, returned
        whatever it is (``exit_code``: the inside run's). Raises what kept the job from
        running inside, as the command exits: QueueTimeout (5) after ``queue_timeout`` s in
        the queue (default: the submitted record's, ``asked``; cancelled), UsageError (2) for
        a job that can never start, JobFailed (3) when the Slurm job ended before fleetctl ran
        in it, Interrupted (130) on Ctrl-C (the Slurm job cancelled, verified). ``timeout``:
        WaitTimeout while it is still queued then (the job runs on; its output is followed
        only once it left the queue)."""
        if timeout is not None:
            deadline = time.monotonic() + timeout
            wait_until(lambda: self.done, deadline, f"job {self.job_id}", timeout)
        queued = queued or Queued()
        limit = self.asked.queue_timeout if queued.queue_timeout is None else queued.queue_timeout
        return self._follow(queued.on_event, limit)

    def _follow(
        self, on_event: Callable[[SlurmEvent], None] | None, queue_timeout: float | None
    ) -> RunResult:
        from fleetctl.slurm.batch import ERROR_FILE, OUTPUT_FILE, SlurmError
        from fleetctl.slurm.queue import JobInfo
        from fleetctl.slurm.submit import run_submitted

        if self._client.show(self.slurm_job_id) is None:  # forgotten (MinJobAge): long over
            last = f"{self.record.state or 'UNKNOWN'} (last seen)"
            return self.verdict(JobInfo(self.slurm_job_id, last), forgotten=True)

        def on_state(info: JobInfo) -> None:
            self.record.state, self.record.reason = info.state, info.reason
            self.record.nodelist = info.nodes
            self._run.write_slurm(self.record)

        private = None
        if self.record.private:  # no shared filesystem: through the batch host
            from fleetctl.slurm.private import PrivateFollower

            private = PrivateFollower(
                self._client,
                self.slurm_job_id,
                self._run,
                output=str(self.record.output),
                error=str(self.record.error),
                inside_folder=str(self.record.inside_folder),
            )
        try:
            info = run_submitted(
                self._client,
                self.slurm_job_id,
                self.run_folder / OUTPUT_FILE,
                on_event or (lambda ev: None),
                queue_timeout=queue_timeout,
                on_state=on_state,
                error=self.run_folder / ERROR_FILE,
                private=private,
                ended=self.inside_ended,
            )
        except KeyboardInterrupt:
            self._mark("interrupted", "the submitter was stopped: scancel")
            raise Interrupted(
                f"job {self.job_id}: Slurm job {self.slurm_job_id} cancelled"
            ) from None
        except FleetctlError as e:
            if not isinstance(e, SlurmError):
                self._mark("cancelled", e.one_line())
            raise
        return self.verdict(info)

    def verdict(self, info: JobInfo, *, forgotten: bool = False) -> RunResult:
        """The inside run's result once the Slurm job ended (``info``: its last state;
        ``forgotten``: Slurm no longer knows the job, so the run folder's record alone says
        how it ended); JobFailed when fleetctl never ran inside it (where to look)."""
        from fleetctl.api.result import RunResult
        from fleetctl.errors import RunFolderError

        job_id, slurm_job, run = self.job_id, self.slurm_job_id, self._run
        try:
            job = run.load_job()
        except RunFolderError:
            job = None
        status = job.status if job is not None else None
        if status in (None, "queued"):
            self._mark("failed", f"Slurm job {slurm_job} ended {info.state} before the run")
            err = run.path / "slurm.err"
            see = (
                f"see {err}"
                if err.exists() or self.record.private
                else f"no {err.name} was written here: if the batch host cannot see "
                f"{run.path.parent}, submit with --slurm-no-shared-fs"
            )
            raise JobFailed(
                f"job {job_id}: Slurm job {slurm_job} ended {info.state} before fleetctl ran "
                f"inside it; {see}"
            )
        assert job is not None
        if forgotten:
            last = {"job_id": slurm_job, "state": self.record.state}
            return dataclasses.replace(RunResult.from_record(job, run.path), slurm=last)
        if info.state == "COMPLETED" and not info.exit_code and status == "succeeded":
            code = 0
        elif status == "interrupted":
            code = 130
        else:
            code = info.exit_code if info.exit_code in (2, 3, 4) else 3
        result = RunResult.from_record(job, run.path, exit_code=code)
        return dataclasses.replace(result, slurm={"job_id": slurm_job, "state": info.state})

    def error(self, result: RunResult) -> FleetctlError | None:
        """The error ``run --slurm`` exits with for ``result`` (None: it succeeded): the
        inside run's exit code, its first failure named."""
        from fleetctl.errors import RunFolderError
        from fleetctl.job.records.runs import describe_failure
        from fleetctl.slurm.batch import SlurmJobFailed

        if result.ok:
            return None
        state = (result.slurm or {}).get("state", self.record.state)
        where = f"job {result.job_id} (Slurm job {self.slurm_job_id}, {state})"
        if result.exit_code == 130:
            return Interrupted(f"{where}: interrupted")
        try:
            job = self._run.load_job()
            ff = job.first_failure.to_dict() if job.first_failure is not None else None
        except RunFolderError:
            ff = None
        what = describe_failure(ff) or result.verdict or result.status
        if result.status == "succeeded" and result.exit_code == 4:
            what = "succeeded, but LOGS INCOMPLETE (the inside run's lines above say which)"
        return SlurmJobFailed(f"{where}: {what}", exit_code=result.exit_code)

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
        """Still in the queue: ``scancel`` (SIGTERM to the fleetctl inside first: it tears
        the ranks down and brings the logs home), verified by the queue (SlurmError if the
        job stays); the report holds the inside run's teardown (from job.json) and
        ``slurm``, and JobFailed (``check``) says a node was not verified clean. A job that
        left the queue is stopped through its run folder as a direct one (``ended_too``)."""
        if not self.queued():
            return self._inside.stop(
                grace,
                collect=collect,
                collect_max=collect_max,
                collect_exclude=collect_exclude,
                ended_too=ended_too,
                check=check,
                on_note=on_note,
            )
        sj = self.slurm_job_id
        if on_note is not None:
            on_note(f"job {self.job_id}: scancel Slurm job {sj}")
        report = self._scancel()
        if on_note is not None:
            on_note(f"job {self.job_id}: Slurm job {sj} gone from the queue, no step left")
        if check and not report.verified:
            raise JobFailed(f"job {report.job_id}: teardown could not verify every node")
        return report

    def _scancel(self) -> StopReport:
        from fleetctl.api.lifecycle import StopReport
        from fleetctl.errors import RunFolderError

        self._client.cancel(self.slurm_job_id, graceful=True)
        self.record.state = "CANCELLED"
        self._run.write_slurm(self.record)
        if self.job_status() == "queued":
            with self._run.editing_job() as rec:
                rec.status, rec.verdict = "cancelled", "fleetctl stop: scancel before it started"
        try:
            job = self._run.load_job()
            status, teardown = job.status, job.teardown
        except RunFolderError:
            status, teardown = "unknown", None
        return StopReport(
            job_id=self.job_id,
            teardown=_teardown(teardown),
            status=status,
            slurm={"job_id": self.slurm_job_id, "state": "CANCELLED", "queued": False},
        )

    # -- internals ----------------------------------------------------------------------------
    def _mark(self, status: str, verdict: str) -> None:
        """The job never ran inside (still queued, or refused): say how it ended."""
        from fleetctl.errors import RunFolderError

        try:
            with self._run.editing_job() as job:
                if job.status == "queued":
                    job.status, job.verdict = status, verdict
        except (OSError, RunFolderError):
            pass


def _teardown(data: dict[str, Any] | None) -> Any:
    """The inside run's teardown report from job.json's dict (no nodes: it never ran)."""
    from fleetctl.phases.teardown import NodeStop, TeardownReport

    if not data:
        return TeardownReport(nodes=[], grace=0.0)
    names = {f for f in NodeStop.__dataclass_fields__}
    nodes = [NodeStop(**{k: v for k, v in n.items() if k in names}) for n in data["nodes"]]
    grace, seconds = float(data.get("grace") or 0.0), float(data.get("seconds") or 0.0)
    return TeardownReport(nodes=nodes, grace=grace, seconds=seconds)
