"""A node's stack dumps read: which process each is and where its main thread waits.

Understands both dump formats a node produces: py-spy's ``dump`` (``func (file:line)``,
innermost first) and faulthandler's (``File "file", line N in func``, most recent call first).
faulthandler's go to the job's console.log, several in one text: :func:`console_stacks` cuts
them apart by writer (a rank's lines come tagged ``[rank G]``, the launcher's do not), so the
launcher's own stacks never stand in for a rank's. Pure: text in, one :class:`RankStack` per
process and its frame out; ``phases/stacks.py`` fetches the dumps from the nodes and
``job/diagnose/stacks.py`` folds them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_PYSPY_THREAD = re.compile(r'^Thread (?:0x)?[0-9a-fA-F]+ .*?(?:"(?P<name>[^"]*)")?\s*$')
_PYSPY_FRAME = re.compile(r"^\s+(?P<func>\S.*?) \((?P<file>[^():]+):(?P<line>\d+)\)\s*$")
_FH_THREAD = re.compile(r"^(?P<current>Current thread|Thread) 0x[0-9a-fA-F]+")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_FH_START = re.compile(r"^Fatal Python error: ")
_RANK_TAG = re.compile(r"^\[rank (?P<rank>\d+)\] ?")


@dataclass(frozen=True)
class RankStack:
    """One process's dump: who (``rank`` None: not a rank, e.g. the launcher) and the text."""

    node: int
    rank: int | None
    text: str


def innermost_frame(text: str) -> str | None:
    """``func (file:line)`` of the main thread's innermost Python frame (None: no frame).

    The main thread is py-spy's ``"MainThread"`` or faulthandler's ``Current thread`` (the
    one that took the signal); failing that, the first thread listed.
    """
    first: str | None = None
    chosen: str | None = None
    in_main = False
    want_next = False
    for line in text.splitlines():
        m = _PYSPY_THREAD.match(line) or _FH_THREAD.match(line)
        if m:
            group = m.groupdict()
            in_main = group.get("name") == "MainThread" or group.get("current") == "Current thread"
            want_next = True
            continue
        f = _PYSPY_FRAME.match(line) or _FH_FRAME.match(line)
        if f and want_next:
            want_next = False
            frame = f"{f['func']} ({os.path.basename(f['file'])}:{f['line']})"
            first = first or frame
            if in_main and chosen is None:
                chosen = frame
    return chosen or first


def console_stacks(text: str, node: int, *, untagged_rank: int | None = None) -> list[RankStack]:
    """The faulthandler dumps in a node's console text, one :class:`RankStack` per writer:
    each ``[rank G]``-tagged rank, and the untagged output (the launcher; ``untagged_rank``
    when that is a rank's own, as with the plain launcher). A writer's last dump wins (the
    abort's, after any earlier ones)."""
    lines: dict[int | None, list[str]] = {}
    for line in text.splitlines():
        m = _RANK_TAG.match(line)
        rank = int(m["rank"]) if m else None
        lines.setdefault(rank, []).append(line[m.end() :] if m else line)
    out = []
    for rank, own in lines.items():
        dump = _last_dump(own)
        if dump is not None:
            who = untagged_rank if rank is None else rank
            out.append(RankStack(node, who, dump))
    return out


def _last_dump(lines: list[str]) -> str | None:
    """The last faulthandler dump in one writer's lines: from its ``Fatal Python error`` (or,
    without one, its first thread header) through the frames that follow."""
    start = None
    for i, line in enumerate(lines):
        if _FH_START.match(line) or (start is None and _FH_THREAD.match(line)):
            start = i
    if start is None:
        return None
    dump = lines[start:]
    return "\n".join(dump) if any(_FH_FRAME.match(x) for x in dump) else None
