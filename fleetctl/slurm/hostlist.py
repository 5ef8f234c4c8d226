"""Slurm hostlist expressions (``gpu[01-04,07]``, ``a[1-2],b3``) expanded as ``scontrol show
hostnames`` does: order kept, duplicates kept, a range padded to its low bound's width, several
bracket groups in one name multiplied out. Pure; golden-tested against the real scontrol."""

from __future__ import annotations

import itertools
import re

from fleetctl.errors import UsageError

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand(expr: str) -> list[str]:
    """Every host name of ``expr`` in Slurm's order. Raises UsageError on a malformed list."""
    names: list[str] = []
    for item in _split(expr):
        names += _expand_one(item, expr)
    return names


def _split(expr: str) -> list[str]:
    """Top-level items: separated by commas or whitespace outside brackets."""
    items, cur, depth = [], "", 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise UsageError(f"invalid Slurm hostlist {expr!r}: unbalanced ']'")
        if depth == 0 and (ch == "," or ch.isspace()):
            if cur:
                items.append(cur)
            cur = ""
            continue
        cur += ch
    if depth:
        raise UsageError(f"invalid Slurm hostlist {expr!r}: unclosed '['")
    if cur:
        items.append(cur)
    return items


def _expand_one(item: str, expr: str) -> list[str]:
    parts = re.split(r"(\[[^\]]*\])", item)
    if "[" in item and parts[-1]:  # scontrol refuses text after the last bracket group
        raise UsageError(f"invalid Slurm hostlist {expr!r}: text after ']' in {item!r}")
    choices: list[list[str]] = []
    for part in parts:
        if part.startswith("["):
            choices.append(_ranges(part[1:-1], expr))
        elif part:
            choices.append([part])
    return ["".join(p) for p in itertools.product(*choices)]


def _ranges(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for r in body.split(","):
        m = _RANGE.match(r.strip())
        if not m:
            raise UsageError(f"invalid Slurm hostlist {expr!r}: bad range {r!r}")
        lo, hi = m.group(1), m.group(2)
        if hi is None:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise UsageError(f"invalid Slurm hostlist {expr!r}: range {r!r} runs backwards")
        out += [str(i).zfill(len(lo)) for i in range(int(lo), int(hi) + 1)]
    return out
