"""``RunSpec`` as JSON data and back, losslessly: the form ``run --slurm`` ships to the run
inside the allocation (``run-spec.json``), so that no option travels as a command-line string.

Generic over the record's fields, so adding a run option adds it here without code: a value
is written as it is (a tuple as a list, a mapping as an object), and a field whose value is a
record of its own (``option(record=…)``: the collection and collective options) as that
record's fields. Reading goes through the record's own checks: a tampered or garbled value is
refused with the line the command prints for it (``UsageError``, exit 2); the caller names
the file. A value only a library call can hold (a ``before`` callable) cannot be written:
``UsageError`` saying so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from fleetctl.api.runspec import RunSpec

#: the JSON types a nested record's annotation allows (``int | None``, ``tuple[str, ...]``)
_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "str": (str,),
    "bool": (bool,),
    "None": (type(None),),
}


def to_dict(spec: RunSpec) -> dict[str, Any]:
    """``{group: {field: value}}`` for every field of every group (JSON types only)."""
    from fleetctl.api.runspec import GROUPS

    out: dict[str, Any] = {}
    for name in GROUPS:
        group = getattr(spec, name)
        out[name] = {f.name: _encode(f, getattr(group, f.name)) for f in dataclasses.fields(group)}
    return out


def _encode(f: Any, value: Any) -> Any:
    from fleetctl.api.runspec import hint

    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {g.name: _encode(g, getattr(value, g.name)) for g in dataclasses.fields(value)}
    if callable(value):
        raise UsageError(
            f"{hint(f)}: a Python callable ({getattr(value, '__name__', value)!r}) cannot be "
            "written to a run spec (run --slurm ships the run as JSON to the allocation); "
            "give a Fabric task as FILE:TASK"
        )
    raise UsageError(f"{hint(f)}: {value!r} cannot be written to a run spec")


def from_dict(data: Any) -> RunSpec:
    """The record ``data`` (:func:`to_dict`'s form) stands for, checked as ``RunSpec(...)``
    checks a library call's values; a group or field left out takes its default (a file of
    an older fleetctl), one this fleetctl does not know is refused."""
    from fleetctl.api.runspec import GROUPS, RunSpec

    if not isinstance(data, Mapping):
        raise UsageError("a run spec must be a JSON object of groups")
    unknown = sorted(set(data) - set(GROUPS))
    if unknown:
        raise UsageError(f"run spec: unknown group {unknown[0]!r}")
    groups: dict[str, Any] = {}
    for name, cls in GROUPS.items():
        values = data.get(name, {})
        if not isinstance(values, Mapping):
            raise UsageError(f"run spec: {name!r} must be a JSON object")
        by_name = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - set(by_name))
        if unknown:
            raise UsageError(f"run spec: unknown field {name}.{unknown[0]}")
        groups[name] = cls(**{k: _decode(by_name[k], v) for k, v in values.items()})
    return RunSpec(**groups)


def _decode(f: Any, value: Any) -> Any:
    """A field's value as the record takes it; its check (in the group's ``__post_init__``)
    does the rest."""
    from fleetctl.api.runspec import refuse

    record = f.metadata.get("record")
    if record is not None and value is not None:
        return _nested(f, record(), value)
    if isinstance(f.default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise refuse(f, f"{value!r} is not a list of strings")
        return tuple(value)
    return value


def _nested(f: Any, cls: type, value: Any) -> Any:
    """A record-valued field (``CollectOptions``, ``CollectiveOptions``) from its fields,
    each of the JSON type its annotation names."""
    from fleetctl.api.runspec import refuse

    if not isinstance(value, Mapping):
        raise refuse(f, f"{value!r} is not a JSON object")
    by_name = {g.name: g for g in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(by_name))
    if unknown:
        raise refuse(f, f"unknown key {unknown[0]!r}")
    kw: dict[str, Any] = {}
    for key, item in value.items():
        kind = str(by_name[key].type).replace(" ", "")
        if kind.startswith("tuple["):
            if not isinstance(item, list) or not all(isinstance(v, str) for v in item):
                raise refuse(f, f"{key}: {item!r} is not a list of strings")
            item = tuple(item)
        else:
            allowed = tuple(t for part in kind.split("|") for t in _TYPES.get(part, ()))
            if (isinstance(item, bool) and bool not in allowed) or not isinstance(item, allowed):
                raise refuse(f, f"{key}: {item!r} is not of type {kind}")
        kw[key] = item
    return cls(**kw)
