"""Host patterns that select hosts: ``--limit`` and the ranked group (names, globs,
``~regex``, ``&``, ``!``, subscripts, ``@file``)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from functools import partial

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory.model import _group_hosts, _Host, _Model
from fleetctl.plan.inventory.ranges import _parse_address
from fleetctl.plan.userinput import read_user_file


def _split_host_pattern(pattern: str) -> list[str]:
    """Ansible's split_host_pattern: commas; else colons unless it is one host[:port]/IPv6."""
    if "," in pattern:
        parts = pattern.split(",")
    elif _parse_address(pattern.strip()) is not None:
        parts = [pattern]
    else:
        parts = re.findall(r"(?:[^\s:\[\]]|\[[^\]]*\])+", pattern)
    return [p.strip() for p in parts if p.strip()]


def _limit_file_error(part: str, path: str, msg: str) -> InventoryError:
    return InventoryError(f"--limit {part}: {msg}", path=path, field="limit")


def _split_limit(limit: str, path: str) -> list[str]:
    if limit.count("[") != limit.count("]"):
        # Ansible's splitter silently drops an unbalanced bracket: `~[` became `~`, a regex
        # that selects every host. A typo must never widen the selection.
        raise InventoryError(f"--limit {limit!r}: unbalanced '[' or ']'", path=path, field="limit")
    out: list[str] = []
    for part in _split_host_pattern(limit):
        if part.startswith("@"):
            raw = read_user_file(
                part[1:],
                "limit file",
                partial(_limit_file_error, part, path),
            )
            lines = raw.decode("utf-8", "replace").splitlines()
            out.extend(s.strip() for s in lines if s.strip())
        else:
            out.append(part)
    return out


_SUBSCRIPT_RE = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")


def _evaluate(model: _Model, patterns: list[str], what: str) -> list[_Host]:
    """Ansible's _evaluate_patterns: unions in order, then ``&`` intersections, then ``!``."""
    regular = [p for p in patterns if p and p[0] not in "!&"]
    inter = [p for p in patterns if p and p[0] == "&"]
    exclude = [p for p in patterns if p and p[0] == "!"]
    if not regular:
        regular = ["all"]
    hosts: list[_Host] = []
    for p in regular + inter + exclude:
        if p in model.hosts:
            if p not in {h.name for h in hosts}:
                hosts.append(model.hosts[p])
            continue
        that = _match_one(model, p, what)
        if p[0] == "!":
            names = {h.name for h in that}
            hosts = [h for h in hosts if h.name not in names]
        elif p[0] == "&":
            names = {h.name for h in that}
            hosts = [h for h in hosts if h.name in names]
        else:
            if not that:
                raise InventoryError(
                    f"{what} pattern {p!r} matches no hosts "
                    f"(hosts: {_preview(model.hosts)}; groups: {_preview(model.groups)})",
                    path=model.path,
                    field="limit" if what == "--limit" else "group",
                )
            have = {h.name for h in hosts}
            for h in that:
                if h.name not in have:
                    have.add(h.name)
                    hosts.append(h)
    return hosts


def _match_one(model: _Model, pattern: str, what: str) -> list[_Host]:
    if pattern[0] in "!&":
        pattern = pattern[1:]
    if not pattern:
        raise InventoryError(
            f"{what}: empty pattern after '!' or '&'", path=model.path, field="limit"
        )
    if pattern == "~":
        raise InventoryError(
            f"{what}: '~' needs a regular expression after it", path=model.path, field="limit"
        )
    subscript: tuple[int, int | None] | None = None
    if pattern[0] != "~":
        m = _SUBSCRIPT_RE.match(pattern)
        if m:  # `group[0]`, `group[1:3]`, `group[2:]` (inclusive, like Ansible)
            pattern, idx, start, _sep, end = m.groups()
            subscript = (int(idx), None) if idx else (int(start), int(end) if end else -1)
    try:
        rx = (
            re.compile(pattern[1:]) if pattern[0] == "~" else re.compile(fnmatch.translate(pattern))
        )
    except re.error as e:
        raise InventoryError(
            f"{what}: invalid pattern {pattern!r}: {e}", path=model.path, field="limit"
        ) from e
    results: list[_Host] = []
    groups = [g for name, g in model.groups.items() if rx.match(name)]
    for g in groups:
        results.extend(_group_hosts(g))
    if not groups or pattern[0] == "~" or any(c in pattern for c in ".?*["):
        results.extend(h for name, h in model.hosts.items() if rx.match(name))
    if subscript and results:  # Ansible subscripts the raw matches, then de-duplicates
        start_i, end_i = subscript
        if end_i:
            results = results[start_i : (len(results) - 1 if end_i == -1 else end_i) + 1]
        else:
            try:
                results = [results[start_i]]
            except IndexError as e:
                raise InventoryError(
                    f"{what}: subscript out of range in {pattern!r}", path=model.path, field="limit"
                ) from e
    unique: list[_Host] = []
    seen: set[str] = set()
    for h in results:
        if h.name not in seen:
            seen.add(h.name)
            unique.append(h)
    return unique


def _preview(names: Iterable[str], limit: int = 8) -> str:
    items = list(names)
    shown = ", ".join(items[:limit])
    return shown + (f", … ({len(items)} in all)" if len(items) > limit else "")
