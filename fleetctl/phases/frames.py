"""The one decoder for what node programs say: one line per message, ``<tag> <payload>``.

Every program in ``fleetctl/remote/`` writes the same framing to its stdout: a one-letter tag,
a space, the payload (raw text for output lines and notices, JSON otherwise), a newline. Lines
that are not frames of the program at hand (a chatty ``.bashrc``, a library printing on import)
are kept as noise (kind ``?``), never dropped and never mistaken for data.

The tags each program speaks are listed in docs/architecture.md ("The node supervisor
protocol"); the sets below name them for the readers here.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.transport.connection import Stream

#: The supervisor's ``run`` mode (and the loader in front of it).
SUPERVISOR_KINDS = frozenset("RUSLCHEFQXPWA")
#: Bytes of one output line kept for the live view; a longer line is shown cut with a marker
#: (the node's console.log, and so the collected one, keeps it whole).
MAX_VIEW_LINE = 1 << 20
#: One-shot answers: ``D <json>`` (data), ``E <text>`` (notice), ``L <text>`` (a log line).
ANSWER_KINDS = frozenset("DEL")
#: The check probe: ``D`` facts, ``R`` mesh listener port, ``N`` no listener (why), ``M`` mesh
#: result, ``V`` the node's python is too old (its version).
PROBE_KINDS = frozenset("DRNMV")
#: The push helper: ``D`` its answer, ``A`` where its peer server listens.
PUSH_KINDS = frozenset("DA")
#: remote/programs/stacks.py: K one process's dump, D the totals.
STACK_KINDS = frozenset("KD")
#: ``logs``: the loader's ``U``, then log lines and notices.
FOLLOW_KINDS = frozenset("ULE")


@dataclass(frozen=True)
class Frame:
    """One line from a node program. ``kind`` ``?`` = noise (not a frame of this program)."""

    kind: str
    payload: bytes = b""

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8", errors="replace")

    def data(self) -> Any:
        """The JSON payload; ValueError when it is not JSON (then the line was noise)."""
        return json.loads(self.payload)


def parse_frame(line: bytes, kinds: Collection[str] = SUPERVISOR_KINDS) -> Frame:
    """A line without its newline -> Frame. Unknown shapes are kept as noise, never dropped."""
    line = line.rstrip(b"\r")
    if line and chr(line[0]) in kinds and (len(line) == 1 or line[1:2] == b" "):
        return Frame(chr(line[0]), line[2:])
    return Frame("?", line)


def parse_block(block: bytes, kinds: Collection[str] = SUPERVISOR_KINDS) -> list[Frame]:
    """Whole lines (newline-separated, no final newline) -> frames, consecutive ``L`` lines
    merged into one ``L`` frame whose payload holds them joined by newlines.

    A job printing fast sends blocks of nothing but ``L`` lines: those are recognised and
    unwrapped with a few C-level bytes operations instead of one Frame per line.
    """
    if (
        block.startswith(b"L ")
        and b"\r" not in block
        and block.count(b"\n") == block.count(b"\nL ")
    ):
        return [Frame("L", block[2:].replace(b"\nL ", b"\n"))]
    frames: list[Frame] = []
    run: list[bytes] = []
    for line in block.split(b"\n"):
        fr = parse_frame(line, kinds)
        if fr.kind == "L":
            run.append(fr.payload)
            continue
        if run:
            frames.append(Frame("L", b"\n".join(run)))
            run = []
        frames.append(fr)
    if run:
        frames.append(Frame("L", b"\n".join(run)))
    return frames


class FrameReader:
    """Split a byte stream into frames; a partial line waits for the rest, never split.

    ``batch_lines``: consecutive ``L`` lines come as one frame (see :func:`parse_block`); the
    watcher uses it once the job runs, the start-up handshake reads frame by frame.
    """

    def __init__(
        self, *, batch_lines: bool = False, kinds: Collection[str] = SUPERVISOR_KINDS
    ) -> None:
        self._buf = b""
        self.batch_lines = batch_lines
        self.kinds = kinds

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        end = self._buf.rfind(b"\n")
        if end < 0:
            return []
        block, self._buf = self._buf[:end], self._buf[end + 1 :]
        if self.batch_lines:
            return parse_block(block, self.kinds)
        return [parse_frame(line, self.kinds) for line in block.split(b"\n")]

    def flush(self) -> list[Frame]:
        """At end of stream: the unterminated tail, if any."""
        rest, self._buf = self._buf, b""
        return [parse_frame(rest, self.kinds)] if rest else []


class LineJoiner:
    """One output line from its ``C`` pieces and its ending ``L`` frame, in bounded memory.

    The supervisor reads the job's output at most 64 KiB at a time; a longer line arrives as
    ``C`` frames then its ``L``. The first ``max_view`` bytes are kept, the rest only counted:
    the line is shown whole up to that, else cut with a marker saying how long it was.
    """

    def __init__(self, max_view: int = MAX_VIEW_LINE) -> None:
        self.max_view = max_view
        self.buf = bytearray()
        self.total = 0
        self.active = False

    def piece(self, payload: bytes) -> None:
        self.active = True
        self.total += len(payload)
        room = self.max_view - len(self.buf)
        if room > 0:
            self.buf += payload[:room]

    def finish(self, last: bytes = b"") -> str:
        """The whole line (``last``: its final piece), or its head and the cut marker."""
        self.piece(last)
        text = bytes(self.buf).decode("utf-8", errors="replace")
        if self.total > len(self.buf):
            text += f" … [line cut at {len(self.buf)} of {self.total} bytes; whole in console.log]"
        self.buf, self.total, self.active = bytearray(), 0, False
        return text


def decode(output: str | bytes, kinds: Collection[str] = ANSWER_KINDS) -> list[Frame]:
    """The frames of a finished command's whole output, in order."""
    data = output.encode("utf-8", "surrogateescape") if isinstance(output, str) else output
    return [parse_frame(line, kinds) for line in data.split(b"\n") if line.strip()]


