"""What a job produced, as the API returns it: one live output line, the first failure, the
run's verdict. Built from job.json's shape, so a job run here, a detached one and one found
again by id (``Job.attach``) read the same."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


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
    failed, was lost or the job was stopped or timed out, 130 interrupted (or its logs only
    partly collected)."""

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

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.detached

    @property
    def reason(self) -> str:
        """One line: why the job did not succeed (empty when it did)."""
        if self.ok:
            return ""
        ff = self.first_failure
        if ff is not None:
            return f"node {ff.node_rank} ({ff.host}) failed first: {ff.reason}"
        return self.verdict or self.status

    @classmethod
    def from_record(
        cls, doc: dict[str, Any], folder: str | Path, *, exit_code: int | None = None
    ) -> RunResult:
        """From job.json's shape (``JobResult.to_dict()`` or the file)."""
        status = str(doc.get("status") or "error")
        return cls(
            job_id=str(doc.get("job_id") or Path(folder).name),
            status=status,
            exit_code=_exit_code(doc) if exit_code is None else exit_code,
            run_folder=Path(doc.get("folder") or folder),
            first_failure=_first_failure(doc.get("first_failure")),
            verdict=doc.get("verdict"),
            failed_ranks=list(doc.get("failed_ranks") or []),
            nodes=[dict(n) for n in doc.get("nodes") or []],
            errors=[str(e) for e in doc.get("errors") or []],
            detached=bool(doc.get("detached")) and status in ("running", "starting", "detached"),
        )


def _exit_code(doc: dict[str, Any]) -> int:
    status = str(doc.get("status"))
    if status == "interrupted":
        return 130
    if status == "succeeded":
        teardown = doc.get("teardown") or {}
        left = any(n.get("remaining") for n in teardown.get("nodes") or [])
        return 3 if left else 0
    if status in ("running", "starting", "detached"):
        return 0  # not ended: no verdict yet
    return 3


def _first_failure(ff: Any) -> FirstFailure | None:
    if not isinstance(ff, dict) or ff.get("rank") is None:
        return None
    from fleetctl.job.result import NodeOutcome

    how = NodeOutcome(
        int(ff["rank"]),
        str(ff.get("host")),
        str(ff.get("address") or ""),
        state=ff.get("state") or "failed",
        exit_code=ff.get("exit_code"),
        signal=ff.get("signal"),
        reason=ff.get("reason"),
    ).how()
    return FirstFailure(
        host=str(ff.get("host")),
        node_rank=int(ff["rank"]),
        reason=how,
        state=str(ff.get("state") or "failed"),
        exit_code=ff.get("exit_code"),
        signal=ff.get("signal"),
        after=ff.get("after"),
    )
