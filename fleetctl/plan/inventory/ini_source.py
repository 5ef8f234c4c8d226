"""The INI inventory source (``[g]``, ``[g:vars]``, ``[g:children]``, inline ``host k=v``),
values typed like Ansible's INI plugin."""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from collections.abc import Iterable
from typing import Any

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory.model import _Model
from fleetctl.plan.inventory.ranges import _expand_hostpattern

_UNDECODABLE = re.compile("[\udc80-\udcff]")


def _check_utf8(lines: Iterable[str], path: str, first: int = 1) -> None:
    for lineno, line in enumerate(lines, start=first):
        if _UNDECODABLE.search(line):
            raise InventoryError("not valid UTF-8", path=path, line=lineno)


_SECTION_RE = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUPNAME_RE = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")


def _ini_value(text: str) -> Any:
    """Type a value the way Ansible's INI plugin does: a Python literal if it is one, else str.

    ``8`` -> 8, ``True`` -> True (``true``/``yes`` stay strings), ``"8"`` -> '8' (in
    ``:vars``; inline host vars lose one level of quotes to shell-style splitting first).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _ini_plain(value)


def _ini_plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, (list, tuple, set)):
        return [_ini_plain(v) for v in value]
    if isinstance(value, dict):
        return {_ini_plain(k): _ini_plain(v) for k, v in value.items()}
    if value is ... or isinstance(value, complex):
        return str(value) if value is not ... else "..."
    return value


def _parse_ini(text: str, path: str) -> _Model:
    model = _Model(path)
    pending: dict[str, dict[str, Any]] = {}
    group, state = "ungrouped", "hosts"

    def add_pending_children(name: str) -> None:
        for parent in pending[name]["parents"]:
            model.add_child(parent, name, pending[name]["line"])
            if parent in pending and pending[parent]["state"] == "children":
                add_pending_children(parent)
        del pending[name]

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        _check_utf8([line], path, first=lineno)
        m = _SECTION_RE.match(line)
        if m:
            group, state = m.group(1), m.group(2) or "hosts"
            if state not in ("hosts", "children", "vars"):
                raise model.error(f"section [{group}:{state}] has unknown type {state!r}", lineno)
            if group not in model.groups:
                if state == "vars" and group not in pending:
                    pending[group] = {"line": lineno, "state": state, "name": group}
                model.add_group(group, lineno)
            elif model.groups[group].line is None and group not in ("all", "ungrouped"):
                model.groups[group].line = lineno
            if group in pending and state != "vars":
                if pending[group]["state"] == "children":
                    add_pending_children(group)
                elif pending[group]["state"] == "vars":
                    del pending[group]
            continue
        if line.startswith("[") and line.endswith("]"):
            raise model.error(f"invalid section header {line!r} (no spaces allowed)", lineno)

        if state == "hosts":
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as e:
                raise model.error(f"cannot parse host line: {e}", lineno) from e
            if not tokens:
                continue
            pattern = tokens[0]
            if pattern.endswith(":") or pattern == "---":
                why = "'---' starts YAML, not INI" if pattern == "---" else "empty port after ':'"
                raise model.error(f"invalid host {pattern!r}: {why}", lineno, host=pattern)
            names, port = _expand_hostpattern(model, pattern, lineno)
            host_vars: dict[str, Any] = {}
            for tok in tokens[1:]:
                if "=" not in tok:
                    raise model.error(
                        f"host {pattern}: expected key=value, got {tok!r}", lineno, host=pattern
                    )
                k, v = tok.split("=", 1)
                host_vars[k] = _ini_value(v)
            for name in names:
                model.add_host(name, group, port, lineno)
                for k, v in host_vars.items():
                    model.set_host_var(name, k, v, lineno)
        elif state == "vars":
            if "=" not in line:
                raise model.error(f"[{group}:vars]: expected key=value, got {line!r}", lineno)
            k, v = (part.strip() for part in line.split("=", 1))
            model.set_group_var(group, k, _ini_value(v), lineno)
        else:
            m = _GROUPNAME_RE.match(line)
            if not m:
                raise model.error(
                    f"[{group}:children]: expected a group name, got {line!r}", lineno
                )
            child = m.group(1)
            if child not in model.groups:
                if child not in pending:
                    pending[child] = {
                        "line": lineno,
                        "state": "children",
                        "name": child,
                        "parents": [group],
                    }
                else:
                    pending[child].setdefault("parents", []).append(group)
            else:
                model.add_child(group, child, lineno)

    for decl in pending.values():
        if decl["state"] == "vars":
            raise model.error(
                f"section [{decl['name']}:vars] is for undefined group {decl['name']!r}",
                decl["line"],
            )
        raise model.error(
            f"section [{decl['parents'][-1]}:children] names undefined group {decl['name']!r}",
            decl["line"],
        )
    return model
