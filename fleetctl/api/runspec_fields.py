"""The machinery of ``RunSpec``'s fields (:mod:`fleetctl.api.runspec`): :func:`option` (a
field and its option's metadata), the one-line refusal the command prints for a bad value, and
:class:`_Group` (a group that checks its fields when made). Apart from the groups so the record
module stays one screen of options; pure (no click), as :mod:`fleetctl.api.checks`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import field, fields, replace
from typing import Any

from fleetctl.api import checks as c
from fleetctl.errors import UsageError


def option(
    default: Any,
    *flags: str,
    help: str = "",
    check: Callable[[Any], Any] | None = None,
    param: str | None = None,
    kw: str | None = None,
    metavar: str | None = None,
    show_default: bool = False,
    cli: str | None = None,
    type_name: str | None = None,
    record: Callable[[], type] | None = None,
    subs: tuple[Any, ...] = (),
) -> Any:
    """A record field and its option: ``flags`` (``--timeout``; none: library only), the
    click parameter's ``param`` name and the library keyword ``kw`` (both default to the
    field's name), the ``check`` every value passes (``None`` passes unchecked where the
    default is ``None``; a tuple field's items are checked one by one); ``record``: the class
    of a value that is a record of its own (for the JSON form, :mod:`.runspec_json`), ``subs``
    the flags that make it (:mod:`.runspec_collective`; ``flags`` then names the field)."""
    meta: dict[str, Any] = {"flags": flags, "help": help, "check": check, "param": param, "kw": kw}
    meta.update(metavar=metavar, show_default=show_default, cli=cli, type_name=type_name)
    meta.update(record=record, subs=subs)
    return field(default=default, metadata=meta)


def hint(f: Any) -> str:
    """How a message names the field: its flags as click names an option's
    (``'--code-dir' / '--code'``), else its keyword."""
    flags = f.metadata.get("flags") or (keyword(f),)
    return " / ".join(f"'{x}'" for x in flags)


def keyword(f: Any) -> str:
    name: str = f.metadata.get("kw") or f.name
    return name


def refuse(f: Any, message: str) -> UsageError:
    """The one-line error the command prints for this field (click's ``BadParameter`` form)."""
    return UsageError(f"Invalid value for {hint(f)}: {message}")


def _check_field(f: Any, value: Any) -> Any:
    check = f.metadata.get("check")
    if value is None and f.default is None:
        return None
    try:
        if isinstance(f.default, tuple):  # a repeatable option: each item
            if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
                raise c.Invalid(f"{value!r} is not a list of values")
            return tuple(check(v) if check else v for v in value)
        if isinstance(f.default, bool):
            if not isinstance(value, bool):
                raise c.Invalid(f"{value!r} is not True or False")
            return value
        return check(value) if check else value
    except c.Invalid as e:
        raise refuse(f, str(e)) from None


class _Group:
    """A group of the record: checks (and normalizes) its fields when made."""

    TITLE = ""

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            checked = _check_field(f, value)
            if checked is not value:
                object.__setattr__(self, f.name, checked)

    def filled(self, source: object) -> Any:
        """A copy whose unset (None) fields take ``source``'s attribute of the same name
        (a role job file's ``timeout:``, …: the command line wins), checked again."""
        found = {f.name: getattr(source, f.name, None) for f in fields(self)}  # type: ignore[arg-type]
        unset = {k: v for k, v in found.items() if v is not None and getattr(self, k) is None}
        return replace(self, **unset) if unset else self  # type: ignore[type-var]

    def argv(self, only: Sequence[str] = ()) -> list[str]:
        """The fields (``only`` these) that differ from their defaults as the command's
        options (``--stall-timeout 60.0``, ``--no-report``): how a detached job's monitor
        process is told the run's settings."""
        out: list[str] = []
        for f in fields(self):  # type: ignore[arg-type]
            value, flags = getattr(self, f.name), f.metadata.get("flags")
            if not flags or (only and f.name not in only) or value is None or value == f.default:
                continue
            if isinstance(value, bool):
                out.append(flags[0])  # --no-x given for a False, --x for a True
            elif isinstance(value, tuple):
                out += [x for v in value for x in (flags[0], str(v))]
            else:
                out += [flags[0], repr(float(value)) if isinstance(value, float) else str(value)]
        return out
