"""Node sets: fold host names into clush/pdsh-style ranges (``node[1-3,5]``) and back.

Pure, for output: ``fleetctl exec`` prints identical output once under the folded set of the
nodes that produced it, so 32 hosts answering the same thing take one header, not 32.
Only the last run of digits in a name is folded (``rack1-node[01-04]``); zero padding is kept
(``gpu[08-10]`` stays two digits wide) and never mixed with unpadded numbers of another width.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LAST_NUMBER = re.compile(r"^(.*?)(\d+)(\D*)$")
_RANGE_SET = re.compile(r"\[([0-9,\-]+)\]")


def _split(name: str) -> tuple[str, str, str] | None:
    """``(prefix, digits, suffix)`` around the last number, or None when not foldable."""
    if any(c in name for c in "[],"):
        return None
    m = _LAST_NUMBER.match(name)
    return (m.group(1), m.group(2), m.group(3)) if m else None


def _width(digits: str) -> int:
    """Zero-padded numbers keep their width; ``0`` and unpadded numbers have none (0)."""
    return len(digits) if len(digits) > 1 and digits[0] == "0" else 0


def _runs(numbers: list[tuple[int, int]]) -> list[str]:
    """Sorted (value, width) pairs → range strings that ``expand`` turns back into the same names.

    A range's width is its first number's: 08,09,10 fold to ``08-10`` (10 is as wide), but 9,10
    fold to ``9-10`` and 099,100,1000 break before 1000.
    """
    out: list[str] = []

    def fits(start: tuple[int, int], cur: tuple[int, int]) -> bool:
        if start[1] == 0:
            return cur[1] == 0
        return cur[1] == start[1] or (cur[1] == 0 and len(str(cur[0])) == start[1])

    start = prev = numbers[0]
    for cur in numbers[1:]:
        if cur[0] == prev[0] + 1 and fits(start, cur):
            prev = cur
            continue
        out.append(_range(start, prev))
        start = prev = cur
    out.append(_range(start, prev))
    return out


def _range(a: tuple[int, int], b: tuple[int, int]) -> str:
    lo = str(a[0]).zfill(a[1])
    return lo if a == b else f"{lo}-{str(b[0]).zfill(a[1])}"


def fold(names: Iterable[str]) -> str:
    """Fold host names into a node set string, groups in order of first appearance.

    >>> fold(["node1", "node2", "node3", "node5", "login"])
    'node[1-3,5],login'
    """
    groups: dict[tuple[str, str], set[tuple[int, int]]] = {}
    order: list[tuple[str, str] | str] = []
    seen: set[str] = set()
    for name in names:
        if name in seen:
            continue
        seen.add(name)
        parts = _split(name)
        if parts is None:
            order.append(name)
            continue
        prefix, digits, suffix = parts
        key = (prefix, suffix)
        if key not in groups:
            groups[key] = set()
            order.append(key)
        groups[key].add((int(digits), _width(digits)))
    out: list[str] = []
    for item in order:
        if isinstance(item, str):
            out.append(item)
            continue
        prefix, suffix = item
        numbers = sorted(groups[item], key=lambda v: (v[0], -v[1]))
        runs = _runs(numbers)
        if len(runs) == 1 and "-" not in runs[0]:
            out.append(f"{prefix}{runs[0]}{suffix}")
        else:
            out.append(f"{prefix}[{','.join(runs)}]{suffix}")
    return ",".join(out)


def expand(nodeset: str) -> list[str]:
    """The names a node set stands for (``node[1-3],x`` → node1 node2 node3 x), in order.

    Accepts what ``fold`` writes: one bracket group per element. Raises ValueError otherwise.
    """
    names: list[str] = []
    for element in _top_level(nodeset):
        m = _RANGE_SET.search(element)
        if m is None:
            if "[" in element or "]" in element:
                raise ValueError(f"bad node set element {element!r}")
            names.append(element)
            continue
        prefix, suffix = element[: m.start()], element[m.end() :]
        if "[" in suffix or "]" in suffix or "[" in prefix:
            raise ValueError(f"only one [range] per element is supported: {element!r}")
        for part in m.group(1).split(","):
            lo, _, hi = part.partition("-")
            if not lo or (hi == "" and part.endswith("-")):
                raise ValueError(f"bad range {part!r} in {element!r}")
            width = len(lo) if len(lo) > 1 and lo[0] == "0" else 0
            a, b = int(lo), int(hi or lo)
            if b < a:
                raise ValueError(f"descending range {part!r} in {element!r}")
            names.extend(f"{prefix}{str(i).zfill(width)}{suffix}" for i in range(a, b + 1))
    return names


def _top_level(nodeset: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for c in nodeset:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {nodeset!r}")
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    if depth:
        raise ValueError(f"unbalanced '[' in {nodeset!r}")
    parts.append("".join(cur))
    return [p for p in parts if p]
