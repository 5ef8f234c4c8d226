"""Collect: bring every node's run folder home, as one tar stream per node over the open SSH.

``W/runs/<job>/`` (console.log, supervisor.json, the launcher's log folders: torchrun
``--log-dir``, paddle ``log/workerlog.N`` and ``log/<job>.<pod>.log``) lands in
``fleet-runs/<job>/<rank>-<host>/``. Runs after success, failure and Ctrl-C alike, and from
nodes whose job was killed. Remote names are never trusted: absolute paths, ``..``, links and
special files are refused, and nothing is written outside the node's folder.

Collection cannot lie: the node sends a manifest first (every file, its size and mtime, and
whether it is sent or why not: over the per-node cap, excluded, already home), then the small
files (supervisor record, console, launcher logs) before the big ones. Each file is written
under a temp name and renamed only when complete, with the node's mtime, so a broken transfer
leaves no truncated file, and a retry (or ``fleetctl collect``) asks only for what is not home
yet (same size and mtime).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import CollectError, ConnectError, FleetctlError, UsageError
from fleetctl.phases.launch import supervisor_command, supervisor_path
from fleetctl.phases.unpack import Unpacked, local_files, partial_files, unpack
from fleetctl.plan.names import node_folder_name
from fleetctl.remote.kit.wire import TAR_MARKER  # the same marker at both ends

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import Plan
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection, Stream

COLLECT_TIMEOUT = 60.0  # s without a byte from the node before a transfer counts as failed
COLLECT_ATTEMPTS = 3  # a failed transfer is retried, asking only for what is not home yet
DEFAULT_COLLECT_MAX = 256 << 20  # bytes per node: logs always fit, checkpoints usually do not
MIN_RATE = 1 << 20  # bytes/s a collection is allowed at worst, for the fan-out's outer bound
CONSOLE_LOG = "console.log"  # the node's own copy of the job's output (the supervisor's name)
INTERRUPTED = "log collection interrupted (Ctrl-C)"
# not_collected reasons that mean logs which should be home are not (LOGS INCOMPLETE)
INCOMPLETE_REASONS = ("transfer failed", "vanished", "missing", "short", "interrupted")
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int | None:
    """``256M``, ``2G``, ``1.5GiB``, ``4096`` (bytes) → bytes; ``unlimited``/``none`` → None."""
    t = text.strip().lower()
    if t in ("unlimited", "none", "inf"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", t)
    if m is None:
        raise UsageError(f"bad size {text!r}: use e.g. 500M, 2G, 1.5GiB or unlimited")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(n: int | None) -> str:
    if n is None:
        return "unlimited"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


@dataclass(frozen=True)
class CollectOptions:
    """What to bring home from each node: a byte cap per node and file globs to leave there."""

    max_bytes: int | None = DEFAULT_COLLECT_MAX
    exclude: tuple[str, ...] = ()

    def wire(
        self,
        have: Mapping[str, list[int]] | None = None,
        partial: Mapping[str, list[int]] | None = None,
    ) -> dict[str, Any]:
        """The supervisor's ``pack`` options (``have``: files already home, size and mtime;
        ``partial``: size, mtime and bytes home of files a broken transfer left half-way)."""
        return {
            "max": self.max_bytes,
            "exclude": list(self.exclude),
            "have": dict(have or {}),
            "partial": dict(partial or {}),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"max": self.max_bytes, "exclude": list(self.exclude)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CollectOptions:
        if not data:
            return cls()
        cap = data.get("max", DEFAULT_COLLECT_MAX)
        return cls(
            max_bytes=None if cap is None else int(cap),
            exclude=tuple(str(g) for g in data.get("exclude") or ()),
        )


@dataclass
class NodeCollect:
    """What came back from one node."""

    host: str
    rank: int
    folder: str
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    refused: list[str] = field(default_factory=list)  # unsafe remote names, not written
    error: str | None = None
    skipped: str | None = None
    # files of the node not home: {"path", "size", "reason", "detail"}; reason is one of
    # "over cap", "excluded", "transfer failed", "vanished", and for console.log "missing"
    # (not in the node's run folder) or "short" (fewer lines than streamed): see check_console
    not_collected: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0
    transfer_failed: bool = False  # the last transfer broke: a retry may bring the rest
    # why this collection could not reach the node, whose logs the job's own collection had
    # brought home whole after it ended: that record stands (nothing copied now)
    unreachable: str | None = None

    @property
    def incomplete(self) -> bool:
        """Logs that should be home are not: the node was skipped, a transfer failed or was
        interrupted, or the node's console.log did not come home whole."""
        return (
            self.error is not None
            or self.skipped is not None
            or any(f["reason"] in INCOMPLETE_REASONS for f in self.not_collected)
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "rank": self.rank,
            "folder": self.folder,
            "files": self.files,
            "bytes": self.bytes,
            "not_collected": self.not_collected,
            "complete": not self.incomplete,
            "attempts": self.attempts,
            "refused": self.refused,
            "error": self.error,
            "skipped": self.skipped,
            **({"unreachable": self.unreachable} if self.unreachable else {}),
        }


