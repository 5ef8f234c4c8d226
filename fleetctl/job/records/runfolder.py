"""The controller run folder ``fleet-runs/<job-id>/``: what happened, durable and greppable.

This module is the folder's only writer: every file in it is named here and written through
:class:`RunFolder`, atomically (temp file + rename, 0600) and, for job.json, under the folder
lock. The files:

* ``plan.json`` — the rank plan as run;
* ``job.json`` — status, per-node exit code/signal, times, who failed first, attempt, monitor;
* ``events.log`` — one timestamped line per event (appended);
* ``connect.json`` — how to reach the nodes again (no env values, no secrets);
* ``attempts.json`` — with retries, every attempt and why it was (not) retried (in the first
  attempt's folder);
* ``roles.json`` — a role job's layout: the job file as parsed and every task's ports;
* ``check.json`` — the check's table: each host's cells (status, detail), failures, mesh pairs;
* ``collective.json`` — ``--collective``: per node, per link, the all-reduce and the verdict;
* ``monitor.log`` — a detached job's monitor output;
* ``controller.json`` — who created the folder (the ``fleetctl run`` process: pid, start time,
  boot, host), so ``fleetctl status`` can tell a job whose controller is gone;
* ``stacks-<time>.txt`` — every process's stack, dumped on demand (``fleetctl stacks``);
* ``report.html`` — the job's offline report, made from the other files by
  :mod:`fleetctl.report` (which writes it, atomically and 0600) when the run ends;
* ``slurm.json``, ``sbatch.sh`` — ``run --slurm``: the Slurm job id and state, the batch script
  as submitted; ``slurm.out`` (the script's output) is written by Slurm itself. The run inside
  the allocation adopts the folder its submitter made (:meth:`RunFolder.create`);
* ``<rank>-<host>/`` — one folder per node with its collected logs (written by collect, into
  the path :meth:`RunFolder.node_folder` gives), and ``console.streamed.log`` there when the
  node's own log could not be collected; ``before.log`` there: the output of ``run --before``'s
  task on that node.

Folders are 0700: logs and env may hold things others should not read. ``list_runs``/
``load_run`` read them back for ``fleetctl runs/status/logs``; job ids are checked as ids first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, TypeVar

from fleetctl.errors import NoSuchJob, RunFolderError, UsageError
from fleetctl.job.records.files import (
    CheckRecord,
    CollectiveRecord,
    ConnectRecord,
    ControllerRecord,
    FileRecord,
    RanksRecord,
    RolesRecord,
    SlurmRecord,
)
from fleetctl.job.records.jobrecord import JobRecord, job_record
from fleetctl.job.records.plan import PlanRecord
from fleetctl.plan.names import node_folder_name
from fleetctl.remote.kit.records import RecordError

if TYPE_CHECKING:
    from fleetctl.plan.roles import RoleLayout

DEFAULT_RUNS_DIR = "fleet-runs"
JOB_FILE = "job.json"
PLAN_FILE = "plan.json"
EVENTS_FILE = "events.log"
CONNECT_FILE = ConnectRecord.FILE
ATTEMPTS_FILE = "attempts.json"
ROLES_FILE = RolesRecord.FILE
COLLECTIVE_FILE = CollectiveRecord.FILE
CHECK_FILE = CheckRecord.FILE  # the check's table: every host's cells, failures, mesh pairs
RANKS_FILE = RanksRecord.FILE
MONITOR_LOG = "monitor.log"
CONTROLLER_FILE = ControllerRecord.FILE
SLURM_FILE = SlurmRecord.FILE
SBATCH_FILE = "sbatch.sh"
STREAMED_CONSOLE = "console.streamed.log"
BEFORE_LOG = "before.log"
REPORT_FILE = "report.html"
HOOK_LOG = "hook-{name}.log"  # --on-failure/--on-end: the command's output (name: on-end, …)
STACKS_PREFIX = "stacks-"  # + UTC time + .txt: `fleetctl stacks` dumps
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}\Z")  # \Z: no trailing newline
LOCK_TIMEOUT = 30.0  # s; job.json updates take milliseconds, so a longer wait is a stuck peer
_F = TypeVar("_F", bound=FileRecord)


def iso(ts: float | None) -> str | None:
    """Seconds since the epoch as ISO-8601 UTC with milliseconds (None stays None)."""
    if ts is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def check_job_id(job_id: str) -> str:
    """A job id (or a prefix of one) as given on the command line: an id, never a path."""
    if not JOB_ID_RE.match(job_id) or ".." in job_id:
        raise UsageError(
            f"{job_id!r} is not a job id (letters, digits, '.', '_', '-'; see `fleetctl runs`)"
        )
    return job_id


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass
class RunFolder:
    """One job's folder on the controller."""

    path: Path

    @property
    def job_id(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, runs_dir: str | Path, job_id: str) -> RunFolder:
        """Make ``runs_dir/job_id`` (0700); refuses an existing one (job ids are unique)."""
        root = Path(runs_dir)
        path = root / job_id
        try:
            # exist_ok: two runs started together both find no runs dir and both create it;
            # only the job's own folder must be new.
            root.mkdir(parents=True, mode=0o700, exist_ok=True)
        except OSError as e:
            raise RunFolderError(f"{root}: cannot create runs folder: {e}") from e
        try:
            path.mkdir(mode=0o700)
            os.chmod(path, 0o700)
        except FileExistsError as e:
            # `run --slurm` made it for this batch job: adopted (this process is its controller)
            if not _submitted_for_this_job(path):
                raise RunFolderError(f"{path}: run folder already exists") from e
        except OSError as e:
            raise RunFolderError(f"{path}: cannot create run folder: {e}") from e
        folder = cls(path)
        from fleetctl.job.records.controller import identity

        with contextlib.suppress(OSError):  # a note for `status`, never a reason not to run
            folder.write_record(ControllerRecord.from_dict(identity()))
        return folder

    def _write_json(self, name: str, data: dict[str, Any]) -> None:
        _write_atomic(self.path / name, json.dumps(data, indent=2) + "\n")

    def write_record(self, record: FileRecord) -> None:
        """Replace the file ``record`` is (its class's ``FILE``), atomically."""
        self._write_json(record.FILE, record.to_dict())

    def read_record(self, cls: type[_F]) -> _F:
        """The folder's ``cls.FILE`` as its record: ``read_json``'s policy, then the record's
        types (a RunFolderError naming the file and the key)."""
        path = self.path / cls.FILE
        try:
            return cls.from_dict(read_json(path), source=str(path))
        except RecordError as e:
            raise RunFolderError(str(e)) from None

    def find_record(self, cls: type[_F]) -> _F | None:
        """:meth:`read_record`, None when the file is not there (an older run, another kind of
        job); a file there but malformed is still a RunFolderError."""
        if not (self.path / cls.FILE).is_file():
            return None
        return self.read_record(cls)

    def write_plan(self, plan: dict[str, Any]) -> None:
        """``plan.json``: the plan document (``prepare.plan_document``), through its record."""
        try:
            record = PlanRecord.from_dict(plan)
        except RecordError as e:
            raise RunFolderError(str(e)) from None
        self.write_record(record)

    def write_job(self, job: JobRecord) -> None:
        """Replace job.json (callers that read it first hold :meth:`locked`, or use
        :meth:`editing_job`)."""
        self.write_record(job)

    @contextlib.contextmanager
    def editing_job(self) -> Iterator[JobRecord]:
        """job.json to change in place, under the folder lock; written back unless the
        ``with`` body raises."""
        with self.locked():
            job = self.load_job()
            yield job
            self.write_job(job)

    def receive(self, tar: IO[bytes]) -> str | None:
        """Another copy of this folder from its tar stream (``run --slurm
        --slurm-no-shared-fs``: the batch host's), unpacked safely: its files replace these
        (its job.json the queued record). Why the stream broke, or None."""
        from fleetctl.phases.unpack import unpack

        return unpack(tar, self.path).error

    def relocate_job(self, inside: str) -> None:
        """job.json written in folder ``inside`` (the run inside's, pulled here by
        :meth:`receive`) names this folder in each path that is ``inside`` or under it;
        left as it is when it does not read as a record."""
        with contextlib.suppress(OSError, RunFolderError), self.locked():
            self.write_job(self.load_job().moved(inside, str(self.path)))

    def load_controller(self) -> ControllerRecord | None:
        """The process that created the folder (None: not recorded, e.g. an older run, or
        unreadable: a note, never a reason a command fails)."""
        try:
            return self.read_record(ControllerRecord)
        except RunFolderError:
            return None

    def write_slurm(self, record: SlurmRecord, script: str | None = None) -> None:
        """``run --slurm``: the submitted job's record (and the batch script, once)."""
        if script is not None:
            _write_atomic(self.path / SBATCH_FILE, script)
        self.write_record(record)

    def load_slurm(self) -> SlurmRecord | None:
        """The Slurm job this folder was submitted as (None: not a ``run --slurm`` job, or a
        slurm.json that is not one: the job is then found as a direct one)."""
        try:
            return self.read_record(SlurmRecord)
        except RunFolderError:
            return None

    def load_connect(self) -> ConnectRecord:
        """How to reach the job's nodes again (``runs.write_connect`` writes it)."""
        return self.read_record(ConnectRecord)

    @property
    def has_connect(self) -> bool:
        return (self.path / CONNECT_FILE).is_file()

    def write_roles(self, layout: RoleLayout) -> None:
        """``roles.json``: a role job's layout, as its record (``RolesRecord.of``)."""
        self.write_record(RolesRecord.of(layout))

    def write_check(self, report: dict[str, Any]) -> None:
        """``check.json``: the check's table as the run saw it (every host's cells with their
        details, the failures, the pairs that could not talk), passing or not."""
        names = [f[0] for f in CheckRecord.fields()]
        try:
            record = CheckRecord.from_dict({k: report[k] for k in names if k in report})
        except RecordError as e:
            raise RunFolderError(str(e)) from None
        self.write_record(record)

    def write_collective(self, report: dict[str, Any]) -> None:
        """``collective.json``: the ``--collective`` benchmark's figures and verdict."""
        try:
            record = CollectiveRecord.from_dict(report)
        except RecordError as e:
            raise RunFolderError(str(e)) from None
        self.write_record(record)

    def redact_env_dumps(
        self, node_folder: str, keys: Iterable[str], globs: Iterable[str]
    ) -> list[str]:
        """Rewrite the launcher's environment dumps (``globs``, the launcher's ``env_dumps``) in
        a node folder without the values of ``keys`` (fleetctl.job.records.redact); returns the
        files changed, relative to the run folder."""
        from fleetctl.job.records.redact import redact_text

        keys = sorted(set(keys))
        changed: list[str] = []
        base = self.path / node_folder
        for pattern in globs:
            for p in sorted(base.glob(pattern)):
                if not p.is_file() or p.name.startswith("workerlog."):
                    continue
                text = p.read_text(errors="replace")
                new = redact_text(text, keys)
                if new != text:
                    _write_atomic(p, new)
                    changed.append(str(p.relative_to(self.path)))
        return changed

    def write_ranks(self, ranks: list[dict[str, Any]]) -> None:
        """``ranks.json``: global rank -> node, local rank, pid, log files
        (fleetctl.job.diagnose.ranks), through its record (a wrong type is a RunFolderError)."""
        try:
            record = RanksRecord.from_dict({"ranks": ranks})
        except RecordError as e:
            raise RunFolderError(str(e)) from None
        self.write_record(record)

    @property
    def monitor_log(self) -> Path:
        return self.path / MONITOR_LOG

    def open_monitor_log(self) -> int:
        """A descriptor appending to monitor.log (0600), for the monitor process's output."""
        try:
            return os.open(self.monitor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as e:
            raise RunFolderError(f"{self.monitor_log}: cannot create the monitor log: {e}") from e

    def open_hook_log(self, name: str) -> int:
        """A descriptor appending to ``hook-<name>.log`` (0600): a run hook's output."""
        path = self.path / HOOK_LOG.format(name=name)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)

    def write_stacks(self, text: str) -> Path:
        """A stack dump taken on demand (``fleetctl stacks``), named by when it was taken."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        path = self.path / f"{STACKS_PREFIX}{stamp}.txt"
        _write_atomic(path, text)
        return path

    def write_streamed_console(self, rank: int, host: str, lines: Iterable[str]) -> Path:
        """What streamed from a node whose own logs could not be collected."""
        folder = self.node_folder(rank, host)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / STREAMED_CONSOLE
        _write_atomic(path, "".join(line + "\n" for line in lines))
        return path

    def open_streamed_console(self, rank: int, host: str) -> BinaryIO:
        """Append every line that streams from a node, as it arrives (the controller's own
        copy: whole when the node's console.log is not — its disk filled, it was lost)."""
        folder = self.node_folder(rank, host)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        fd = os.open(folder / STREAMED_CONSOLE, flags, 0o600)
        return os.fdopen(fd, "ab", buffering=1 << 16)

    def open_before_log(self, rank: int, host: str) -> BinaryIO:
        """Append the output of ``run --before``'s task on this node, line by line."""
        folder = self.node_folder(rank, host)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        fd = os.open(folder / BEFORE_LOG, flags, 0o600)
        return os.fdopen(fd, "ab")

    def drop_streamed_console(self, rank: int, host: str) -> None:
        """The node's own console.log came home whole: the streamed copy is not needed."""
        with contextlib.suppress(FileNotFoundError):
            (self.node_folder(rank, host) / STREAMED_CONSOLE).unlink()

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock on the folder while job.json is read, updated and written.

        An attached ``fleetctl run`` and a ``fleetctl stop`` from another terminal both update
        job.json; without it the stop could overwrite the run's final record with its own
        older copy. Not re-entrant (flock on a fresh descriptor): take it once per update.
        """
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError as e:
                    if time.monotonic() > deadline:
                        raise RunFolderError(
                            f"{self.path}: job.json is locked by another fleetctl for over "
                            f"{LOCK_TIMEOUT:g}s"
                        ) from e
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)

    def event(self, text: str, ts: float | None = None) -> None:
        """Append one line to events.log (newlines in ``text`` are folded)."""
        line = f"{iso(ts or time.time())} {' '.join(text.splitlines())}\n"
        fd = os.open(self.path / EVENTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(line)

    def load_job(self) -> JobRecord:
        return read_job(self.path / JOB_FILE)

    def load_plan(self) -> PlanRecord:
        """The plan as run (RunFolderError: not there, or malformed, in one line)."""
        return self.read_record(PlanRecord)

    def node_folder(self, rank: int, host: str) -> Path:
        return self.path / node_folder_name(rank, host)


def _submitted_for_this_job(path: Path) -> bool:
    """``path`` was made by ``run --slurm`` for the Slurm job this process runs in (its
    record is written before sbatch, so the job id may not be in it yet)."""
    from fleetctl.slurm.allocation import job_id

    job = job_id(os.environ)
    if not job or os.environ.get("FLEETCTL_RUN_ID") != path.name:
        return False
    record = RunFolder(path).load_slurm()
    if record is None:
        return False
    return record.job_id is None or record.job_id == job


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file of a run folder: the one policy for reading them. Missing,
    unreadable or not an object is a RunFolderError naming the file; a caller that can do
    without the file (a node's, which may not have come home) catches it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise RunFolderError(f"{path}: not found") from e
    except (OSError, ValueError, RecursionError) as e:
        raise RunFolderError(f"{path}: unreadable: {type(e).__name__}: {e}") from e
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: not a JSON object")
    return data


def read_job(path: Path) -> JobRecord:
    """A job.json as its record (``read_json``'s policy, then :class:`JobRecord`'s types)."""
    return job_record(read_json(path), str(path))


def load_run(runs_dir: str | os.PathLike[str], job_id: str) -> RunFolder:
    """The folder of ``job_id`` (a unique prefix is enough); RunFolderError if none/ambiguous."""
    check_job_id(job_id)
    root = Path(runs_dir)
    exact = root / job_id
    if exact.is_dir():
        return RunFolder(exact)
    matches = [p for p in root.glob(f"{job_id}*") if p.is_dir()] if root.is_dir() else []
    if len(matches) == 1:
        return RunFolder(matches[0])
    if not matches:
        raise NoSuchJob(f"no job {job_id} in {root}")
    raise NoSuchJob(
        f"job id {job_id} is ambiguous in {root}: " + ", ".join(sorted(p.name for p in matches))
    )


def list_runs(runs_dir: str | Path) -> list[JobRecord]:
    """job.json of every run folder, oldest first (ids sort by start time); unreadable skipped."""
    root = Path(runs_dir)
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.iterdir()):
        if p.is_dir() and (p / JOB_FILE).is_file():
            try:
                out.append(read_job(p / JOB_FILE))
            except RunFolderError:
                continue
    return out
