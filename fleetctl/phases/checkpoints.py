"""Checkpoints across retries: what a job wrote into its work folder on the node of rank 0
(pytorch/examples' ``snapshot.pt``, Lightning's and HF Trainer's checkpoint folders) reaches the
work folder of every node of the next attempt, spares included, before launch.

The source node's push helper (``relay-pack``) tars the regular files that differ from the code
snapshot its work folder was seeded from (never the code itself, ``__pycache__`` or files that
look like private keys); each other node's (``relay-apply``) seeds its work folder as the
supervisor would and unpacks the tar there. The tar reaches the nodes through the controller
(SFTP down once, up to each node) or, from ``PEER_MIN_HOSTS`` hosts and ``PEER_MIN_BYTES``, from
the source itself over the training network (push's token-protected ``serve``; the controller
relays only to nodes whose fetch failed). Nodes that share the source's workdir (an NFS home)
already see its files: nothing is copied to them.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl import remote
from fleetctl.errors import FleetctlError, NodePushError, PushError, UsageError
from fleetctl.phases.frames import PUSH_KINDS, FrameStream, last_data
from fleetctl.results import FleetResult

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.ssh.connection import Connection
    from fleetctl.ssh.fleet import Fleet

T = TypeVar("T")

CHECKPOINT_MAX = 8 << 30  # bytes relayed at most; beyond it the relay is skipped with a note
PEER_MIN_HOSTS = 4  # as push: from 4 hosts the nodes fetch from the source, not the controller
PEER_MIN_BYTES = 64 << 20  # smaller sets go through the controller (one round trip less)
RELAY_RATE = 10e6  # bytes/s assumed for a transfer's timeout (plus a fixed minute)


def checkpoint_dir_arg(text: str | None) -> str | None:
    """``--checkpoint-dir``: relative to the job's work folder, or absolute on the nodes
    (``~/…`` too). None for the work folder itself. Raises UsageError (exit 2)."""
    if text is None:
        return None
    bad = "--checkpoint-dir"
    if not text.strip() or any(c in text for c in "\0\n\r"):
        raise UsageError(f"{bad} {text!r}: give a folder name")
    if text.startswith("~") and not (text == "~" or text.startswith("~/")):
        raise UsageError(f"{bad} {text!r}: only ~/ (the login's home) is expanded")
    if ".." in text.split("/"):
        raise UsageError(f"{bad} {text!r}: '..' is not allowed (relative to the work folder)")
    norm = posixpath.normpath(text)
    if norm in ("/", "~"):
        raise UsageError(f"{bad} {text!r}: not a whole filesystem or home; name a folder")
    return None if norm == "." else norm


@dataclass(frozen=True)
class RelaySource:
    """The node of rank 0 of the last attempt that ran, and its folders (as planned)."""

    node: Node
    work_dir: str  # the job's work folder
    code_dir: str | None  # the code snapshot it was seeded from
    train_addr: str | None = None
    attempt: int = 1
    cwd: str | None = None  # where the job ran (the script's folder in it); None: work_dir


@dataclass(frozen=True)
class RelayTarget:
    node: Node
    work_dir: str
    code_dir: str | None
    cwd: str | None = None


@dataclass
class RelayReport:
    """What was relayed (attempts.json ``checkpoints``, and a notice)."""

    source: str
    attempt: int  # whose files these are
    dir: str | None = None
    files: list[str] = field(default_factory=list)  # the first names (count: all of them)
    count: int = 0
    bytes: int = 0
    method: str | None = None  # controller | peer
    nodes: dict[str, str] = field(default_factory=dict)  # host -> what happened there
    skipped: str | None = None  # why nothing was copied
    secrets: list[str] = field(default_factory=list)  # left out: look like private keys

    def to_dict(self) -> dict[str, Any]:
        return {
            "from": self.source,
            "attempt": self.attempt,
            "dir": self.dir,
            "files": self.files,
            "count": self.count,
            "bytes": self.bytes,
            "method": self.method,
            "nodes": self.nodes,
            "skipped": self.skipped,
            "secrets": self.secrets,
        }

    def summary(self) -> str:
        where = f"{self.source} (rank 0 of attempt {self.attempt})"
        if self.skipped:
            return f"checkpoints not relayed from {where}: {self.skipped}"
        copied = [h for h, what in self.nodes.items() if what.startswith("copied")]
        text = (
            f"checkpoints: {self.count} file(s), {self.bytes} bytes from {where} to "
            f"{', '.join(copied) or 'no node'} ({self.method})"
        )
        shared = [h for h, what in self.nodes.items() if what.startswith("shares")]
        if shared:
            text += f"; {', '.join(shared)} share a workdir, nothing copied"
        if self.secrets:
            text += f"; left out (look like private keys): {', '.join(self.secrets[:5])}"
        return text


def plan_targets(
    source: str, targets: Sequence[str], shared_groups: Iterable[Sequence[str]] = ()
) -> tuple[list[str], dict[str, str]]:
    """Which nodes get a copy: not the source, not a node sharing its workdir, and one node per
    group of nodes sharing one (the first; the others see its copy). Returns the nodes and
    what is said about each of the others."""
    leader: dict[str, str] = {}
    for group in shared_groups:
        for name in group:
            leader.setdefault(name, group[0])
    to_copy: list[str] = []
    notes: dict[str, str] = {}
    for name in targets:
        if name == source:
            notes[name] = "the source"
        elif source in leader and leader.get(name) == leader[source]:
            notes[name] = f"shares its workdir with {source}"
        elif name in leader and leader[name] != name and leader[name] in targets:
            notes[name] = f"shares its workdir with {leader[name]}"
        else:
            to_copy.append(name)
    return to_copy, notes


def relay_method(hosts: int, size: int, peer_addr: str | None) -> str:
    """``peer`` (nodes fetch from the source) for large sets on ``PEER_MIN_HOSTS`` hosts and
    more, when the source has a training address; else ``controller``."""
    if peer_addr and hosts >= PEER_MIN_HOSTS and size >= PEER_MIN_BYTES:
        return "peer"
    return "controller"


def relay_checkpoints(
    fleet: Fleet,
    source: RelaySource,
    targets: Sequence[RelayTarget],
    *,
    checkpoint_dir: str | None = None,
    shared_groups: Iterable[Sequence[str]] = (),
    allow_secrets: Iterable[str] = (),
    max_bytes: int = CHECKPOINT_MAX,
    report: RelayReport | None = None,
) -> RelayReport:
    """Copy the source's new files to ``targets``' work folders. A source that cannot be
    reached, has nothing new or too much is a note (``skipped``); a node that could not take
    them raises ``PushError`` (its ranks would resume from another point than the rest);
    ``report``, when given, is filled in as it goes (the caller keeps it then)."""
    report = report or RelayReport(source.node.name, source.attempt, checkpoint_dir)
    conn, own = _source_connection(fleet, source, report)
    if conn is None:
        return report
    tar = f".tmp-relay-{secrets.token_hex(6)}.tar"
    packed: dict[str, Any] = {}
    try:
        try:
            packed = _helper(
                source.node,
                conn,
                "relay-pack",
                {
                    "workdir": source.node.workdir,
                    "work": source.work_dir,
                    "cwd": source.cwd,
                    "seed": source.code_dir,
                    "dir": checkpoint_dir,
                    "tar": tar,
                    "max_bytes": max_bytes,
                    "allow_secrets": sorted(allow_secrets),
                },
                600,
            )
        except FleetctlError as e:
            report.skipped = f"cannot read its work folder: {e.one_line()}"
            return report
        report.files, report.count = list(packed.get("files") or []), int(packed.get("count", 0))
        report.bytes, report.secrets = int(packed.get("bytes", 0)), packed.get("secrets") or []
        if not report.count:
            report.skipped = "no new files in " + str(packed.get("root") or source.work_dir)
            return report
        if report.bytes > max_bytes:
            report.skipped = f"{report.bytes} bytes, over the relay cap of {max_bytes}"
            return report
        names, notes = plan_targets(source.node.name, [t.node.name for t in targets], shared_groups)
        report.nodes.update(notes)
        todo = [t for t in targets if t.node.name in names]
        if not todo:
            return report
        report.method = relay_method(len(targets) + 1, int(packed["size"]), source.train_addr)
        base = {
            "dir": checkpoint_dir,
            "sha": packed["sha"],
            "size": int(packed["size"]),
            "source_id": packed.get("workdir_id"),
        }
        failed: dict[str, BaseException] = {}
        left = todo
        if report.method == "peer":
            try:
                left = _by_peer(fleet, source, conn, packed, base, todo, report)
            except Exception:  # no server on the source: the controller sends it instead
                left = todo
        if left:
            _by_controller(fleet, source, conn, packed, base, left, report, failed)
        if failed:
            for name, e in failed.items():
                why = e.one_line() if isinstance(e, FleetctlError) else f"{type(e).__name__}: {e}"
                report.nodes[name] = f"failed: {why}"
            first = next(iter(failed.values()))
            raise PushError(
                f"checkpoints from {source.node.name} did not reach {len(failed)} node(s): "
                + (first.one_line() if isinstance(first, FleetctlError) else str(first)),
                FleetResult(dict(failed)),
            )
        return report
    finally:
        if packed.get("tar"):
            with contextlib.suppress(Exception):
                _helper(
                    source.node,
                    conn,
                    "cleanup",
                    {"workdir": source.node.workdir, "env_paths": [tar]},
                    60,
                )
        if own:
            conn.close()


def _source_connection(
    fleet: Fleet, source: RelaySource, report: RelayReport
) -> tuple[Connection | None, bool]:
    """The fleet's connection when the source runs this attempt too, else a new one."""
    from fleetctl.ssh.connection import connect

    try:
        if any(n.name == source.node.name for n in fleet.nodes):
            return fleet.connection(source.node), False
        return connect(source.node, fleet.settings), True
    except FleetctlError as e:
        report.skipped = f"unreachable: {e.one_line()}"
    return None, False


