"""The sub-options of ``RunSpec``'s two record-valued fields: ``collect`` (``--collect-max``,
``--collect-exclude``) and ``collective`` (``--collective`` and its ``--collective-*`` knobs).

One definition per flag (:class:`Sub`: flag, record attribute, default, help, check, unit), from
which ``cli/options.py`` generates the options of ``fleetctl run`` and ``fleetctl check`` (and
``collect``/``monitor``'s ``--collect-*``), and against which the record checks a
``CollectiveOptions`` the library was handed: a bound is refused with the line the command
prints for the flag (``Invalid value for '--collective-size': …``, ``UsageError``, exit 2).

Pure and cheap to import (no click), as :mod:`fleetctl.api.checks`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.api import checks as c
from fleetctl.errors import UsageError

MiB = 1 << 20


@dataclass(frozen=True)
class Sub:
    """One flag of a record-valued field: ``attr`` is the record's attribute it sets (None: the
    switch that asks for the record at all, ``--collective``); the flag's value times ``scale``
    is the attribute's (``--collective-size`` in MiB, ``size`` in bytes); ``check``: the flag's
    bounds, in the flag's unit; ``text``: the command takes the flag as text and parses it
    itself (``--collect-max 2G``), the check then holds the record's attribute."""

    flag: str
    attr: str | None
    default: Any
    help: str
    check: c.Number | None = None
    scale: int = 1
    show_default: bool = False
    metavar: str | None = None
    multiple: bool = False
    text: bool = False
    key: str | None = None  # its key in a role job file's ``collective:`` mapping

    @property
    def param(self) -> str:
        """The click parameter's name (``collective_size``)."""
        return self.flag[2:].replace("-", "_")

    def refuse(self, message: str) -> UsageError:
        """The one line the command prints for a bad value of this flag."""
        return UsageError(f"Invalid value for '{self.flag}': {message}")

    def attribute(self, value: Any) -> Any:
        """The record's attribute for the flag's (checked) value."""
        if value is None or self.scale == 1:
            return value
        return math.ceil(value * self.scale)  # up: the flag's lower bound holds in bytes too

    def check_record(self, record: Any) -> None:
        """The record's attribute held to the flag's bounds, in the flag's unit."""
        if self.attr is None or self.check is None:
            return
        value = getattr(record, self.attr)
        if value is None and self.default is None:
            return
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        try:
            self.check(value / self.scale if number and self.scale != 1 else value)
        except c.Invalid as e:
            raise self.refuse(str(e)) from None


COLLECTIVE: tuple[Sub, ...] = (
    Sub(
        "--collective", None, False,
        "After the check, benchmark torch.distributed over the training NICs (nccl on GPUs, "
        "gloo otherwise): an all-reduce across all hosts and send/recv between pairs; a slow "
        "or hung host or link fails the check.",
    ),
    Sub(
        "--collective-size", "size", 32.0, "MiB per all-reduce and per send/recv.",
        c.Number(min=0.001, max=1 << 16), scale=MiB, show_default=True, key="size_mib",
    ),
    Sub(
        "--collective-min", "min_fraction", 0.5,
        "A host or link below this fraction of the fleet's median link busbw fails.",
        c.Number(min=0, max=1), show_default=True, key="min",
    ),
    Sub(
        "--collective-floor", "floor", None,
        "GB/s busbw every host, link and the fleet all-reduce must reach (off unless given).",
        c.Number(min=0, max=1 << 20), key="floor",
    ),
    Sub(
        "--collective-timeout", "timeout", 120.0,
        "Seconds the benchmark may take on a node; past it the host is named hung, with its "
        "stacks.",
        c.seconds(1, 3600), show_default=True, key="timeout",
    ),
)  # fmt: skip

#: a role job file's ``collective:`` mapping: its keys, each one flag's
FILE_KEYS: dict[str, Sub] = {s.key: s for s in COLLECTIVE if s.key}

COLLECT: tuple[Sub, ...] = (
    Sub(
        "--collect-max", "max_bytes", None,
        "Bytes per node to bring home (e.g. 500M, 2G, unlimited; default 256M). Logs go first; "
        "bigger files beyond it are listed in job.json as over the cap.",
        c.count(0, None), metavar="SIZE", text=True,
    ),
    Sub(
        "--collect-exclude", "exclude", (),
        "Leave files matching GLOB (path in the run folder, or file name) on the nodes; they "
        "are listed in job.json as excluded. Repeatable.",
        metavar="GLOB", multiple=True,
    ),
)  # fmt: skip


def collective_record(values: dict[str, Any]) -> Any:
    """``CollectiveOptions`` of the flags' values by parameter name (None: ``--collective``
    not given)."""
    if not values[COLLECTIVE[0].param]:
        return None
    from fleetctl.plan.collective import CollectiveOptions

    kw = {s.attr: s.attribute(values[s.param]) for s in COLLECTIVE if s.attr}
    return CollectiveOptions(**kw)


def collective_of_file(value: Any, where: Callable[[Any], str]) -> Any:
    """A role job file's ``collective:`` (``run --collective`` from the file): ``true`` for
    the defaults, ``false`` or absent for none, or a mapping of :data:`FILE_KEYS` (``size_mib:
    4``), each held to its flag's bounds. ``where(key)``: ``FILE:LINE`` of a key (None: of
    ``collective:``); UsageError (exit 2), one line naming it."""
    if value is None or value is False:
        return None
    values: dict[str, Any] = {s.param: s.default for s in COLLECTIVE}
    values[COLLECTIVE[0].param] = True
    if value is not True:
        known = ", ".join(FILE_KEYS)
        if not isinstance(value, Mapping):
            raise UsageError(
                f"{where(None)}: collective must be true, false or a mapping of {known}"
            )
        for key, v in value.items():
            sub = FILE_KEYS.get(key)
            if sub is None:
                raise UsageError(f"{where(key)}: unknown key {key!r} (known: {known})")
            assert sub.check is not None
            try:
                values[sub.param] = sub.check(v)
            except c.Invalid as e:
                why = str(e).rstrip(".")
                raise UsageError(f"{where(key)}: collective {key}: {why} ({sub.flag})") from None
    return collective_record(values)


def collective_options(value: Any) -> Any:
    """``RunSpec``'s ``collective``: a ``CollectiveOptions`` within its flags' bounds."""
    from fleetctl.plan.collective import CollectiveOptions

    if not isinstance(value, CollectiveOptions):
        raise c.Invalid(f"{value!r} is not a CollectiveOptions")
    for sub in COLLECTIVE:
        sub.check_record(value)
    return value


def collect_options(value: Any) -> Any:
    """``RunSpec``'s ``collect``: a ``CollectOptions`` with a cap of 0 or more bytes."""
    from fleetctl.phases.collect import CollectOptions

    if not isinstance(value, CollectOptions):
        raise c.Invalid(f"{value!r} is not a CollectOptions")
    for sub in COLLECT:
        sub.check_record(value)
    return value


def collective_cls() -> type:
    """The record class of ``RunSpec``'s ``collective`` (its JSON form)."""
    from fleetctl.plan.collective import CollectiveOptions

    return CollectiveOptions


def collect_cls() -> type:
    """The record class of ``RunSpec``'s ``collect`` (its JSON form)."""
    from fleetctl.phases.collect import CollectOptions

    return CollectOptions