def account(out: NodeCollect, got: Unpacked) -> None:
    """Fill ``out`` from one transfer: what is home now, what is not and why."""
    out.bytes += got.bytes
    out.refused = sorted({*out.refused, *got.refused})
    out.transfer_failed = got.error is not None
    received = set(got.files)
    if got.manifest is None:  # nothing said what there was: only what landed is known
        out.files = sorted({*out.files, *received})
        out.not_collected = []
        return
    cap = got.manifest.get("max")
    home: set[str] = set()
    missing: list[dict[str, Any]] = []
    for f in got.manifest["files"]:
        if not isinstance(f, dict) or not isinstance(f.get("path"), str):
            continue
        path, size = f["path"], int(f.get("size") or 0)
        if f.get("send"):
            if path in received:
                home.add(path)
            elif got.error is not None:
                missing.append(_missing(path, size, "transfer failed", got.error))
            else:
                missing.append(_missing(path, size, "vanished", "gone before it was sent"))
        elif f.get("reason") == "home":
            home.add(path)
        elif f.get("reason") == "over cap":
            missing.append(_missing(path, size, "over cap", f"over the {format_size(cap)} cap"))
        elif f.get("reason") == "excluded":
            missing.append(_missing(path, size, "excluded", f"excluded by {f.get('glob')!r}"))
    out.files = sorted(home)
    out.not_collected = missing


def _missing(path: str, size: int, reason: str, detail: str) -> dict[str, Any]:
    return {"path": path, "size": size, "reason": reason, "detail": detail}


def check_console(c: NodeCollect, streamed_lines: int | None = None) -> None:
    """Mark ``c`` incomplete when the node's console.log did not come home whole: absent
    from what the node sent (its run folder was hidden or removed while the job ran: a
    manifest without it is no proof there was nothing), or with fewer lines than streamed
    from the node (``streamed_lines``: the ``L`` lines the watcher counted, which the
    supervisor writes to console.log one for one). Only for nodes whose job started."""
    if c.error is not None or c.skipped is not None:
        return
    if any(f["path"] == CONSOLE_LOG for f in c.not_collected):
        return
    if CONSOLE_LOG not in c.files:
        c.not_collected.append(
            _missing(
                CONSOLE_LOG,
                0,
                "missing",
                "not in the node's run folder when collected (hidden or removed while the job ran)",
            )
        )
        return
    if not streamed_lines:
        return
    try:
        have = _count_lines(Path(c.folder) / CONSOLE_LOG)
    except OSError as e:
        c.not_collected.append(_missing(CONSOLE_LOG, 0, "missing", f"unreadable here: {e}"))
        return
    if have < streamed_lines:
        size = (Path(c.folder) / CONSOLE_LOG).stat().st_size
        c.not_collected.append(
            _missing(
                CONSOLE_LOG,
                size,
                "short",
                f"{have} of the {streamed_lines} lines that streamed from the node",
            )
        )


def _count_lines(path: Path) -> int:
    """Lines as the supervisor wrote them (a last line without its newline counts)."""
    n, last = 0, b"\n"
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


class CollectInterrupted(KeyboardInterrupt):
    """Ctrl-C while collecting: ``results`` holds every node, those not finished marked
    :data:`INTERRUPTED` (their half-received files stay as partial copies, which the next
    ``fleetctl collect`` resumes)."""

    def __init__(self, results: list[NodeCollect]) -> None:
        super().__init__(INTERRUPTED)
        self.results = results


def interrupted(collected: Iterable[NodeCollect]) -> bool:
    """Whether a collection was cut short by Ctrl-C (the run then exits 130)."""
    return any(c.error == INTERRUPTED for c in collected)