def _by_peer(
    fleet: Fleet,
    source: RelaySource,
    conn: Connection,
    packed: dict[str, Any],
    base: dict[str, Any],
    todo: list[RelayTarget],
    report: RelayReport,
) -> list[RelayTarget]:
    """Every node fetches the tar from the source's training address; returns those whose
    fetch failed (the controller sends them the tar)."""
    from fleetctl.phases.push.state import REMOTE_SRC  # not at import: the CLI checks args here

    token = secrets.token_hex(32)
    stream = conn.start([source.node.python, remote.NO_SITE, "-c", REMOTE_SRC, "serve"])
    cfg = {
        "path": packed["tar"],
        "sha": packed["sha"],
        "token": token,
        "bind": source.train_addr,
        "timeout": _timeout(int(packed["size"])),
        "remove": False,
    }
    try:
        stream.send(json.dumps(cfg).encode() + b"\n")
        got = FrameStream(stream, PUSH_KINDS, json_kinds=PUSH_KINDS).next(
            "AD", time.monotonic() + 30
        )
        info = got.data() if got is not None else None
        if not isinstance(info, dict) or "port" not in info:
            return todo
        peer = {"name": source.node.name, "host": info["host"], "port": info["port"]}

        def fetch(node: Node, c: Connection) -> dict[str, Any]:
            return _apply(
                node,
                c,
                _target(todo, node),
                {**base, "fetch": {"peers": [{**peer, "token": token}]}, "fetch_timeout": 60},
            )

        res = fleet.map(fetch, nodes=[t.node for t in todo], timeout=_timeout(int(packed["size"])))
    finally:
        with contextlib.suppress(Exception):
            stream.close_stdin()
            stream.exit_code(15)
        with contextlib.suppress(Exception):
            stream.close()
    left = []
    for t in todo:
        out = res[t.node.name]
        if isinstance(out, BaseException):
            left.append(t)
        else:
            report.nodes[t.node.name] = _said(out, f"copied from {source.node.name}")
    return left


