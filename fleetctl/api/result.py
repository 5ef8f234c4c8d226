"""What a job produced, as the API returns it: one live output line, the first failure, the
run's verdict. Built from job.json's shape, so a job run here, a detached one and one found
again by id (``Job.attach``) read the same."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.errors import FleetctlError
    from fleetctl.job.records.jobrecord import FailureRecord, JobRecord


@dataclass(frozen=True)
class LogLine:
    """One output line of one node; ``str()`` is the CLI's ``[rank host] text``."""

    node_rank: int
    host: str
    text: str

    def __str__(self) -> str:
        return f"[{self.node_rank} {self.host}] {self.text}"


@dataclass(frozen=True)
class FirstFailure:
    """The node whose failure ended the job: ``reason`` reads as the CLI's summary
    (``exit code 1``, ``lost (…)``, ``could not start (…)``)."""

    host: str
    node_rank: int
    reason: str
    state: str
    exit_code: int | None = None
    signal: int | None = None
    after: float | None = None  # seconds from launch


@dataclass(frozen=True)
class RunResult:
    """How the job ended. ``exit_code`` is the CLI's: 0 every node succeeded, 3 a node
    failed, was lost or the job was stopped or timed out, 4 it succeeded but a node's logs
    did not all come home (``logs_incomplete``), 130 interrupted (or its logs only partly
    collected)."""

    job_id: str
    status: str
    exit_code: int
    run_folder: Path
    first_failure: FirstFailure | None = None
    verdict: str | None = None  # why the job ended without a node to blame (a timeout, a stop)
    failed_ranks: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # job.json's node records
    errors: list[str] = field(default_factory=list)
    detached: bool = False  # still running under its supervisors (``run(detach=True)``)
    logs_incomplete: list[str] = field(default_factory=list)  # hosts whose logs are not home
    #: a job ``run --slurm`` submitted (the sbatch executor): its Slurm job id and last state
    slurm: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.detached

    @property
    def failed(self) -> dict[str, str]:
        """Host → how its node failed (``exit code 1``, ``lost (…)``), in rank order: the
        same shape as a fan-out's ``FleetResult.failed`` (host → what went wrong)."""
        from fleetctl.job.records.result import NodeOutcome
        from fleetctl.job.records.state import NodeState

        out: dict[str, str] = {}
        for n in sorted(self.nodes, key=lambda n: int(n.get("rank", 0))):
            state = str(n.get("state") or "")
            if state not in ("failed", "lost", "start_failed"):  # job/records/state.py BAD
                continue
            how = NodeOutcome(
                int(n.get("rank", 0)),
                str(n.get("host")),
                str(n.get("address") or ""),
                state=NodeState(state),
                exit_code=n.get("exit_code"),
                signal=n.get("signal"),
                reason=n.get("reason"),
            ).how()
            out[str(n.get("host"))] = how
        ff = self.first_failure
        if ff is not None and ff.host not in out:
            out = {ff.host: ff.reason, **out}
        return out

    def error(self) -> FleetctlError | None:
        """The error the command exits with for this result (None: it succeeded, or runs on
        detached): Interrupted (130), LogsIncomplete (4), else JobFailed (3)."""
        from fleetctl.errors import Interrupted, JobFailed, LogsIncomplete

        if self.ok or self.detached:
            return None
        what = f"job {self.job_id}: {self.reason}"
        if self.exit_code == 130:
            return Interrupted(what)
        if self.exit_code == 4:
            return LogsIncomplete(what)
        return JobFailed(what)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: every field, plus ``ok``, ``reason`` and ``failed``."""
        import dataclasses

        data = dataclasses.asdict(self)
        data["run_folder"] = str(self.run_folder)
        if self.slurm is None:
            del data["slurm"]
        return {**data, "ok": self.ok, "reason": self.reason, "failed": self.failed}

    @property
    def reason(self) -> str:
        """One line: why the job did not succeed (empty when it did)."""
        if self.ok:
            return ""
        ff = self.first_failure
        if ff is not None:
            return f"node {ff.node_rank} ({ff.host}) failed first: {ff.reason}"
        if self.exit_code == 4:
            hosts = ", ".join(self.logs_incomplete) or "a node"
            return (
                f"{self.status}, but logs incomplete from {hosts}: "
                "`fleetctl collect` fetches the rest"
            )
        return self.verdict or self.status

    @classmethod
    def from_record(
        cls,
        record: JobRecord | Mapping[str, Any],
        folder: str | Path,
        *,
        exit_code: int | None = None,
    ) -> RunResult:
        """From job.json's record (``JobResult.to_record()``, the file, or its dict shape)."""
        from fleetctl.job.records.jobrecord import JobRecord, job_record

        if not isinstance(record, JobRecord):
            record = job_record(record, str(Path(folder) / "job.json"))
        return cls(
            job_id=record.job_id or Path(folder).name,
            status=record.status,
            exit_code=_exit_code(record) if exit_code is None else exit_code,
            run_folder=Path(record.folder or folder),
            first_failure=_first_failure(record.first_failure),
            verdict=record.verdict,
            failed_ranks=list(record.failed_ranks or []),
            nodes=[n.to_dict() for n in record.nodes],
            errors=list(record.errors),
            detached=record.detached and record.live,
            logs_incomplete=[
                str(c.get("host")) for c in record.collected if c.get("complete") is False
            ],
        )


def _exit_code(record: JobRecord) -> int:
    if record.status == "succeeded":
        nodes = (record.teardown or {}).get("nodes") or []
        return 3 if any(n.get("remaining") for n in nodes) else 0
    return status_exit_code(record.status, record.live)


def status_exit_code(status: str, live: bool) -> int:
    """The CLI's exit code for a job in ``status``: 0 succeeded or not ended (no verdict
    yet), 130 interrupted, else 3 (failed, stopped, timed out)."""
    if status == "interrupted":
        return 130
    return 0 if status == "succeeded" or live else 3


def _first_failure(ff: FailureRecord | None) -> FirstFailure | None:
    if ff is None:
        return None
    from fleetctl.job.records.result import NodeOutcome
    from fleetctl.job.records.state import NodeState

    try:
        state = NodeState(ff.state or "failed")
    except ValueError:  # a state a later fleetctl wrote: still a failure
        state = NodeState.FAILED
    how = NodeOutcome(
        ff.rank,
        str(ff.host),
        ff.address or "",
        state=state,
        exit_code=ff.exit_code,
        signal=ff.signal,
        reason=ff.reason,
    ).how()
    return FirstFailure(
        host=str(ff.host),
        node_rank=ff.rank,
        reason=how,
        state=ff.state or "failed",
        exit_code=ff.exit_code,
        signal=ff.signal,
        after=ff.after,
    )