def not_collected_line(c: NodeCollect, *, limit: int = 3) -> str:
    """``2 file(s) not collected: checkpoint.pt (1.0 GiB, over the 256.0 MiB cap); …``"""
    shown = [
        f"{f['path']} ({format_size(int(f.get('size') or 0))}, {f['detail']})"
        for f in c.not_collected[:limit]
    ]
    more = len(c.not_collected) - len(shown)
    return (
        f"{len(c.not_collected)} file(s) not collected: "
        + "; ".join(shown)
        + (f"; and {more} more (job.json lists them)" if more > 0 else "")
    )


class _StreamReader:
    """A Stream as a file for tarfile: skips shell noise up to the marker (the ``T`` frame that
    starts the tar stream, at the start of a line); fails when no byte comes for ``idle`` s
    (a big file may take long; a dead link says nothing)."""

    def __init__(self, stream: Stream, idle: float) -> None:
        self.stream, self.idle = stream, idle
        self.deadline = time.monotonic() + idle
        self.buf = b"\n"  # the marker is a frame: it starts a line
        self.eof = False
        self.started = False

    def _fill(self) -> None:
        while not self.eof:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise CollectError(f"no data from the node for {self.idle:g}s")
            data = self.stream.recv(min(left, 1.0))
            if data is None:
                continue
            if not data:
                self.eof = True
                return
            self.deadline = time.monotonic() + self.idle
            self.buf += data
            if not self.started:
                i = self.buf.find(b"\n" + TAR_MARKER)
                if i < 0:
                    self.buf = self.buf[-len(TAR_MARKER) :]
                    continue
                self.buf = self.buf[i + 1 + len(TAR_MARKER) :]
                self.started = True
            return

    def read(self, n: int = -1) -> bytes:
        while (n < 0 or len(self.buf) < n) and not self.eof:
            self._fill()
        if not self.started:
            return b""
        if n < 0:
            data, self.buf = self.buf, b""
        else:
            data, self.buf = self.buf[:n], self.buf[n:]
        return data


def _receive(stream: Stream, dest: Path, out: NodeCollect, timeout: float) -> bool:
    """Skip to the tar marker and unpack what follows into ``dest``, filling ``out``.
    False when the stream ended without a marker (nothing was sent)."""
    reader = _StreamReader(stream, timeout)
    while not reader.started and not reader.eof:
        reader._fill()
    if not reader.started:
        return False
    out.attempts += 1
    got = unpack(reader, dest)  # type: ignore[arg-type]
    account(out, got)
    if got.error is not None:
        out.error = f"log transfer from the node broke: {got.error}"
    else:
        out.error = None
    return True


def collect_from_supervisor(
    node: Node,
    stream: Stream,
    *,
    dest: Path,
    rank: int,
    timeout: float = COLLECT_TIMEOUT,
) -> NodeCollect | None:
    """Ask a supervisor whose job has ended for its run folder on its own channel (``c``; the
    cap and excludes came with its spec). No remote command, so no remote shell start-up.
    None when that channel cannot deliver (closed, no marker): the caller uses ``pack``.
    """
    out = NodeCollect(node.name, rank, str(dest))
    try:
        stream.send(b"c")
        return out if _receive(stream, dest, out, timeout) else None
    except (OSError, EOFError, CollectError):
        return None
    finally:
        with contextlib.suppress(Exception):
            stream.close()


def collect_node(
    node: Node,
    conn: Connection,
    *,
    run_dir: str,
    dest: Path,
    rank: int,
    python: str,
    timeout: float = COLLECT_TIMEOUT,
    options: CollectOptions | None = None,
    out: NodeCollect | None = None,
) -> NodeCollect:
    """Stream the node's run folder (supervisor ``pack``, told what is home already) and
    unpack it safely into ``dest``; ``out``: an earlier attempt's record to continue."""
    out = out or NodeCollect(node.name, rank, str(dest))
    options = options or CollectOptions()
    sup = supervisor_path(conn.expand(node.workdir))
    argv = supervisor_command(
        conn.expand(python), sup, "pack", run_dir=conn.expand(run_dir), stdin="1"
    )
    line = f"test -d {shlex.quote(sup)} || exit 3; exec {shlex.join(argv)} 2>/dev/null"
    stream = conn.start(line)
    try:
        wire = options.wire(local_files(dest), partial_files(dest))
        stream.send(json.dumps(wire).encode() + b"\n")
        if not _receive(stream, dest, out, timeout):
            out.error = "no run folder on the node (the job never started there)"
    finally:
        with contextlib.suppress(Exception):
            stream.close()
    return out


