"""job.json as one type: :class:`JobRecord` (with :class:`NodeRecord` per node and
:class:`FailureRecord` for who failed first), the only way job.json is read or written.

Tolerant of older files: a missing key takes its default (``phases``, ``nccl_traces``,
``problem``… came later), and keys this version does not know are kept in ``extra`` and
written back as they were (a newer fleetctl's fields survive an older one's update). Strict
about types: a value of the wrong JSON type is a one-line RunFolderError naming the file and
the key (``fleet-runs/j/job.json: nodes[1].exit_code is "1", not int or null``), so no reader
downstream has to guess. ``teardown``, ``collected``, ``monitor`` and the other nested reports
stay JSON objects (their writers own their shapes); only their container type is checked.
"""

from __future__ import annotations

import dataclasses
import json
import signal as _signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fleetctl.errors import RunFolderError
from fleetctl.job.records.state import LIVE_STATES

_NONE = type(None)
_T = TypeVar("_T", "NodeRecord", "FailureRecord", "JobRecord")  # the records _from_dict makes


@dataclass
class NodeRecord:
    """One node's entry in job.json's ``nodes`` (``NodeOutcome.to_dict``'s shape)."""

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
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "job.json", where: str = "node") -> NodeRecord:
        return _from_dict(cls, data, source, where)


def signal_name(sig: int) -> str:
    """``SIGKILL`` for 9 (``SIG64`` for a number this system has no name for): how a failure
    ended by a signal is named, in job.json's summaries and in retry rules."""
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"


@dataclass
class FailureRecord:
    """job.json's ``first_failure``: the node whose bad end decided the job."""

    rank: int
    host: str | None = None
    address: str | None = None
    state: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    time: str | None = None  # ISO-8601 UTC
    after: float | None = None  # seconds from launch
    extra: dict[str, Any] = field(default_factory=dict, repr=False)  # e.g. ``found_by``

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    @classmethod
    def from_dict(
        cls, data: Any, *, source: str = "job.json", where: str = "first_failure"
    ) -> FailureRecord:
        return _from_dict(cls, data, source, where)


@dataclass
class JobRecord:
    """job.json: what happened to one attempt of a job (``JobResult.to_dict``'s shape, plus
    what the detached job's monitor and the lifecycle commands add)."""

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
    nodes: list[NodeRecord] = field(default_factory=list)
    teardown: dict[str, Any] | None = None  # TeardownReport.to_dict
    collected: list[dict[str, Any]] = field(default_factory=list)  # NodeCollect.to_dict
    errors: list[str] = field(default_factory=list)
    nccl_traces: list[str] = field(default_factory=list)
    folder: str | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    # written only when set (None: left out of the file)
    attempts: list[dict[str, Any]] | None = None
    failed_ranks: list[dict[str, Any]] | None = None
    culprits: list[str] | None = None
    slow: dict[str, Any] | None = None  # the node named slow during the run (job/diagnose/pace.py)
    post_mortem: dict[str, Any] | None = (
        None  # the collective's proof of the culprit (job/diagnose/proof.py)
    )
    left_out: dict[str, str] | None = None
    resumed_from: dict[str, Any] | None = None  # run --resume: the earlier job's relay
    membership: list[dict[str, Any]] | None = None  # run --elastic: who left, who joined
    stacks: list[dict[str, Any]] | None = None
    stack_nodes: list[dict[str, Any]] | None = None
    completion: dict[str, Any] | None = None  # a role job's policy, for the monitor
    monitor: dict[str, Any] | None = None  # the detached job's monitor: identity, phase, log
    #: what runs it: "sbatch" (``run --slurm`` submitted it), else "direct" (left out)
    executor: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def live(self) -> bool:
        """The record says the job may still run (a crashed controller leaves 'running')."""
        return self.status in LIVE_STATES

    def node(self, rank: int) -> NodeRecord | None:
        return next((n for n in self.nodes if n.rank == rank), None)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "job.json") -> JobRecord:
        """From job.json's object; RunFolderError (one line, naming ``source`` and the key)
        when ``job_id``/``status`` is missing or a value has the wrong type."""
        return _from_dict(cls, data, source, "")


