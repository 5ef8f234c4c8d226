"""The run folder's JSON files as typed records, one class per file, each the only way its file
is written and read (``RunFolder.write_record``/``read_record``).

They stand on the node's record base (``fleetctl.remote.kit.records.Record``: a class body's
annotations are the fields, their values the defaults, types checked both ways), so the
supervisor's ``supervisor.json`` and these are one kind of thing. :class:`FileRecord` adds what
a file kept across fleetctl versions needs and a node does not (it would only grow the node
programs, which travel to every node):

* ``EXTRA``: keys this version does not know — ``"keep"`` (written back as read: a newer
  fleetctl's fields survive an older one's update), ``"ignore"`` or ``"refuse"``;
* ``SCHEMA``: the ``schema`` key, absent for 1 (every file today) and written only past it; a
  file of another schema is refused in one line rather than misread;
* ``OMIT``: keys written only when set (given or assigned, None too: as a dict's key would be;
  otherwise left out, as the writers before these did);
* ``NESTED``: a field whose items (a list's) or whose object is itself a record, read and
  written through that class, its errors keyed by path (``ranks[1].pid``).

A file of the wrong shape is a one-line ``RecordError`` naming the file and the key
(``fleet-runs/j/ranks.json: ranks[1].pid must be int or null, not str``); the run folder turns
it into a ``RunFolderError``. Files of an older fleetctl read with defaults for what they
predate. Field order is the order the file has always had: the JSON stays byte for byte what
it was (``tests/pure/records/*.json`` are the golden files).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from fleetctl.remote.kit.records import _REQUIRED, Record, RecordError, _parse

if TYPE_CHECKING:
    from fleetctl.plan.roles import RoleLayout

_F = TypeVar("_F", bound="FileRecord")


class FileRecord(Record):
    """A run-folder file's record (see the module doc); ``FILE`` names the file."""

    FILE: ClassVar[str] = ""
    EXTRA: ClassVar[str] = "keep"
    SCHEMA: ClassVar[int] = 1
    OMIT: ClassVar[tuple[str, ...]] = ()
    NESTED: ClassVar[dict[str, type[FileRecord]]] = {}

    def __init__(self, **values: object) -> None:
        given = set(values)
        for name, value in values.items():  # a state enum (JobStatus, NodeState): its string
            if isinstance(value, str) and type(value) is not str:
                values[name] = str.__str__(value)
        super().__init__(**values)
        self._extra: dict[str, Any] = {}
        self._given = given  # from here on, every field assigned counts as given

    @classmethod
    def fields(cls) -> tuple:
        """The base's fields, but a ``NESTED`` field's annotation names its record class
        (``list[NodeRecord]``, ``FailureRecord | None``): checked as a list, or as an object
        (a JSON object as read, the record once made)."""
        if "_fields" not in cls.__dict__:
            notes = cls.__dict__.get("__annotations__") or cls.__annotations__  # noqa: RUF063
            out: list[tuple[Any, ...]] = []
            for name, note in notes.items():
                if name.startswith("_") or name.upper() == name:
                    continue
                default = cls.__dict__.get(name, _REQUIRED)
                if name in cls.NESTED:
                    parts = [p.strip() for p in note.split("|")]
                    many = parts[0].startswith("list")
                    out.append((name, list if many else _Object, None, "None" in parts, default))
                else:
                    out.append((name, *_parse(note), default))
            cls._fields = tuple(out)
        return cls._fields

    @property
    def extra(self) -> dict[str, Any]:
        """The keys this version does not know (``EXTRA = "keep"``), written back as read."""
        return self._extra

    def copy(self: _F) -> _F:
        """A shallow copy (``dataclasses.replace(x)``'s): its own extra keys and given set."""
        new = copy.copy(self)
        new.__dict__["_extra"] = dict(self._extra)
        new.__dict__["_given"] = set(self._given)
        return new

    def __setattr__(self, name: str, value: object) -> None:
        given = self.__dict__.get("_given")
        if given is not None:
            given.add(name)
        super().__setattr__(name, value)

    @classmethod
    def from_dict(cls: type[_F], data: object, source: str | None = None) -> _F:
        """The record ``data`` holds; ``RecordError`` naming ``source`` (else the file's name)
        and the key when it does not fit."""
        try:
            return cls._read(data)
        except RecordError as e:
            raise RecordError(f"{source or cls.FILE or cls.KIND}: {_reason(e)}") from None

    @classmethod
    def _read(cls: type[_F], data: object) -> _F:
        if not isinstance(data, dict):
            raise RecordError(f"{cls.KIND}: not a JSON object")
        schema = data.get("schema", 1)
        if schema != cls.SCHEMA:
            raise RecordError(
                f"{cls.KIND}: schema is {schema!r}, not {cls.SCHEMA} (a newer fleetctl's file?)"
            )
        names = {f[0] for f in cls.fields()}
        extra = {k: v for k, v in data.items() if k not in names and k != "schema"}
        if extra and cls.EXTRA == "refuse":
            raise RecordError(f"{cls.KIND}: unknown key(s) {', '.join(sorted(extra))}")
        record = cls(**{k: v for k, v in data.items() if k in names})
        for name, item in cls.NESTED.items():
            setattr(record, name, _nested(cls.KIND, name, getattr(record, name), item))
        if cls.EXTRA == "keep":
            record._extra = extra
        return record

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.SCHEMA == 1 else {"schema": self.SCHEMA}
        for name, *_ in self.fields():
            value = getattr(self, name)
            if value is None and name in self.OMIT and name not in self._given:
                continue
            out[name] = _plain(value) if name in self.NESTED else value
        out.update(self._extra)
        return out


