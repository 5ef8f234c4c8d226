"""Collect: bring every node's run folder home, as one tar stream per node over the open SSH.

``W/runs/<job>/`` (console.log, supervisor.json, the launcher's log folders: torchrun
``--log-dir``, paddle ``log/workerlog.N`` and ``log/<job>.<pod>.log``) lands in
``fleet-runs/<job>/<rank>-<host>/``. Runs after success, failure and Ctrl-C alike, and from
nodes whose job was killed. Remote names are never trusted: absolute paths, ``..``, links and
special files are refused, and nothing is written outside the node's folder.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shlex
import tarfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from fleetctl.errors import CollectError
from fleetctl.job.runfolder import node_folder_name
from fleetctl.phases.launch import supervisor_command, supervisor_path
from fleetctl.remote.supervisor import TAR_MARKER  # the same marker at both ends

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import Plan
    from fleetctl.ssh.connection import Connection, Stream
    from fleetctl.ssh.fleet import Fleet

COLLECT_TIMEOUT = 60.0


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "rank": self.rank,
            "folder": self.folder,
            "files": self.files,
            "bytes": self.bytes,
            "refused": self.refused,
            "error": self.error,
            "skipped": self.skipped,
        }


def safe_member_path(name: str) -> str | None:
    """A tar member name as a safe relative POSIX path, or None if it could escape.

    Refused: empty, absolute, any ``..`` component, NUL or backslash (never a separator here).
    """
    if not name or "\0" in name or "\\" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return "/".join(parts)


def extract_tar(src: IO[bytes], dest: Path) -> tuple[list[str], int, list[str]]:
    """Unpack a tar stream into ``dest``: regular files and folders only, inside ``dest`` only.

    Returns (files written, bytes, refused names). Files are created with O_NOFOLLOW and
    mode 0600 under folders fleetctl made itself, so a hostile stream cannot redirect a write.
    """
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    root = dest.resolve()
    files: list[str] = []
    refused: list[str] = []
    total = 0
    with tarfile.open(fileobj=src, mode="r|") as tar:
        for member in tar:
            rel = safe_member_path(member.name)
            if rel is None or not (member.isfile() or member.isdir()):
                refused.append(member.name)
                continue
            target = root.joinpath(*rel.split("/"))
            if member.isdir():
                _make_dirs(root, rel.split("/"))
                continue
            parent = _make_dirs(root, rel.split("/")[:-1])
            if parent is None:
                refused.append(member.name)
                continue
            fobj = tar.extractfile(member)
            if fobj is None:
                refused.append(member.name)
                continue
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            except OSError:
                refused.append(member.name)
                continue
            with os.fdopen(fd, "wb") as out:
                while chunk := fobj.read(1 << 16):
                    out.write(chunk)
                    total += len(chunk)
            files.append(rel)
    return files, total, refused


def _make_dirs(root: Path, parts: list[str]) -> Path | None:
    """mkdir -p below root, refusing any component that exists as a link or non-folder."""
    cur = root
    for p in parts:
        cur = cur / p
        if cur.is_symlink():
            return None
        if not cur.exists():
            cur.mkdir(mode=0o700)
        elif not cur.is_dir():
            return None
    return cur


class _StreamReader:
    """A Stream as a file for tarfile: skips shell noise up to the marker (the ``T`` frame that
    starts the tar stream, at the start of a line), bounded by a deadline."""

    def __init__(self, stream: Stream, deadline: float) -> None:
        self.stream, self.deadline = stream, deadline
        self.buf = b"\n"  # the marker is a frame: it starts a line
        self.eof = False
        self.started = False

    def _fill(self) -> None:
        while not self.eof:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise CollectError(f"collect timed out after {COLLECT_TIMEOUT:g}s")
            data = self.stream.recv(min(left, 1.0))
            if data is None:
                continue
            if not data:
                self.eof = True
                return
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
    reader = _StreamReader(stream, time.monotonic() + timeout)
    while not reader.started and not reader.eof:
        reader._fill()
    if not reader.started:
        return False
    try:
        out.files, out.bytes, out.refused = extract_tar(reader, dest)  # type: ignore[arg-type]
    except (tarfile.TarError, OSError, EOFError) as e:
        out.error = f"log archive from the node is damaged: {e}"
    return True


def collect_from_supervisor(
    node: Node,
    stream: Stream,
    *,
    dest: Path,
    rank: int,
    timeout: float = COLLECT_TIMEOUT,
) -> NodeCollect | None:
    """Ask a supervisor whose job has ended for its run folder on its own channel (``c``).

    No remote command, so no remote shell start-up. None when that channel cannot deliver
    (closed, no marker): the caller falls back to :func:`collect_node`.
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
) -> NodeCollect:
    """Stream the node's run folder (supervisor ``pack``) and unpack it safely into ``dest``."""
    out = NodeCollect(node.name, rank, str(dest))
    sup = supervisor_path(conn.expand(node.workdir))
    argv = supervisor_command(conn.expand(python), sup, "pack", run_dir=conn.expand(run_dir))
    line = f"test -f {shlex.quote(sup)} || exit 3; exec {shlex.join(argv)} 2>/dev/null"
    stream = conn.start(line)
    try:
        if not _receive(stream, dest, out, timeout):
            out.error = "no run folder on the node (the job never started there)"
    finally:
        with contextlib.suppress(Exception):
            stream.close()
    return out


def collect(
    fleet: Fleet,
    plan: Plan,
    folder: Path,
    *,
    pythons: dict[str, str],
    skip: Iterable[str] = (),
    timeout: float = COLLECT_TIMEOUT,
    streams: Mapping[str, Stream] | None = None,
) -> list[NodeCollect]:
    """Collect every node's run folder in parallel into ``folder/<rank>-<host>/``.

    ``streams``: per host, the channel of a supervisor whose job ended and that waits to send
    its run folder (see :func:`collect_from_supervisor`); the others, and any of those that
    cannot deliver, run the supervisor's ``pack`` mode as a remote command.
    """
    streams = streams or {}
    skip = set(skip)
    by_name = {n.name: n for n in fleet.nodes}
    todo = [by_name[np.host] for np in plan.nodes if np.host not in skip]
    ranks = {np.host: np.node_rank for np in plan.nodes}
    run_dirs = {np.host: np.run_dir for np in plan.nodes}

    def dest(host: str) -> Path:
        return folder / node_folder_name(ranks[host], host)

    def one(node: Node, conn: Connection) -> NodeCollect:
        stream = streams.get(node.name)
        if stream is not None:
            got = collect_from_supervisor(
                node, stream, dest=dest(node.name), rank=ranks[node.name], timeout=timeout
            )
            if got is not None:
                return got
        return collect_node(
            node,
            conn,
            run_dir=run_dirs[node.name],
            dest=dest(node.name),
            rank=ranks[node.name],
            python=pythons[node.name],
            timeout=timeout,
        )

    results = (
        fleet.map(one, timeout=timeout + 10, nodes=todo, width=max(len(todo), 1)) if todo else None
    )
    out: list[NodeCollect] = []
    for np in plan.nodes:
        d = str(dest(np.host))
        if np.host in skip:
            out.append(NodeCollect(np.host, np.node_rank, d, skipped="node lost: not reachable"))
            continue
        r = results[np.host] if results is not None else None
        if isinstance(r, NodeCollect):
            out.append(r)
        else:
            out.append(NodeCollect(np.host, np.node_rank, d, error=" ".join(str(r).split())))
    return out


def remote_run_dir(workdir: str, job_id: str) -> str:
    return posixpath.join(workdir, "runs", job_id)