# ------------------------------------------------------------------------ the type table
# per field: the JSON types it may hold; "float" also takes an int (stored as float)
_TYPES: dict[type, dict[str, tuple[type, ...]]] = {
    NodeRecord: {
        "rank": (int,),
        "host": (str,),
        "address": (str,),
        "train_addr": (str, _NONE),
        "state": (str,),
        "exit_code": (int, _NONE),
        "signal": (int, _NONE),
        "start_time": (str, _NONE),
        "end_time": (str, _NONE),
        "reason": (str, _NONE),
        "problem": (str, _NONE),
        "folder": (str, _NONE),
        "collected": (bool,),
    },
    FailureRecord: {
        "rank": (int,),
        "host": (str, _NONE),
        "address": (str, _NONE),
        "state": (str, _NONE),
        "exit_code": (int, _NONE),
        "signal": (int, _NONE),
        "reason": (str, _NONE),
        "time": (str, _NONE),
        "after": (float, _NONE),
    },
    JobRecord: {
        "job_id": (str,),
        "status": (str,),
        "attempt": (int,),
        "detached": (bool,),
        "verdict": (str, _NONE),
        "launcher": (str, _NONE),
        "started": (str, _NONE),
        "ended": (str, _NONE),
        "duration": (float, _NONE),
        "first_failure": (dict, _NONE),
        "nodes": (list,),
        "teardown": (dict, _NONE),
        "collected": (list,),
        "errors": (list,),
        "nccl_traces": (list,),
        "folder": (str, _NONE),
        "phases": (list,),
        "attempts": (list, _NONE),
        "failed_ranks": (list, _NONE),
        "culprits": (list, _NONE),
        "slow": (dict, _NONE),
        "post_mortem": (dict, _NONE),
        "left_out": (dict, _NONE),
        "resumed_from": (dict, _NONE),
        "membership": (list, _NONE),
        "stacks": (list, _NONE),
        "stack_nodes": (list, _NONE),
        "completion": (dict, _NONE),
        "monitor": (dict, _NONE),
        "executor": (str, _NONE),
    },
}
_REQUIRED = {
    NodeRecord: ("rank", "host"),
    FailureRecord: ("rank",),
    JobRecord: ("job_id", "status"),
}
# list items: str lists and object lists
_STR_ITEMS = frozenset({"errors", "nccl_traces", "culprits"})
_OBJ_ITEMS = frozenset(
    {"collected", "phases", "attempts", "failed_ranks", "stacks", "stack_nodes", "membership"}
)
# JobRecord keys left out of the file while None (JobResult.to_dict writes them only when set)
_OPTIONAL = frozenset(
    {"attempts", "failed_ranks", "culprits", "left_out", "stacks", "stack_nodes", "completion"}
    | {"monitor", "resumed_from", "slow", "membership", "executor", "post_mortem"}
)


def _want(types: tuple[type, ...]) -> str:
    return " or ".join("null" if t is _NONE else t.__name__ for t in types)


def _ok(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in types
    if float in types and isinstance(value, int):
        return True
    if dict in types and isinstance(value, dict):
        return True
    return isinstance(value, types)


def _from_dict(cls: type[_T], data: Any, source: str, where: str) -> _T:
    at = f"{where}." if where else ""
    if not isinstance(data, Mapping):
        raise RunFolderError(f"{source}: {where or 'the record'} is not a JSON object")
    types = _TYPES[cls]
    for key in _REQUIRED[cls]:
        if key not in data:
            raise RunFolderError(f"{source}: {where or 'the record'} has no {key!r}")
    out: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in data.items():
        if key not in types:
            extra[key] = value
            continue
        if not _ok(value, types[key]):
            raise RunFolderError(
                f"{source}: {at}{key} is {json.dumps(value)[:60]}, not {_want(types[key])}"
            )
        if isinstance(value, list):
            if key in _STR_ITEMS and not all(isinstance(x, str) for x in value):
                raise RunFolderError(f"{source}: {at}{key} is not a list of strings")
            if key in _OBJ_ITEMS and not all(isinstance(x, dict) for x in value):
                raise RunFolderError(f"{source}: {at}{key} is not a list of objects")
        if (
            key == "left_out"
            and isinstance(value, dict)
            and not all(isinstance(v, str) for v in value.values())
        ):
            raise RunFolderError(f"{source}: {at}{key} is not an object of strings")
        if float in types[key] and isinstance(value, int):
            value = float(value)
        elif isinstance(value, str) and type(value) is not str:
            value = str(value)  # a state enum (JobStatus, NodeState): its JSON string
        if key == "nodes":
            value = [
                NodeRecord.from_dict(n, source=source, where=f"nodes[{i}]")
                for i, n in enumerate(value)
            ]
        elif key == "first_failure" and value is not None:
            value = FailureRecord.from_dict(value, source=source)
        elif isinstance(value, list):
            value = list(value)
        elif isinstance(value, dict):
            value = dict(value)
        out[key] = value
    return cls(**out, extra=extra)


def _to_dict(record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.name == "extra":
            continue
        value = getattr(record, f.name)
        if value is None and f.name in _OPTIONAL and isinstance(record, JobRecord):
            continue
        if isinstance(value, (NodeRecord, FailureRecord)):
            value = value.to_dict()
        elif isinstance(value, list):
            value = [v.to_dict() if isinstance(v, NodeRecord) else v for v in value]
        out[f.name] = value
    for key, value in record.extra.items():
        out.setdefault(key, value)
    return out
