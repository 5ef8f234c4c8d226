"""The file that carries ``run --slurm``'s job to the run inside the allocation.

Why a file: an option's value on the batch script's command line (``--env-var=TOKEN=…``) is on
the batch node's process list for every user to read. The batch script runs ``fleetctl run
--spec FILE`` instead, and FILE (0600, in the 0700 run folder) holds the run: ``spec``, the
``RunSpec``'s JSON form (``fleetctl.api.runspec_json``, which checks it when it is read), and
``inside``, what the run inside needs beside it (:class:`Inside`). This module knows the
envelope alone, so the writer and the reader change together; one line of JSON::

    {"format": "fleetctl-run-spec/1", "spec": {"program": {...}, ...}, "inside": {...}}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from fleetctl.errors import UsageError

SPEC_FILE = "run-spec.json"  # in the run folder (without a shared filesystem: the batch host's)
FORMAT = "fleetctl-run-spec/1"


@dataclass(frozen=True)
class Inside:
    """What the run inside needs beside the run's record: where its run folder goes (the
    submitter's runs folder, or the batch host's private one), the inventory selection and
    how its hosts are reached, and how its lines are shown in ``slurm.out``."""

    runs_dir: str
    inventory: str | None = None
    limit: str | None = None
    known_hosts: str | None = None
    accept_new: bool = False
    connect_timeout: float = 10.0
    tail: str = "all"
    raw_output: bool = False

    @classmethod
    def from_dict(cls, data: Any) -> Inside:
        """UsageError (no file named: the reader adds it) for a key or a type it is not."""
        if not isinstance(data, Mapping):
            raise UsageError("'inside' must be a JSON object")
        by_name = {f.name: f for f in fields(cls)}
        for key, value in data.items():
            f = by_name.get(key)
            if f is None:
                raise UsageError(f"'inside': unknown key {key!r}")
            kind = str(f.type)
            if not _fits(kind, value):
                raise UsageError(f"'inside': {key} {value!r} is not a {kind}")
        if "runs_dir" not in data:
            raise UsageError("'inside': no runs_dir")
        return cls(**data)


def _fits(kind: str, value: Any) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "float":  # a timeout: positive and finite
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and math.isfinite(value) and value > 0
    return isinstance(value, str) or (kind == "str | None" and value is None)


def document(spec: Mapping[str, Any], inside: Inside) -> dict[str, Any]:
    """The file's content: the record's JSON form (``RunSpec.to_dict()``) and ``inside``."""
    return {"format": FORMAT, "spec": dict(spec), "inside": asdict(inside)}


def dumps(doc: Mapping[str, Any]) -> str:
    """One line of ASCII (no control character, no newline): safe in a shell here-document."""
    return json.dumps(doc, ensure_ascii=True, allow_nan=False)


def write(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """A new 0600 file (never through a link, never over another file)."""
    text = dumps(doc) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(text)


def loads(text: str, where: str) -> tuple[dict[str, Any], Inside]:
    """The record's JSON form (checked by its reader) and :class:`Inside` of a spec's text;
    UsageError naming ``where`` when it is not one."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"--spec {where}: not a fleetctl run spec ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise UsageError(f"--spec {where}: not a fleetctl run spec (format {FORMAT} expected)")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise UsageError(f"--spec {where}: 'spec' must be a JSON object")
    try:
        inside = Inside.from_dict(doc.get("inside"))
    except UsageError as e:
        raise UsageError(f"--spec {where}: {e}") from None
    return spec, inside


def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Inside]:
    """:func:`loads` of the file at ``path``; UsageError (one line) when it cannot be read."""
    where = os.fspath(path)
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--spec {where}: cannot read it ({e})") from None
    return loads(text, where)
