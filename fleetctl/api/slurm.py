"""Slurm from outside an allocation: submit a run (``fleetctl run --slurm``), follow it, stop
it, and find a submitted job again (``status``/``stop``/``logs -f``). Inside an allocation
the fleet is ``Fleet.slurm()``.

The batch script runs ``fleetctl run`` inside the allocation with the options given, so the
check, launch, first-failure teardown and run folder are the inside run's; this side
submits, waits in the queue, streams the script's output as ``SlurmEvent``s and ends with
the inside run's verdict. Nothing prints; events go to ``on_event``.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError, Interrupted

if TYPE_CHECKING:
    from fleetctl.api.result import RunResult
    from fleetctl.job.runfolder import RunFolder
    from fleetctl.slurm.batch import BatchRequest
    from fleetctl.slurm.queue import JobInfo
    from fleetctl.slurm.submit import SlurmClient, SlurmEvent


@dataclass(frozen=True)
class Submission:
    """A batch job ready for ``sbatch``: the request (nodes, folder, output, the inside
    command) and the script's text. :meth:`submit` queues it."""

    request: BatchRequest
    script: str
    launcher: str | None = None
    #: ``--job``: (the file given, its copy in the run folder that the run inside reads);
    #: copied at submit, so an edit while the job is queued does not change it (as sbatch
    #: keeps its script)
    job_file: tuple[str, str] | None = None

    @property
    def job_id(self) -> str:
        return self.request.job_id

    def check(self) -> str | None:
        """Slurm's verdict without queueing anything (``sbatch --test-only``), so a dry run
        refuses what :meth:`submit` would: UsageError (exit 2) with sbatch's reason when Slurm
        refuses the job (gres, partition, node count, an ``--sbatch-arg``). When Slurm cannot
        be asked here (no sbatch, no controller): that reason; None when it would take it."""
        from fleetctl.slurm.batch import SlurmError
        from fleetctl.slurm.submit import SlurmClient

        client = SlurmClient()
        if shutil.which("sbatch", path=client.env.get("PATH")) is None:
            return "`sbatch` not found (is Slurm's client installed?)"
        try:
            client.test_only(self.script)
        except SlurmError as e:
            return e.one_line()
        return None

    def submit(self, *, detach: bool = False) -> SlurmJob:
        """``sbatch`` it: the run folder (``slurm.json``, the script, a queued job.json)
        first, so the batch job adopts it; nothing is left when sbatch refuses (UsageError,
        exit 2, or SlurmError)."""
        from fleetctl.job.jobrecord import JobRecord
        from fleetctl.job.runfolder import RunFolder
        from fleetctl.slurm.batch import ERROR_FILE
        from fleetctl.slurm.submit import SlurmClient

        req = self.request
        client = SlurmClient()
        run = RunFolder.create(Path(req.folder).parent, req.job_id)
        if req.spec is not None and not req.private:  # the run inside reads its options here
            from fleetctl.slurm.specfile import write

            write(req.spec_file, req.spec)
        record: dict[str, Any] = {
            "job_id": None,  # until sbatch answers: the job may start before this side goes on
            "state": "SUBMITTING",
            "nodes": req.nodes,
            "partition": req.partition,
            "gres": req.gres,
            "time": req.time,
            "account": req.account,
            "script": "sbatch.sh",
            "output": "slurm.out",
            "error": ERROR_FILE,
            "detached": detach,
        }
        if req.private:  # where the batch host keeps them until they are pulled home
            record.update(
                private=True,
                output=req.output,
                error=req.error,
                inside_folder=req.inside_folder,
            )
        if self.job_file is not None:
            src, dest = self.job_file
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            if dest != src:  # private: the run inside reads it where it is
                shutil.copyfile(src, dest)
            record["job_file"] = os.path.relpath(dest, run.path) if dest != src else src
        run.write_slurm(record, self.script)  # before sbatch: the batch job adopts the folder
        # job.json before the job starts: runs/status/stop see it while queued; the run
        # inside the allocation replaces it (with the Slurm job id again)
        run.write_job(
            JobRecord(
                job_id=run.job_id,
                status="queued",
                detached=detach,
                launcher=self.launcher,
                folder=str(run.path),
            )
        )
        try:
            slurm_job = client.sbatch(self.script)
        except FleetctlError:
            shutil.rmtree(run.path, ignore_errors=True)  # nothing was queued: no folder either
            raise
        record.update(job_id=slurm_job, state="PENDING")
        run.write_slurm(record)
        with run.editing_job() as job:  # unless the run inside has written it already
            job.extra.setdefault("slurm", {"job_id": slurm_job})
        return SlurmJob(run, slurm_job, record, client)


