"""Slurm from outside an allocation: submit a run (``fleetctl run --slurm``). The queued job
is a :class:`fleetctl.api.job.Job` whose executor is ``"sbatch"`` (fleetctl.api.submitted:
waiting, following, stopping it); ``Job.attach`` finds it again. Inside an allocation the
fleet is ``Fleet.slurm()`` (or ``Fleet.from_environment()``).

The batch script runs ``fleetctl run --spec FILE`` inside the allocation (FILE: the run's
``RunSpec`` as JSON, never argv), so the check, launch, first-failure teardown and run folder
are the inside run's; this side submits, waits in the queue, streams the script's output as
``SlurmEvent``s and ends with the inside run's verdict. Nothing prints; events go to
``on_event``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.api.runspec import Monitor, RunSpec, Slurm
from fleetctl.errors import FleetctlError

if TYPE_CHECKING:
    from fleetctl.api.job import Job
    from fleetctl.api.types import SSHSettings
    from fleetctl.slurm.batch import BatchRequest
    from fleetctl.slurm.specfile import Inside


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
    #: the record's Slurm group: what this side asked of Slurm, its queue limit the job's
    #: ``wait()``'s (``Submitted``)
    asked: Slurm = dataclasses.field(default_factory=Slurm)

    @property
    def job_id(self) -> str:
        return self.request.job_id

    def dry_run_document(self) -> dict[str, Any]:
        """``run --slurm --dry-run --json``: what would be submitted, the role job's copy too."""
        req, jf = self.request, self.job_file
        return {
            "dry_run": True,
            "job_id": req.job_id,
            "nodes": req.nodes,
            "folder": req.folder,
            "sbatch_script": self.script,
            "command": list(req.command),
            "spec": {"file": req.spec_file, "content": req.spec},
            "job_file": None if jf is None else {"from": jf[0], "copy": jf[1]},
        }

    def program_words(self, spec: RunSpec) -> str:
        """What the run inside runs, in words (the dry run's lines)."""
        if self.job_file:
            return f"the role job {self.job_file[0]} (copied to {self.job_file[1]} at submit)"
        return f"launcher {spec.program.launcher}, SCRIPT {spec.program.script}"

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

    def submit(self, *, detach: bool = False) -> Job:
        """``sbatch`` it: the run folder (``slurm.json``, the script, a queued job.json)
        first, so the batch job adopts it; nothing is left when sbatch refuses (UsageError,
        exit 2, or SlurmError). The queued :class:`Job` (``executor == "sbatch"``): its
        ``wait()``, ``lines()``, ``status()``, ``stop()`` act on the Slurm job, as
        ``Job.attach(job_id)``'s do later."""
        from fleetctl.job.records.files import SlurmRecord
        from fleetctl.job.records.jobrecord import JobRecord
        from fleetctl.job.records.runfolder import SBATCH_FILE, RunFolder
        from fleetctl.slurm.batch import ERROR_FILE
        from fleetctl.slurm.submit import SlurmClient

        req = self.request
        client = SlurmClient()
        run = RunFolder.create(Path(req.folder).parent, req.job_id)
        if req.spec is not None and not req.private:  # the run inside reads its options here
            from fleetctl.slurm.specfile import write

            write(req.spec_file, req.spec)
        record = SlurmRecord(
            job_id=None,  # until sbatch answers: the job may start before this side goes on
            state="SUBMITTING",
            nodes=req.nodes,
            partition=req.partition,
            gres=req.gres,
            time=req.time,
            account=req.account,
            script=SBATCH_FILE,
            output="slurm.out",
            error=ERROR_FILE,
            detached=detach,
        )
        if req.private:  # where the batch host keeps them until they are pulled home
            record.private, record.inside_folder = True, req.inside_folder
            record.output, record.error = req.output, req.error
        if self.job_file is not None:
            src, dest = self.job_file
            Path(dest).parent.mkdir(parents=True, exist_ok=True)
            if dest != src:  # private: the run inside reads it where it is
                shutil.copyfile(src, dest)
            record.job_file = os.path.relpath(dest, run.path) if dest != src else src
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
                executor="sbatch",
            )
        )
        try:
            slurm_job = client.sbatch(self.script)
        except FleetctlError:
            shutil.rmtree(run.path, ignore_errors=True)  # nothing was queued: no folder either
            raise
        record.job_id, record.state = slurm_job, "PENDING"
        run.write_slurm(record)
        with run.editing_job() as job:  # unless the run inside has written it already
            job.extra.setdefault("slurm", {"job_id": slurm_job})
        from fleetctl.api.job import Job
        from fleetctl.api.submitted import Submitted

        sub = Submitted(run, slurm_job, record, client, asked=self.asked)
        return Job._submitted_job(sub, run.path.parent)