def collect(
    fleet: FanOut,
    plan: Plan,
    folder: Path,
    *,
    pythons: dict[str, str],
    skip: Iterable[str] = (),
    timeout: float = COLLECT_TIMEOUT,
    streams: Mapping[str, Stream] | None = None,
    options: CollectOptions | None = None,
) -> list[NodeCollect]:
    """Collect every node's run folder in parallel into ``folder/<rank>-<host>/``.

    ``streams``: per host, the channel of a supervisor whose job ended and that waits to send
    its run folder (see :func:`collect_from_supervisor`); the others, any of those that cannot
    deliver and any transfer that broke (up to ``COLLECT_ATTEMPTS`` in all, reconnecting when
    the link died) run the supervisor's ``pack`` mode, which sends only what is not home.
    """
    streams = streams or {}
    options = options or CollectOptions()
    skip = set(skip)
    by_name = {n.name: n for n in fleet.nodes}
    todo = [by_name[np.host] for np in plan.nodes if np.host not in skip]
    ranks = {np.host: np.node_rank for np in plan.nodes}
    run_dirs = {np.host: np.run_dir for np in plan.nodes}

    def dest(host: str) -> Path:
        return folder / node_folder_name(ranks[host], host)

    finished: dict[str, NodeCollect] = {}  # what is known when Ctrl-C cuts the fan-out short

    def one(node: Node, conn: Connection) -> NodeCollect:
        out = _one(node, conn)
        finished[node.name] = out
        return out

    def _one(node: Node, conn: Connection) -> NodeCollect:
        out: NodeCollect | None = None
        stream = streams.get(node.name)
        if stream is not None:
            out = collect_from_supervisor(
                node, stream, dest=dest(node.name), rank=ranks[node.name], timeout=timeout
            )
        tries = out.attempts if out is not None else 0
        while out is None or (out.transfer_failed and tries < COLLECT_ATTEMPTS):
            if tries:  # a broken transfer: a moment, then only what is missing
                time.sleep(min(2.0 * tries, 5.0))
            try:
                tries += 1
                if tries > 1:
                    conn = _live(fleet, node, conn)
                out = collect_node(
                    node,
                    conn,
                    run_dir=run_dirs[node.name],
                    dest=dest(node.name),
                    rank=ranks[node.name],
                    python=pythons[node.name],
                    timeout=timeout,
                    options=options,
                    out=out,
                )
            except (FleetctlError, OSError, EOFError) as e:
                if tries >= COLLECT_ATTEMPTS:
                    if out is None:
                        raise
                    out.error = f"log transfer from the node broke: {e}"
                    return out
                if out is not None:
                    out.transfer_failed = True
        return out

    cap = options.max_bytes if options.max_bytes is not None else 64 << 30
    limit = COLLECT_ATTEMPTS * (timeout + 15) + cap / MIN_RATE
    # at most --fanout transfers at once (each a stream through the controller's disk and
    # NIC); the limit covers every wave
    width = max(1, min(len(todo), fleet.fanout))
    limit *= -(-len(todo) // width) if todo else 1
    try:
        results: Mapping[str, object] | None = (
            fleet.map(one, timeout=limit, nodes=todo, width=width) if todo else None
        )
    except KeyboardInterrupt:
        got: dict[str, object] = {
            np.host: NodeCollect(np.host, np.node_rank, str(dest(np.host)), error=INTERRUPTED)
            for np in plan.nodes
        }
        got.update(finished)
        raise CollectInterrupted(_per_node(plan, skip, got, dest)) from None
    return _per_node(plan, skip, results, dest)


def _per_node(
    plan: Plan,
    skip: set[str],
    results: Mapping[str, object] | None,
    dest: Callable[[str], Path],
) -> list[NodeCollect]:
    out: list[NodeCollect] = []
    for np in plan.nodes:
        d = str(dest(np.host))
        if np.host in skip:
            out.append(NodeCollect(np.host, np.node_rank, d, skipped="node lost: not reachable"))
            continue
        r = results.get(np.host) if results is not None else None
        if isinstance(r, NodeCollect):
            out.append(r)
        else:
            out.append(NodeCollect(np.host, np.node_rank, d, error=" ".join(str(r).split())))
    return out


def _live(fleet: FanOut, node: Node, conn: Connection) -> Connection:
    """``conn``, or a new connection when its transport died (a broken transfer can take the
    SSH session with it, e.g. a key re-exchange that timed out)."""
    try:
        conn.start("true").close()
        return conn
    except ConnectError:
        fleet.drop(node)
        return fleet.connection(node)


def remote_run_dir(workdir: str, job_id: str) -> str:
    return posixpath.join(workdir, "runs", job_id)