def _by_controller(
    fleet: Fleet,
    source: RelaySource,
    conn: Connection,
    packed: dict[str, Any],
    base: dict[str, Any],
    todo: list[RelayTarget],
    report: RelayReport,
    failed: dict[str, BaseException],
) -> None:
    """The tar comes here once and goes to each node by SFTP."""
    size = int(packed["size"])
    with tempfile.TemporaryDirectory(prefix="fleetctl-relay-") as tmp:
        local = Path(tmp) / "relay.tar"
        try:
            _bounded(lambda: conn.get(packed["tar"], local), _timeout(size), source.node.label)
        except BaseException as e:
            for t in todo:
                failed[t.node.name] = e
            return

        def send(node: Node, c: Connection) -> dict[str, Any]:
            envs = posixpath.join(c.expand(node.workdir), "envs")
            name = f".tmp-relay-{secrets.token_hex(6)}.tar"
            c.run(["mkdir", "-p", "-m", "700", envs], timeout=60, check=True)
            c.put(local, posixpath.join(envs, name), mode=0o600)
            return _apply(node, c, _target(todo, node), {**base, "tar": name})

        res = fleet.map(send, nodes=[t.node for t in todo], timeout=_timeout(size))
    for t in todo:
        out = res[t.node.name]
        if isinstance(out, BaseException):
            failed[t.node.name] = out
        else:
            report.nodes[t.node.name] = _said(out, "copied")


