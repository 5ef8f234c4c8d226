"""Reading a run folder's files for the report, bounded: events.log's lines, a log's last
lines (at most TAIL_BYTES read, each line cut at LINE_CHARS), line counts, JSON objects that
may be missing or damaged (None, never an exception: a report shows what is there)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

LINE_CHARS = 240  # a longer log line is cut
TAIL_BYTES = 64 * 1024  # read at most this much of a log's end
COUNT_BYTES = 8 << 20  # lines counted in this much of a log, the rest estimated
_EVENT = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\dT[\d:.]+Z) (?P<kind>\S+)(?: \[(?P<rank>\d+) (?P<host>[^\]]+)\])?"
    r" ?(?P<text>.*)$"
)


def json_object(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def parse_time(text: str | None) -> float | None:
    """job.json's ISO-8601 UTC (``2026-11-28T22:51:47.953Z``) as seconds since the epoch."""
    from datetime import datetime, timezone

    if not text:
        return None
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def span_of(start: str | None, end: str | None) -> float | None:
    a, b = parse_time(start), parse_time(end)
    return round(b - a, 3) if a is not None and b is not None else None


class Event(NamedTuple):
    at: float
    kind: str
    rank: int | None
    host: str | None
    text: str


def read_events(path: Path) -> list[Event]:
    """events.log's lines (``<ISO> <kind> [<rank> <host>] <text>``); others are skipped."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        m = _EVENT.match(line)
        at = parse_time(m["at"]) if m else None
        if m and at is not None:
            rank = int(m["rank"]) if m["rank"] is not None else None
            out.append(Event(at, m["kind"], rank, m["host"], m["text"]))
    return out


def tail_lines(path: Path, n: int) -> tuple[list[str], int, bool]:
    """A log's last ``n`` lines (each cut at LINE_CHARS), its size, and whether it holds more."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            f.seek(max(0, size - TAIL_BYTES))
            data = f.read(TAIL_BYTES)
    except OSError:
        return [], 0, False
    lines = data.decode("utf-8", errors="replace").splitlines()
    if size > TAIL_BYTES and lines:
        lines = lines[1:]  # a partial first line
    cut = size > TAIL_BYTES or len(lines) > n
    return [cut_line(x) for x in lines[-n:]], size, cut


def cut_line(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " …"


def count_lines(path: Path, limit: int = COUNT_BYTES) -> int:
    """A log's lines: counted in its first ``limit`` bytes, scaled by its size beyond them (a
    rank's line rate needs no exact count, and a run's end must not read gigabytes)."""
    n = read = 0
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            while read < limit and (chunk := f.read(min(1 << 20, limit - read))):
                n += chunk.count(b"\n")
                read += len(chunk)
    except OSError:
        return 0
    return n if read >= size or read == 0 else round(n * size / read)