def submission(
    script: str | None,
    args: Sequence[str] = (),
    *,
    nodes: int | None,
    options: Sequence[str] = (),
    runs_dir: str | os.PathLike[str] = "fleet-runs",
    partition: str | None = None,
    gres: str | None = None,
    time: str | None = None,
    account: str | None = None,
    sbatch_args: Sequence[str] = (),
    launcher: str | None = None,
    job_id: str | None = None,
    job_file: str | os.PathLike[str] | None = None,
    code: str | os.PathLike[str] | None = None,
    shared_fs: bool = True,
) -> Submission:
    """The batch job that runs ``fleetctl run OPTIONS SCRIPT ARGS…`` on ``nodes`` nodes of an
    allocation (``options``: ``run``'s own, as argv). Nothing is submitted (a dry run prints
    ``.script``, and :meth:`Submission.check` asks Slurm); a bad ``gres``/``time``, or a
    control character in any value the script holds on a line (``partition``, ``account``,
    ``sbatch_args``, …), is a UsageError here.

    The options, SCRIPT and ARGS reach the run inside in a file (``run --spec``, 0600 in the
    run folder), never on a command line: an ``--env-var`` secret is on no process list.

    ``job_file`` (a role job, instead of ``script``): read here, so a bad file is exit 2
    before anything is queued; ``nodes`` defaults to the sum of its roles' ``instances``; the
    run inside reads the copy :meth:`Submission.submit` puts in the run folder, with the code
    folder it would have had here (``code``, else the git work tree holding the file) given
    as ``--code``.

    ``shared_fs=False`` (``--slurm-no-shared-fs``): the batch host cannot see ``runs_dir``;
    the run inside writes its folder and output under the batch host's /tmp, the submitter
    follows them through srun steps and pulls the folder home before the script exits
    (``fleetctl.slurm.private``); ``job_file`` is then read where it is (with the code, on a
    filesystem the batch host sees)."""
    from fleetctl.api.runrequest import new_job_id
    from fleetctl.errors import UsageError
    from fleetctl.slurm.batch import (
        GPUS_VAR,
        JOB_FILE_DIR,
        PRIVATE_ROOT,
        RUN_ID_VAR,
        BatchRequest,
        check_gres,
        check_line,
        check_time,
        gres_gpus,
        inside_argv,
        inside_command,
        render,
        role_nodes,
        spec_path,
    )

    for what, value in (("--partition", partition), ("--account", account)):
        if value is not None:
            check_line(what, value)
    for arg in sbatch_args:
        check_line("--sbatch-arg", arg)
    gres = check_gres(gres) if gres else None
    time = check_time(time) if time else None
    job_id = job_id or new_job_id()
    runs = os.path.abspath(runs_dir)
    folder = os.path.join(runs, job_id)
    copy: tuple[str, str] | None = None
    inner = list(options)
    if job_file is not None:
        from fleetctl.phases.codesync import default_code_dir
        from fleetctl.plan.roles import load_job_file

        src = os.fspath(job_file)
        if script is not None:
            raise UsageError(f"--job {src} replaces SCRIPT; got {script!r} too")
        jf = load_job_file(src)
        launcher = jf.launcher  # roles | paddle-ps: what the run inside will record
        if nodes is None:
            nodes = role_nodes([(r.name, r.instances) for r in jf.roles], src)
        dest = (
            os.path.join(folder, JOB_FILE_DIR, os.path.basename(src))
            if shared_fs
            else os.path.abspath(src)
        )
        code_dir = os.path.abspath(code) if code is not None else str(default_code_dir(src))
        copy = (os.path.abspath(src), dest)
        inner += [f"--job={dest}", f"--code={code_dir}"]
    elif script is None:
        raise UsageError("missing SCRIPT (or --job FILE)")
    if nodes is None:
        raise UsageError("--slurm needs --nodes N (the nodes to ask Slurm for)")
    inner.append(f"--runs-dir={runs if shared_fs else PRIVATE_ROOT.format(job=job_id)}")
    command = inside_command(sys.executable, spec_path(folder, job_id, private=not shared_fs))
    paths = [_python_path(), *(os.environ.get("PYTHONPATH") or "").split(os.pathsep)]
    env = {RUN_ID_VAR: job_id, "PYTHONPATH": os.pathsep.join(dict.fromkeys(x for x in paths if x))}
    gpus = gres_gpus(gres)
    if gpus is not None:  # the plan's GPUs per node: the steps', not the batch step's
        env[GPUS_VAR] = str(gpus)
    req = BatchRequest(
        nodes=nodes,
        job_id=job_id,
        folder=folder,
        chdir=os.getcwd(),
        command=command,
        partition=partition,
        gres=gres,
        time=time,
        account=account,
        extra=tuple(sbatch_args),
        env=env,
        private=not shared_fs,
        spec=inside_argv(inner, script, tuple(args)),
    )
    return Submission(req, render(req), launcher, copy)