def _apply(node: Node, conn: Connection, t: RelayTarget, cfg: dict[str, Any]) -> dict[str, Any]:
    cfg = {
        "workdir": node.workdir,
        "work": t.work_dir,
        "cwd": t.cwd,
        "seed": t.code_dir,
        "tar": cfg.get("tar") or f".tmp-relay-{secrets.token_hex(6)}.tar",
        **{k: v for k, v in cfg.items() if k != "tar"},
    }
    return _helper(node, conn, "relay-apply", cfg, _timeout(int(cfg["size"])))


def _said(out: dict[str, Any], how: str) -> str:
    return "shares its workdir with the source" if out.get("shared") else how


def _target(todo: Sequence[RelayTarget], node: Node) -> RelayTarget:
    return next(t for t in todo if t.node.name == node.name)


def _helper(
    node: Node, conn: Connection, mode: str, cfg: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """One push helper command; its answer. Raises NodePushError with the node's reason."""
    res = conn.run(
        remote.cached_argv(node.python, node.workdir, "push_helper.py", mode),
        timeout=timeout,
        stdin=json.dumps(cfg).encode() + b"\n",
    )
    payload = last_data(res.stdout)
    if not isinstance(payload, dict):
        tail = (res.stderr or res.stdout or "").strip().splitlines()
        raise NodePushError(
            node.label,
            f"{mode}: no answer (exit {res.exit_code})" + (f": {tail[-1]}" if tail else ""),
        )
    if "error" in payload:
        raise NodePushError(
            node.label,
            f"{mode}: {payload['error']}",
            stage="relay",
            enospc=bool(payload.get("enospc")),
        )
    return payload


def _timeout(size: int) -> float:
    return 60.0 + size / RELAY_RATE


def _bounded(fn: Callable[[], T], timeout: float, what: str) -> T:
    """``fn()`` in a thread, waited for at most ``timeout`` s (an SFTP get has no deadline)."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=work, daemon=True, name="relay-get")
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise NodePushError(what, f"checkpoint download took over {timeout:.0f}s", stage="relay")
    if "error" in box:
        raise box["error"]
    return box["value"]
