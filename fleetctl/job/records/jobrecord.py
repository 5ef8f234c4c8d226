"""job.json as one type: :class:`JobRecord` (with :class:`NodeRecord` per node, and
:class:`FailureRecord` for who failed first), the only way job.json is read or written, on the
run folder's record base (``files.FileRecord``: the node's ``Record``).

Many writers over a run's life (the attached run, the detached job's monitor, ``stop``,
``collect``, a late stop, ``run --slurm``'s submitter) read it, change it and write it back
(``RunFolder.editing_job``, under the folder lock, atomically), so unknown keys are **kept**
at every level (``EXTRA = "keep"``): a newer fleetctl's fields survive an older one's update.
Tolerant of older files: a missing key takes its default (``phases``, ``nccl_traces``,
``problem``… came later). Strict about types: a value of the wrong JSON type is a one-line
RunFolderError naming the file and the key (``fleet-runs/j/job.json: nodes[1].exit_code must
be int or null, not str``), so no reader downstream has to guess. ``teardown``, ``collected``,
``monitor`` and the other nested reports stay JSON objects (their writers own their shapes);
only their container type is checked. ``attempts`` (``run --max-retries``'s copy in the final
job.json) is attempts.json's ``Attempt`` per item.
"""

from __future__ import annotations

import json
import signal as _signal
from collections.abc import Mapping
from typing import Any

from fleetctl.errors import RunFolderError
from fleetctl.job.records.attempts import Attempt
from fleetctl.job.records.files import FileRecord
from fleetctl.job.records.state import ENDED_STATES, LIVE_STATES
from fleetctl.remote.kit.records import RecordError


class NodeRecord(FileRecord):
    """One node's entry in job.json's ``nodes`` (``NodeOutcome.to_dict``'s shape)."""

    KIND = "node"
    rank: int
    host: str
    address: str = ""
    train_addr: str | None = None
    state: str = "pending"
    exit_code: int | None = None
    signal: int | None = None
    start_time: str | None = None  # ISO-8601 UTC
    end_time: str | None = None
    reason: str | None = None
    problem: str | None = None
    folder: str | None = None
    collected: bool = False


def signal_name(sig: int) -> str:
    """``SIGKILL`` for 9 (``SIG64`` for a number this system has no name for): how a failure
    ended by a signal is named, in job.json's summaries and in retry rules."""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


class FailureRecord(FileRecord):
    """job.json's ``first_failure``: the node whose bad end decided the job (extra keys such as
    ``found_by`` are kept)."""

    KIND = "first_failure"
    rank: int
    host: str | None = None
    address: str | None = None
    state: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    time: str | None = None  # ISO-8601 UTC
    after: float | None = None  # seconds from launch


class JobRecord(FileRecord):
    """job.json: what happened to one attempt of a job (``JobResult.to_dict``'s shape, plus
    what the detached job's monitor and the lifecycle commands add)."""

    FILE = KIND = "job.json"
    NESTED = {"first_failure": FailureRecord, "nodes": NodeRecord, "attempts": Attempt}  # noqa: RUF012
    # written only when set: None leaves them out of the file (JobResult.to_dict's rule)
    OMIT = (
        *("attempts", "failed_ranks", "culprits", "slow", "post_mortem", "left_out"),
        *("resumed_from", "membership", "stacks", "stack_nodes", "completion", "monitor"),
        "executor",
    )
    job_id: str
    status: str
    attempt: int = 1
    detached: bool = False
    verdict: str | None = None
    launcher: str | None = None
    started: str | None = None  # ISO-8601 UTC
    ended: str | None = None
    duration: float | None = None
    first_failure: FailureRecord | None = None
    nodes: list[NodeRecord] = []  # noqa: RUF012 (Record copies it)
    teardown: dict | None = None  # TeardownReport.to_dict
    collected: list[dict] = []  # noqa: RUF012 (NodeCollect.to_dict)
    errors: list[str] = []  # noqa: RUF012
    nccl_traces: list[str] = []  # noqa: RUF012
    folder: str | None = None
    phases: list[dict] = []  # noqa: RUF012
    attempts: list[Attempt] | None = None
    failed_ranks: list[dict] | None = None
    culprits: list[str] | None = None
    slow: dict | None = None  # the node named slow during the run (job/diagnose/pace.py)
    post_mortem: dict | None = None  # the collective's proof of the culprit (diagnose/proof.py)
    left_out: dict[str, str] | None = None
    resumed_from: dict | None = None  # run --resume: the earlier job's relay
    membership: list[dict] | None = None  # run --elastic: who left, who joined
    stacks: list[dict] | None = None
    stack_nodes: list[dict] | None = None
    completion: dict | None = None  # a role job's policy, for the monitor
    monitor: dict | None = None  # the detached job's monitor: identity, phase, log
    #: what runs it: "sbatch" (``run --slurm`` submitted it), else "direct" (left out)
    executor: str | None = None

    @property
    def live(self) -> bool:
        """The record says the job may still run (a crashed controller leaves 'running')."""
        return self.status in LIVE_STATES

    @property
    def finished(self) -> bool:
        """The attempt ran and its end is written (``run --slurm``'s submitter asks Slurm often
        from then on: the batch script exits right after)."""
        return self.status in ENDED_STATES

    def moved(self, old: str, new: str) -> JobRecord:
        """This record with every path that is folder ``old`` or under it (a value or a key,
        at any depth) naming ``new`` instead: a run folder pulled home from where the run
        inside wrote it. Other strings, ``old + "x"`` among them, stay as they are."""
        return JobRecord.from_dict(_moved(self.to_dict(), old, new), self.FILE)

    def node(self, rank: int) -> NodeRecord | None:
        return next((n for n in self.nodes if n.rank == rank), None)

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for key in self.OMIT:
            if key in out and out[key] is None:
                del out[key]
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: object, source: str | None = None) -> JobRecord:
        """job.json's object as its record; RunFolderError (the public API's error: one line,
        naming ``source`` and the key) when ``job_id``/``status`` is missing or a value has
        the wrong type."""
        try:
            return super().from_dict(data, source)
        except RecordError as e:
            raise RunFolderError(str(e)) from None


def _moved(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return new + value[len(old) :] if value == old or value.startswith(old + "/") else value
    if isinstance(value, dict):
        return {_moved(k, old, new): _moved(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_moved(v, old, new) for v in value]
    return value


def job_record(data: Mapping[str, Any] | object, source: str) -> JobRecord:
    """:meth:`JobRecord.from_dict` (``source``: the file it came from)."""
    return JobRecord.from_dict(data, source)