def submit(
    script: str | None,
    args: Sequence[str] = (),
    *,
    nodes: int | None = None,
    detach: bool = False,
    **options: Any,
) -> SlurmJob:
    """:func:`submission` then ``sbatch``: the queued :class:`SlurmJob` (its ``wait()``,
    ``lines()``, ``stop()`` act on the Slurm job)."""
    return submission(script, args, nodes=nodes, **options).submit(detach=detach)


class SlurmJob:
    """A job ``run --slurm`` submitted: its run folder here and its Slurm job id."""

    def __init__(
        self,
        run: RunFolder,
        slurm_job_id: str,
        record: dict[str, Any],
        client: SlurmClient | None = None,
    ) -> None:
        from fleetctl.slurm.submit import SlurmClient

        self._run = run
        self.slurm_job_id = slurm_job_id
        self.record = record  # slurm.json: state, nodes, partition, …
        self._client = client or SlurmClient()
        self._result: RunResult | None = None  # once wait() (or lines()) saw it end

    @property
    def job_id(self) -> str:
        return self._run.job_id

    @property
    def run_folder(self) -> Path:
        return Path(self._run.path)

    @classmethod
    def find(cls, runs_dir: str | os.PathLike[str], job: str) -> SlurmJob | None:
        """The submitted job ``job`` (a unique prefix) of ``runs_dir``; None when there is no
        such run folder or it was not submitted to Slurm."""
        from fleetctl.errors import RunFolderError
        from fleetctl.job.runfolder import load_run

        try:
            folder = load_run(runs_dir, job)
        except RunFolderError:
            return None  # the command's own lookup reports it
        record = folder.load_slurm()
        if not (record and record.get("job_id")):
            return None
        return cls(folder, str(record["job_id"]), record)

    # -- reading ----------------------------------------------------------------------------
    def status(self) -> str | None:
        """job.json's status (``queued`` until the run inside starts; None: unreadable)."""
        from fleetctl.errors import RunFolderError

        try:
            return str(self._run.load_job().status)
        except RunFolderError:
            return None

    def slurm_state(self) -> str:
        """Slurm's view now, one line (state, reason, queue position), or the last seen."""
        from fleetctl.slurm.queue import describe

        sj = self.slurm_job_id
        info = self._client.show(sj)
        if info is None:
            return f"{self.record.get('state')} (last seen)"
        pos = self._client.position(sj) if info.state == "PENDING" else None
        return describe(info, pos)

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
        slurm = doc.get("slurm")
        slurm = slurm if isinstance(slurm, dict) else {}
        doc["slurm"] = {**slurm, "job_id": self.slurm_job_id, "state": self.record.get("state")}
        return doc

    def queued(self) -> bool:
        """Still in Slurm's queue (pending or running, or a step left)."""
        sj = self.slurm_job_id
        return self._client.queued(sj) or self._client.queued(sj, steps=True)

    def follow(self, on_event: Callable[[SlurmEvent], None]) -> None:
        """``logs -f``: the batch script's output and error lines, live, until it ends
        (waiting in the queue first, with a ``waiting`` event on every change)."""
        from fleetctl.slurm.batch import ERROR_FILE, OUTPUT_FILE
        from fleetctl.slurm.submit import follow, wait_started

        sj = self.slurm_job_id
        info = self._client.show(sj)
        out, err = self.run_folder / OUTPUT_FILE, self.run_folder / ERROR_FILE
        if info is not None and info.pending:
            info = wait_started(self._client, sj, on_event, queue_timeout=None)
        follow(self._client, sj, out, on_event, err)

    # -- waiting ----------------------------------------------------------------------------
    def wait(
        self,
        on_event: Callable[[SlurmEvent], None] | None = None,
        *,
        queue_timeout: float | None = None,
    ) -> RunResult:
        """Wait in the queue, stream the output (``on_event``: ``waiting``, ``started``,
        ``line``, ``errline``, ``cancelling``, …), then the inside run's verdict. Raises as
        the command exits: QueueTimeout (5) after ``queue_timeout`` s in the queue
        (cancelled), UsageError (2) for a job that can never start, JobFailed /
        SlurmJobFailed (the inside run's code: 3 or 4) when it did not succeed, Interrupted
        (130) on Ctrl-C (the Slurm job cancelled, verified)."""
        from fleetctl.slurm.batch import ERROR_FILE, OUTPUT_FILE, SlurmError
        from fleetctl.slurm.submit import run_submitted

        if self._result is not None:
            return self._result

        def on_state(info: JobInfo) -> None:
            self.record.update(state=info.state, reason=info.reason, nodelist=info.nodes)
            self._run.write_slurm(self.record)

        private = None
        if self.record.get("private"):  # no shared filesystem: through the batch host
            from fleetctl.slurm.private import PrivateFollower

            private = PrivateFollower(
                self._client,
                self.slurm_job_id,
                self.run_folder,
                output=str(self.record["output"]),
                error=str(self.record["error"]),
                inside_folder=str(self.record["inside_folder"]),
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
        self._result = self._verdict(info)
        return self._result

    def lines(self, *, queue_timeout: float | None = None) -> Iterator[str]:
        """The batch script's output lines (stdout and stderr) as they come, until the job
        ended; then :meth:`wait`'s errors, if any, are raised here."""
        import queue

        q: queue.Queue[str | None] = queue.Queue()
        error: list[BaseException] = []

        def work() -> None:
            try:
                self.wait(
                    lambda ev: q.put(ev.text) if ev.kind in ("line", "errline") else None,
                    queue_timeout=queue_timeout,
                )
            except BaseException as e:  # raised again in the reader's thread
                error.append(e)
            finally:
                q.put(None)

        t = threading.Thread(target=work, daemon=True, name=f"fleetctl-slurm-{self.job_id}")
        t.start()
        while (line := q.get()) is not None:
            yield line
        t.join(5.0)
        if error:
            raise error[0]

    def stop(self) -> bool:
        """``scancel`` (SIGTERM to the fleetctl inside first: it tears the ranks down and
        brings the logs home), verified by the queue. False when the job had already left the
        queue (then the ordinary ``Job.attach(…).stop()`` verifies the nodes)."""
        if not self.queued():
            return False
        self._client.cancel(self.slurm_job_id, graceful=True)
        self.record["state"] = "CANCELLED"
        self._run.write_slurm(self.record)
        if self.status() == "queued":
            with self._run.editing_job() as rec:
                rec.status, rec.verdict = "cancelled", "fleetctl stop: scancel before it started"
        return True

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

    def _verdict(self, info: JobInfo) -> RunResult:
        """The inside run's verdict (its own summary lines were streamed); raised unless it
        succeeded."""
        from fleetctl.api.result import RunResult
        from fleetctl.errors import JobFailed, RunFolderError
        from fleetctl.job.records import describe_failure
        from fleetctl.slurm.batch import SlurmJobFailed

        job_id, slurm_job, run = self.job_id, self.slurm_job_id, self._run
        try:
            job = run.load_job()
        except RunFolderError:
            job = None
        status = job.status if job is not None else None
        if info.state == "COMPLETED" and not info.exit_code and status == "succeeded":
            assert job is not None
            return RunResult.from_record(job, run.path)
        code = info.exit_code if info.exit_code else None
        if status in (None, "queued"):
            self._mark("failed", f"Slurm job {slurm_job} ended {info.state} before the run")
            err = run.path / "slurm.err"
            see = (
                f"see {err}"
                if err.exists() or self.record.get("private")
                else f"no {err.name} was written here: if the batch host cannot see "
                f"{run.path.parent}, submit with --slurm-no-shared-fs"
            )
            raise JobFailed(
                f"job {job_id}: Slurm job {slurm_job} ended {info.state} before fleetctl ran "
                f"inside it; {see}"
            )
        assert job is not None
        if status == "interrupted":
            raise Interrupted(f"job {job_id}: Slurm job {slurm_job} {info.state}: interrupted")
        ff = job.first_failure.to_dict() if job.first_failure is not None else None
        what = describe_failure(ff) or job.verdict or status
        if status == "succeeded" and code == 4:
            what = "succeeded, but LOGS INCOMPLETE (the inside run's lines above say which)"
        raise SlurmJobFailed(
            f"job {job_id} (Slurm job {slurm_job}, {info.state}): {what}",
            exit_code=code if code in (2, 3, 4) else 3,
        )


def read_spec(path: str | os.PathLike[str]) -> list[str]:
    """The run a batch script's ``fleetctl run --spec FILE`` stands for, as ``run``'s
    arguments (fleetctl.slurm.specfile: its only reader and writer)."""
    from fleetctl.slurm.specfile import read

    return read(path)


def _python_path() -> str:
    """Where this fleetctl is imported from, for the batch script's PYTHONPATH."""
    import fleetctl

    return str(Path(fleetctl.__file__).resolve().parent.parent)


__all__ = ["SlurmJob", "Submission", "read_spec", "submission", "submit"]
