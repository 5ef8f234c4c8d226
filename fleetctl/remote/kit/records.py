"""The supervisor's typed records: the spec it is started with and ``supervisor.json``.

Both ends import these classes: the controller builds the spec through ``SupervisorSpec`` and
reads a collected ``supervisor.json`` through ``SupervisorState``; the supervisor reads the spec
and writes, rewrites and answers its state through them. ``from_dict`` is tolerant of older
documents (a missing key takes its default; unknown keys are ignored) and strict about types (a
value of the wrong type is a ``RecordError`` naming the record and the key).

Not ``dataclasses``: on Python 3.8 importing it costs every node start ~6 ms (``inspect``).
``Record`` reads the same class body instead: each annotated name is a field, its class value
its default (none: required); the annotation, a string under ``from __future__ import
annotations``, is the type checked. Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # the type checker reads the block; a node never imports typing (start-up)
if TYPE_CHECKING:
    from typing import TypeVar

    _R = TypeVar("_R", bound="Record")

_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}
_REQUIRED = object()


class RecordError(ValueError):
    """A record's value of the wrong type, or a required one missing."""


def _parse(annotation: str) -> tuple[type, type | None, bool]:
    """``"list[str] | None"`` -> (list, str, True): the type, its items' type, nullable."""
    parts = [p.strip() for p in annotation.split("|")]
    nullable = "None" in parts
    (main,) = [p for p in parts if p != "None"]
    head, _, inner = main.partition("[")
    item = _TYPES.get(inner.rstrip("]").split(",")[-1].strip()) if inner else None
    return _TYPES[head], item, nullable


class Record:
    """A typed record (see the module doc); subclasses name ``KIND`` for error messages."""

    KIND = "record"
    _fields: tuple = ()  # (name, type, item type, nullable, default), per class, made once

    @classmethod
    def fields(cls) -> tuple:
        if "_fields" not in cls.__dict__:
            # this class's own (stringified) annotations, in order; 3.8 has no annotationlib,
            # and 3.14 may keep them behind ``__annotate__`` (the attribute then evaluates it)
            notes = cls.__dict__.get("__annotations__") or cls.__annotations__  # noqa: RUF063
            cls._fields = tuple(
                (name, *_parse(note), cls.__dict__.get(name, _REQUIRED))
                for name, note in notes.items()
                if not name.startswith("_") and name.upper() != name
            )
        return cls._fields

    def __init__(self, **values: object) -> None:
        for name, typ, item, nullable, default in self.fields():
            if name in values:
                value = values.pop(name)
            elif default is _REQUIRED:
                raise RecordError(f"{self.KIND}: {name} is missing")
            else:  # a fresh copy of a mutable default
                value = type(default)(default) if isinstance(default, (list, dict)) else default
            setattr(self, name, _check(self.KIND, name, value, typ, item, nullable))
        if values:
            raise RecordError(f"{self.KIND}: unknown field(s) {', '.join(sorted(values))}")

    def to_dict(self) -> dict:
        return {f[0]: getattr(self, f[0]) for f in self.fields()}

    @classmethod
    def from_dict(cls: type[_R], data: object) -> _R:
        """The record a JSON document holds: missing keys defaulted, unknown keys ignored."""
        if not isinstance(data, dict):
            raise RecordError(f"{cls.KIND}: not a JSON object")
        return cls(**{f[0]: data[f[0]] for f in cls.fields() if f[0] in data})

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Record)
            and type(other) is type(self)
            and other.to_dict() == self.to_dict()
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


def _check(
    kind: str, name: str, value: object, typ: type, item: type | None, nullable: bool
) -> object:
    if value is None and nullable:
        return None
    ok = isinstance(value, typ) and not (typ is not bool and isinstance(value, bool))
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if ok and item is not None:
        items = (
            value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        )
        ok = all(isinstance(v, item) for v in items)
        typ_name = f"{typ.__name__} of {item.__name__}"
    else:
        typ_name = typ.__name__
    if not ok:
        want = typ_name + (" or null" if nullable else "")
        raise RecordError(f"{kind}: {name} must be {want}, not {type(value).__name__}")
    return value


class SupervisorSpec(Record):
    """What the controller sends the supervisor (one JSON line after ``R``): the job to run.

    ``rank_logs``: which per-rank files to tail (the launcher module's rules); ``container``:
    the argv that list, stop and remove the job's containers (``--image``); ``collect``: what
    ``c`` sends; ``reattach``: a closed channel is not the end (the controller may come back)."""

    KIND = "supervisor spec"
    job_id: str
    argv: list[str]
    run_dir: str
    node_rank: int = 0
    env: dict[str, str] = {}  # noqa: RUF012 (Record copies it)
    cwd: str | None = None
    work: str | None = None  # the job's work folder when cwd is a folder inside it
    work_seed: str | None = None  # the code snapshot the work folder starts as a copy of
    files: dict[str, str] = {}  # noqa: RUF012
    path_prepend: list[str] = []  # noqa: RUF012
    deadman: float = 10.0
    grace: float = 5.0
    heartbeat: float = 1.0
    detach: bool = False
    reattach: bool = False
    rank_logs: dict | None = None
    one_process: bool = False  # no launcher process: the child is local rank 0
    container: dict | None = None
    collect: dict | None = None
    pace: dict | None = None  # the slow-node watch's sampler (pace.py): tick, report

    def __init__(self, **values: object) -> None:
        super().__init__(**values)
        if not self.argv or not self.job_id:
            raise RecordError(f"{self.KIND}: needs argv and job_id")


class SupervisorState(Record):
    """``supervisor.json`` in the node's run folder: who runs the job (pid, pgid, the leader's and
    the supervisor's start times), then how it ended. Written at the start, rewritten whole at
    the end; the one-shot modes and the controller read it."""

    KIND = "supervisor.json"
    protocol: int | None = None
    job_id: str | None = None
    node_rank: int | None = None
    run_dir: str | None = None
    cwd: str | None = None
    argv: list[str] = []  # noqa: RUF012
    pid: int | None = None
    pgid: int | None = None
    leader_start: int | None = None
    supervisor_pid: int | None = None
    supervisor_start: int | None = None
    subreaper: bool = False
    start_time: float | None = None
    detached: bool = False
    deadman: float | None = None
    grace: float | None = None
    state: str | None = None  # running, exited, stopped
    exit_code: int | None = None
    signal: int | None = None
    end_time: float | None = None
    stop_reason: str | None = None
    remaining: list = []  # noqa: RUF012
    dropped_frames: int = 0
    problem: str | None = None  # e.g. "disk full on <run dir>"
    exit_report: dict | None = None  # what ``X`` said after the code
    containers: dict | None = None  # ``--image``: what ending the job's containers found


def read_state(path: str) -> SupervisorState | None:
    """A run folder's ``supervisor.json``; None when there is none (or it is not JSON: a write
    cut short). A file of the wrong shape raises ``RecordError``."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return SupervisorState.from_dict(data)