def submission(
    script: str | RunSpec | None = None,
    args: Sequence[str] = (),
    *,
    runs_dir: str | os.PathLike[str] = "fleet-runs",
    job_id: str | None = None,
    shared_fs: bool = True,
    inventory: str | None = None,
    limit: str | None = None,
    settings: SSHSettings | None = None,
    tail: str = "all",
    raw_output: bool = False,
    **keywords: Any,
) -> Submission:
    """The batch job that runs a run (``RunSpec.build(script, *args, **keywords)``, or the
    ``RunSpec`` given as ``script``, ``keywords`` then changing it) on ``nodes`` nodes of an
    allocation: what to ask Slurm for is the record's Slurm group (``partition=``, ``gres=``,
    ``time=``, ``account=``, ``sbatch_args=``). Nothing is submitted (a dry run prints
    ``.script``, and :meth:`Submission.check` asks Slurm); a bad value (the record's checks:
    control characters too), ``gres`` or ``time`` is a UsageError here.

    The run reaches the run inside in a file (``run --spec``, 0600 in the run folder): the
    record's JSON form (``RunSpec.to_dict()``, without what belongs to this side: the Slurm and
    monitor groups, ``nodes``) and ``runs_dir``, ``inventory``/``limit``, ``settings`` (how
    the run inside reaches its hosts), ``tail``/``raw_output`` (its lines in slurm.out); never
    on a command line: an ``env`` secret is on no process list. A ``before`` callable cannot
    travel in a file: UsageError.

    ``job_file`` (a role job, instead of ``script``): read here, so a bad file is exit 2
    before anything is queued; ``nodes`` defaults to the sum of its roles' ``instances``; the
    run inside reads the copy :meth:`Submission.submit` puts in the run folder, with the code
    folder it would have had here (``code``, else the git work tree holding the file).

    ``shared_fs=False`` (``--slurm-no-shared-fs``): the batch host cannot see ``runs_dir``;
    the run inside writes its folder and output under the batch host's /tmp, the submitter
    follows them through srun steps and pulls the folder home before the script exits
    (``fleetctl.slurm.private``); ``job_file`` is then read where it is (with the code, on a
    filesystem the batch host sees)."""
    from fleetctl.api.runrequest import new_job_id
    from fleetctl.api.runspec_rules import role_file
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
        inside_command,
        render,
        role_nodes,
        spec_path,
    )
    from fleetctl.slurm.specfile import Inside, document

    if "options" in keywords:  # the argv strings of old: the record's keywords now
        raise TypeError(
            "submission() takes RunSpec keywords (launcher='plain', env={...}) or a RunSpec, "
            "no longer options=[argv strings]"
        )
    if isinstance(script, RunSpec):
        if args:
            raise TypeError("submission(RunSpec, args): the record holds its own args")
        spec = script.replace(**keywords) if keywords else script
    else:
        spec = RunSpec.build(script, *args, **keywords)
    sl = spec.slurm
    for what, value in (("--partition", sl.partition), ("--account", sl.account)):
        if value is not None:
            check_line(what, value)
    for arg in sl.sbatch_args:
        check_line("--sbatch-arg", arg)
    gres = check_gres(sl.gres) if sl.gres else None
    time = check_time(sl.time) if sl.time else None
    job_id = job_id or new_job_id()
    runs = os.path.abspath(runs_dir)
    folder = os.path.join(runs, job_id)
    copy: tuple[str, str] | None = None
    nodes, launcher = spec.hosts.nodes, spec.program.launcher
    # the run inside: the allocation's nodes, in the foreground; the rest is this side's
    inner = dataclasses.replace(
        spec, slurm=Slurm(), monitor=Monitor(), hosts=dataclasses.replace(spec.hosts, nodes=None)
    )
    job_file = role_file(spec.program)  # None: SCRIPT, given
    if job_file is not None:
        from fleetctl.plan.roles import load_job_file
        from fleetctl.plan.script_arg import default_code_dir

        src = os.fspath(job_file)
        jf = load_job_file(src)
        launcher = jf.launcher  # roles | paddle-ps: what the run inside will record
        if nodes is None:
            nodes = role_nodes([(r.name, r.instances) for r in jf.roles], src)
        dest = (
            os.path.join(folder, JOB_FILE_DIR, os.path.basename(src))
            if shared_fs
            else os.path.abspath(src)
        )
        code = spec.program.code
        code_dir = os.path.abspath(code) if code is not None else str(default_code_dir(src))
        copy = (os.path.abspath(src), dest)
        inner = inner.replace(job_file=dest, code=code_dir)
    if nodes is None:
        raise UsageError("--slurm needs --nodes N (the nodes to ask Slurm for)")
    if settings is None:
        from fleetctl.api.types import SSHSettings

        settings = SSHSettings()
    s = settings
    inside = Inside(
        runs_dir=runs if shared_fs else PRIVATE_ROOT.format(job=job_id),
        inventory=inventory,
        limit=limit,
        known_hosts=s.known_hosts,
        accept_new=s.accept_new,
        connect_timeout=s.connect_timeout,
        tail=tail,
        raw_output=raw_output,
    )
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
        partition=sl.partition,
        gres=gres,
        time=time,
        account=sl.account,
        extra=tuple(sl.sbatch_args),
        env=env,
        private=not shared_fs,
        spec=document(inner.to_dict(), inside),
    )
    return Submission(req, render(req), launcher, copy, sl)