class _ObjectType(type):
    """``isinstance(v, _Object)``: a JSON object, or the record made of one."""

    def __instancecheck__(cls, value: object) -> bool:
        return isinstance(value, (dict, Record))


class _Object(metaclass=_ObjectType):
    """A nested record's field type as the base checks it (named ``dict`` in its errors)."""


_Object.__name__ = "dict"


def _reason(e: RecordError) -> str:
    """The error without its ``<kind>: `` head (the file's name replaces it)."""
    return str(e).split(": ", 1)[-1]


def _nested(kind: str, name: str, value: Any, item: type[FileRecord]) -> Any:
    """``value`` (a list or an object, as the field's type let through) with its records read."""
    if isinstance(value, list):
        return [_item(kind, f"{name}[{i}]", v, item) for i, v in enumerate(value)]
    return None if value is None else _item(kind, name, value, item)


def _item(kind: str, where: str, value: Any, item: type[FileRecord]) -> FileRecord:
    try:
        return item._read(value)
    except RecordError as e:
        reason = _reason(e)
        whole = reason.startswith(("not a JSON object", "unknown key", "schema is"))
        raise RecordError(f"{kind}: {where}{': ' if whole else '.'}{reason}") from None


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ------------------------------------------------------------------------------ the files


class ControllerRecord(FileRecord):
    """``controller.json``: the ``fleetctl run`` that created the folder (``controller.identity``),
    so ``fleetctl status`` can tell a job whose controller is gone."""

    FILE = KIND = "controller.json"
    pid: int
    start_time: int | None = None  # /proc start time (clock ticks since boot)
    boot_id: str | None = None
    host: str | None = None


class RankEntry(FileRecord):
    """One global rank in ``ranks.json`` (``job.diagnose.ranks.rank_map``'s entry)."""

    KIND = "rank"
    OMIT = ("pids",)
    rank: int
    node: str
    node_rank: int
    local_rank: int
    pid: int | None = None  # the rank's process as its supervisor saw it (None: ended first)
    logs: list[str] = []  # noqa: RUF012 (Record copies it): relative to the run folder
    pids: list[int] | None = None  # every process it had, when its launcher restarted it


class RanksRecord(FileRecord):
    """``ranks.json``: global rank -> node, node rank, local rank, pid, its log files."""

    FILE = KIND = "ranks.json"
    NESTED = {"ranks": RankEntry}  # noqa: RUF012
    ranks: list = []  # noqa: RUF012


class SlurmRecord(FileRecord):
    """``slurm.json`` (``run --slurm``): the Slurm job (None until sbatch answered), its last
    state as seen, what was asked for, where the script, its output and the job file are
    (``private``: on the batch host, ``--slurm-no-shared-fs``)."""

    FILE = KIND = "slurm.json"
    OMIT = ("private", "inside_folder", "job_file", "reason", "nodelist")
    job_id: str | None = None
    state: str | None = None  # SUBMITTING, then Slurm's (PENDING, RUNNING, …, CANCELLED)
    nodes: int | None = None
    partition: str | None = None
    gres: str | None = None
    time: str | None = None
    account: str | None = None
    script: str = "sbatch.sh"
    output: str | None = None
    error: str | None = None
    detached: bool = False
    private: bool | None = None
    inside_folder: str | None = None
    job_file: str | None = None  # relative to the run folder, or (private) where it is
    reason: str | None = None  # why Slurm keeps it pending (as last seen)
    nodelist: str | None = None  # Slurm's NodeList