def last_data(output: str | bytes, kind: str = "D") -> Any:
    """The JSON payload of the last ``kind`` frame that parses, None when there is none."""
    for fr in reversed(decode(output, {kind})):
        if fr.kind == kind:
            try:
                return fr.data()
            except ValueError:
                continue
    return None


class FrameStream:
    """Frames from a live :class:`Stream`, each wait bounded by a deadline.

    Untagged lines, and frames of a JSON kind whose payload is not JSON, are noise: the last
    few are kept for error messages (:attr:`tail`).
    """

    def __init__(
        self, stream: Stream, kinds: Collection[str], *, json_kinds: Iterable[str] = ()
    ) -> None:
        self.stream = stream
        self.reader = FrameReader(kinds=kinds)
        self.json_kinds = frozenset(json_kinds)
        self.pending: deque[Frame] = deque()
        self.noise: list[str] = []
        self.eof = False

    def next(self, wanted: Collection[str], deadline: float) -> Frame | None:
        """The next frame of a ``wanted`` kind (others are skipped); None at EOF or deadline."""
        while True:
            while self.pending:
                fr = self.pending.popleft()
                if fr.kind in self.json_kinds and not _is_json(fr.payload):
                    fr = Frame("?", fr.kind.encode() + b" " + fr.payload)
                if fr.kind == "?":
                    if fr.payload.strip():
                        self.noise = [*self.noise[-19:], fr.text]
                    continue
                if fr.kind in wanted:
                    return fr
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            chunk = self.stream.recv(min(left, 0.5))
            if chunk == b"":
                self.eof = True
                self.pending.extend(self.reader.flush())
            elif chunk:
                self.pending.extend(self.reader.feed(chunk))

    @property
    def tail(self) -> str:
        return "\n".join(self.noise[-5:])


def _is_json(payload: bytes) -> bool:
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True
