"""``attempts.json`` (``--max-retries``, in the job's first run folder) as typed records: one
:class:`Attempt` per attempt, in :class:`AttemptsRecord`, on the run folder's record base
(``files.FileRecord``).

The attempt loop (``job.run.attempts``) rewrites the whole file after each attempt from the
attempts it holds, so nothing reads it to change it; unknown keys are kept all the same (the
base's rule), so a newer fleetctl's file reads and writes back whole. An older file (before
``run --nodes`` and the checkpoint relay) reads with ``nodes``, ``left_out`` and
``checkpoints`` None. Every key is written, None too, as the file always had them.
"""

from __future__ import annotations

from typing import Any

from fleetctl.job.records.files import FileRecord


class Attempt(FileRecord):
    """One attempt of a job and what became of it."""

    KIND = "attempt"
    attempt: int
    job_id: str
    folder: str
    status: str
    ended_by: str | None = None  # the first failure, in words
    decision: str | None = None  # why it was (not) retried
    retried: bool = False
    backoff: float | None = None
    nodes: list[str] | None = None  # --nodes N: the hosts this attempt ran on
    left_out: dict[str, str] | None = None  # --nodes N: hosts left out, and why
    checkpoints: dict | None = None  # a retry: what was relayed from rank 0, and how
    membership: list[dict] | None = None  # run --elastic: who left, who joined

    def __init__(self, **values: Any) -> None:
        if "status" in values and isinstance(values["status"], str):
            values["status"] = str(values["status"])  # a JobStatus: its JSON string
        super().__init__(**values)


class AttemptsRecord(FileRecord):
    """``attempts.json``: every attempt, in order."""

    FILE = KIND = "attempts.json"
    NESTED = {"attempts": Attempt}  # noqa: RUF012
    attempts: list = []  # noqa: RUF012