class ConnectNode(FileRecord):
    """One node in ``connect.json``: its inventory fields (no env values, no secrets), then
    what its transport keeps to reach it again (``reach_fields``: e.g. ``slurm_job``), kept as
    extra keys — each transport owns its own."""

    KIND = "node"
    name: str
    address: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    nic: str | None = None
    train_addr: str | None = None
    gpus: int | None = None
    workdir: str = "~/.fleetctl"
    python: str = "python3"
    known_hosts: str | None = None
    ssh_config: str | None = None
    proxy_jump: str | None = None
    shell_type: str | None = None
    local: bool = False
    groups: list[str] = []  # noqa: RUF012 (Record copies it)

    @property
    def reach(self) -> dict[str, Any]:
        """The transport's keys (``transport.connection.reached_vars`` reads them)."""
        return dict(self._extra)


class ConnectRecord(FileRecord):
    """``connect.json``: how ``status``/``logs``/``stop``/``collect`` reach the job's nodes
    again, and what collecting brings home (``collect``: the run's cap and excludes)."""

    FILE = KIND = "connect.json"
    NESTED = {"nodes": ConnectNode}  # noqa: RUF012
    inventory: str | None = None  # absolute
    limit: str | None = None
    collect: dict | None = None  # CollectOptions.to_dict
    nodes: list = []  # noqa: RUF012


class CheckHost(FileRecord):
    """One host's row of ``check.json``: every check's cell (name -> status, detail)."""

    KIND = "host"
    host: str
    label: str = ""
    ok: bool = True
    checks: dict = {}  # noqa: RUF012 (Record copies it): name -> {"status", "detail"}


class CheckRecord(FileRecord):
    """``check.json``: the check's table as the run saw it (``CheckReport.to_dict``'s table
    keys: every host's cells, the failures, the pairs that could not talk), passing or not."""

    FILE = KIND = "check.json"
    NESTED = {"hosts": CheckHost}  # noqa: RUF012
    ok: bool = True
    summary: str = ""
    checks: list[str] = []  # noqa: RUF012 (the columns, in order)
    hosts: list = []  # noqa: RUF012
    failures: list[dict] = []  # noqa: RUF012 ({"host", "check", "reason"})
    mesh_failures: list[dict] = []  # noqa: RUF012 ({"src", "dst", "problems", "text"})
    warnings: list[str] = []  # noqa: RUF012


class CollectiveLink(FileRecord):
    """One measured link of ``collective.json``: its bus bandwidth in GB/s."""

    KIND = "link"
    src: str
    dst: str
    busbw: float


class CollectiveFailure(FileRecord):
    """A host the collective judged slow, hung or failing, and why."""

    KIND = "failure"
    host: str
    reason: str = ""


class CollectiveRecord(FileRecord):
    """``collective.json`` (``--collective``): per node, per link, the all-reduce and the
    verdict (``CollectiveReport.to_dict``)."""

    FILE = KIND = "collective.json"
    NESTED = {"links": CollectiveLink, "failures": CollectiveFailure}  # noqa: RUF012
    ok: bool = True
    nodes: dict = {}  # noqa: RUF012 (Record copies it): host -> its figures
    links: list = []  # noqa: RUF012
    allreduce: dict = {}  # noqa: RUF012
    median_link_busbw: float = 0.0
    threshold_busbw: float = 0.0
    failures: list = []  # noqa: RUF012
    hung: dict[str, str] = {}  # noqa: RUF012 (host -> its stacks, may be "")
    elapsed: float = 0.0


class RoleTask(FileRecord):
    """One task of ``roles.json``: its global rank, role and index in it, host and ports."""

    KIND = "task"
    rank: int
    role: str
    index: int
    host: str
    ports: dict[str, list] = {}  # noqa: RUF012 (Record copies it): label -> port numbers


class RolesRecord(FileRecord):
    """``roles.json``: a role job's layout: the job file as parsed (``JobFile.to_dict``, its
    own shape) and every task's ports."""

    FILE = KIND = "roles.json"
    NESTED = {"tasks": RoleTask}  # noqa: RUF012
    job_file: dict = {}  # noqa: RUF012
    tasks: list = []  # noqa: RUF012

    @classmethod
    def of(cls, layout: RoleLayout) -> RolesRecord:
        """The record of a role plan's layout (``fleetctl.plan.roles.RoleLayout``)."""
        tasks = [
            RoleTask(
                rank=t.rank,
                role=t.role,
                index=t.index,
                host=t.node.name,
                ports=layout.ports.get((t.role, t.index), {}),
            )
            for t in layout.tasks
        ]
        return cls(job_file=layout.job.to_dict(), tasks=tasks)