def submit(
    script: str | RunSpec | None = None,
    args: Sequence[str] = (),
    *,
    detach: bool = False,
    **options: Any,
) -> Job:
    """:func:`submission` (a ``RunSpec``, or its keywords: ``nodes=``, ``launcher=``,
    ``partition=``, …) then ``sbatch``: the queued :class:`Job` (``executor == "sbatch"``; its
    ``wait()``, ``lines()``, ``status()``, ``stop()`` act on the Slurm job)."""
    return submission(script, args, **options).submit(detach=detach)


def read_spec(path: str | os.PathLike[str]) -> tuple[RunSpec, Inside]:
    """The run a batch script's ``fleetctl run --spec FILE`` stands for: its checked record
    and what the run inside needs beside it (fleetctl.slurm.specfile: the file's only reader
    and writer). UsageError naming the file for one that is not a spec, or holds a value the
    record refuses (the command's line for it)."""
    from fleetctl.errors import UsageError
    from fleetctl.slurm.specfile import read

    data, inside = read(path)
    try:
        return RunSpec.from_dict(data), inside
    except UsageError as e:
        raise UsageError(f"--spec {os.fspath(path)}: {e}") from None


def _python_path() -> str:
    """Where this fleetctl is imported from, for the batch script's PYTHONPATH: the folder
    holding the package, two above this module (``fleetctl/api/slurm.py``)."""
    return str(Path(__file__).resolve().parents[2])


__all__ = ["Submission", "read_spec", "submission", "submit"]
