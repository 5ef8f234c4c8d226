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
import posixpath
import secrets
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleetctl.errors import FleetctlError, NodePushError, PushError, UsageError
from fleetctl.phases.push.request import PushRequest
from fleetctl.results import FleetResult

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection, SSHSettings

T = TypeVar("T")

CHECKPOINT_MAX = 8 << 30  # bytes relayed at most; beyond it the relay is skipped with a note
PEER_MIN_HOSTS = 4  # as push: from 4 hosts the nodes fetch from the source, not the controller
PEER_MIN_BYTES = 64 << 20  # smaller sets go through the controller (one round trip less)
RELAY_RATE = 10e6  # bytes/s assumed for a transfer's timeout (plus a fixed minute)
NOTHING = PushRequest()  # no key-like file let through


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
    sent: dict[str, int] = field(default_factory=dict)  # host -> bytes of files sent to it
    skipped: str | None = None  # why nothing was copied
    secrets: list[str] = field(default_factory=list)  # left out: look like private keys
    job: str | None = None  # ``run --resume``: the earlier job whose files these are

    def to_dict(self) -> dict[str, Any]:
        return ({"job": self.job} if self.job else {}) | {
            "from": self.source,
            "attempt": self.attempt,
            "dir": self.dir,
            "files": self.files,
            "count": self.count,
            "bytes": self.bytes,
            "method": self.method,
            "nodes": self.nodes,
            "sent": self.sent,
            "skipped": self.skipped,
            "secrets": self.secrets,
        }

    def summary(self) -> str:
        where = f"{self.source} (rank 0 of " + (
            f"job {self.job})" if self.job else f"attempt {self.attempt})"
        )
        if self.skipped:
            return f"checkpoints not relayed from {where}: {self.skipped}"
        copied = [h for h, what in self.nodes.items() if what.startswith("copied")]
        text = f"checkpoints: {self.count} file(s), {self.bytes} bytes from {where} to " + (
            f"{', '.join(copied)} ({self.method})" if copied else "no node"
        )
        held = [h for h, what in self.nodes.items() if what.startswith("up to date")]
        if held:
            text += f"; {', '.join(held)} already hold them, nothing sent"
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
    fleet: FanOut,
    source: RelaySource,
    targets: Sequence[RelayTarget],
    *,
    folder: str | None = None,
    shared_groups: Iterable[Sequence[str]] = (),
    policy: PushRequest = NOTHING,
    max_bytes: int = CHECKPOINT_MAX,
    report: RelayReport | None = None,
    same_folder: bool = True,
    since: float | None = None,
) -> RelayReport:
    """Copy the source's new files (those under ``folder``: the checkpoint folder once
    resolved, ``Retry.checkpoint_folder``; None: the work folder) to ``targets``' work
    folders. A source that cannot be
    reached, has nothing new or too much is a note (``skipped``); a node that could not take
    them raises ``PushError`` (its ranks would resume from another point than the rest);
    ``report``, when given, is filled in as it goes (the caller keeps it then).
    ``policy``: the job's push, whose allowed key-like files the node's scan lets through.
    ``same_folder`` False (``run --resume``: an earlier job's folder, not the targets' own):
    the source node and those sharing its workdir get a copy too; ``since``: see
    ``relay_files`` on the node."""
    report = report or RelayReport(source.node.name, source.attempt, folder)
    conn, own = _source_connection(fleet, source, report)
    if conn is None:
        return report
    pack_opts = (folder, policy, max_bytes, since)
    try:
        try:
            listed = _pack(source, conn, *pack_opts, pack=False)
        except FleetctlError as e:
            report.skipped = f"cannot read its work folder: {e.one_line()}"
            return report
        report.files, report.count = list(listed.get("files") or []), int(listed.get("count", 0))
        report.bytes, report.secrets = int(listed.get("bytes", 0)), listed.get("secrets") or []
        if not report.count:
            report.skipped = "no new files in " + str(listed.get("root") or source.work_dir)
            return report
        if report.bytes > max_bytes:
            report.skipped = f"{report.bytes} bytes, over the relay cap of {max_bytes}"
            return report
        names, notes = plan_targets(
            source.node.name if same_folder else "", [t.node.name for t in targets], shared_groups
        )
        report.nodes.update(notes)
        todo = [t for t in targets if t.node.name in names]
        manifest: dict[str, list[Any]] = listed.get("manifest") or {}
        base = {
            "dir": folder,
            "source_id": listed.get("workdir_id") if same_folder else None,
        }
        failed: dict[str, BaseException] = {}
        for missing, group in _missing_sets(fleet, todo, manifest, base, report).items():
            if missing:
                _send_set(
                    fleet,
                    source,
                    conn,
                    sorted(missing),
                    group,
                    base,
                    report,
                    failed,
                    pack=pack_opts,
                    hosts=len(targets) + 1,
                )
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
        if own:
            conn.close()


def _pack(
    source: RelaySource,
    conn: Connection,
    folder: str | None,
    policy: PushRequest,
    max_bytes: int,
    since: float | None = None,
    *,
    pack: bool,
    only: Sequence[str] | None = None,
    tar: str | None = None,
    manifest: bool | None = None,
) -> dict[str, Any]:
    """``relay-pack`` on the source: the list with sizes and sha256 (``pack=False``; without
    the sha256: ``manifest=False``), or the tar of ``only`` those files."""
    return _helper(
        source.node,
        conn,
        "relay-pack",
        {
            "workdir": source.node.workdir,
            "work": source.work_dir,
            "cwd": source.cwd,
            "seed": source.code_dir,
            "dir": folder,
            "tar": tar or f".tmp-relay-{secrets.token_hex(6)}.tar",
            "max_bytes": max_bytes,
            **policy.node_scan(),
            "manifest": (not pack) if manifest is None else manifest,
            "pack": pack,
            "only": None if only is None else list(only),
            "since": since,
        },
        600,
    )


def list_checkpoints(
    source: RelaySource,
    settings: SSHSettings | None,
    *,
    folder: str | None = None,
    policy: PushRequest = NOTHING,
    since: float | None = None,
) -> dict[str, Any]:
    """What the source would relay, listed on its node over a connection of its own (no tar,
    no sha256): ``count``, ``bytes``, ``files`` (the first names), ``root`` (the folder read).
    ``run --resume`` asks it before anything starts. Raises ConnectError, NodePushError."""
    from fleetctl.transport.connection import connect

    conn = connect(source.node, settings)
    try:
        return _pack(
            source,
            conn,
            folder,
            policy,
            CHECKPOINT_MAX,
            since,
            pack=False,
            manifest=False,
        )
    finally:
        conn.close()


def _missing_sets(
    fleet: FanOut,
    todo: Sequence[RelayTarget],
    manifest: dict[str, list[Any]],
    base: dict[str, Any],
    report: RelayReport,
) -> dict[frozenset[str], list[RelayTarget]]:
    """Ask every target at once which of the source's files it already holds (same size and
    sha256: what the last retry relayed to it); the targets grouped by what they lack. A node
    that holds them all is noted and sent nothing; one that cannot answer is sent everything
    (its ``relay-apply`` then says what is wrong)."""
    everything = frozenset(manifest)
    if not todo:
        return {}

    def ask(node: Node, c: Connection) -> dict[str, Any]:
        t = _target(todo, node)
        cfg = {"workdir": node.workdir, "work": t.work_dir, "cwd": t.cwd, "seed": t.code_dir}
        return _helper(
            node,
            c,
            "relay-have",
            {**cfg, **base, "manifest": manifest},
            _timeout(sum(int(v[0]) for v in manifest.values())),
        )

    res = fleet.map(ask, nodes=[t.node for t in todo], timeout=_timeout(report.bytes) + 60)
    groups: dict[frozenset[str], list[RelayTarget]] = {}
    for t in todo:
        out = res[t.node.name]
        if isinstance(out, BaseException) or not isinstance(out, dict):
            groups.setdefault(everything, []).append(t)
        elif out.get("shared"):
            report.nodes[t.node.name] = "shares its workdir with the source"
        else:
            missing = everything - set(out.get("have") or ())
            if not missing:
                report.nodes[t.node.name] = f"up to date ({len(everything)} file(s) there)"
                report.sent[t.node.name] = 0
            groups.setdefault(missing, []).append(t)
    return groups


def _send_set(
    fleet: FanOut,
    source: RelaySource,
    conn: Connection,
    files: Sequence[str],
    todo: list[RelayTarget],
    base: dict[str, Any],
    report: RelayReport,
    failed: dict[str, BaseException],
    *,
    pack: tuple[str | None, PushRequest, int, float | None],
    hosts: int,
) -> None:
    """Tar ``files`` on the source and get the tar to ``todo`` (by peer, else the controller)."""
    tar = f".tmp-relay-{secrets.token_hex(6)}.tar"
    packed: dict[str, Any] = {}
    try:
        try:
            packed = _pack(source, conn, *pack, pack=True, only=files, tar=tar)
        except FleetctlError as e:
            for t in todo:
                failed[t.node.name] = e
            return
        size = int(packed["size"])
        method = relay_method(hosts, size, source.train_addr)
        report.method = "peer" if "peer" in (report.method, method) else method
        sent = {**base, "sha": packed["sha"], "size": size}
        left = todo
        if method == "peer":
            try:
                left = _by_peer(fleet, source, conn, packed, sent, todo, report)
            except Exception:  # no server on the source: the controller sends it instead
                left = todo
        if left:
            _by_controller(fleet, source, conn, packed, sent, left, report, failed)
        of = "" if len(files) == report.count else f" {len(files)} of {report.count} file(s)"
        for t in todo:
            name = t.node.name
            if name not in failed and report.nodes.get(name, "").startswith("copied"):
                report.nodes[name] += of
                report.sent[name] = int(packed.get("bytes", 0))
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


def _source_connection(
    fleet: FanOut, source: RelaySource, report: RelayReport
) -> tuple[Connection | None, bool]:
    """The fleet's connection when the source runs this attempt too, else a new one."""
    from fleetctl.transport.connection import connect

    try:
        if any(n.name == source.node.name for n in fleet.nodes):
            return fleet.connection(source.node), False
        return connect(source.node, fleet.settings), True
    except FleetctlError as e:
        report.skipped = f"unreachable: {e.one_line()}"
    return None, False


def _by_peer(
    fleet: FanOut,
    source: RelaySource,
    conn: Connection,
    packed: dict[str, Any],
    base: dict[str, Any],
    todo: list[RelayTarget],
    report: RelayReport,
) -> list[RelayTarget]:
    """Every node fetches the tar from the source's training address; returns those whose
    fetch failed (the controller sends them the tar)."""
    # not at import: the CLI checks --checkpoint-dir here
    from fleetctl.phases.push.serving import start_serve, stop_serve

    try:
        srv = start_serve(
            source.node,
            conn,
            path=packed["tar"],
            sha=packed["sha"],
            bind=source.train_addr,
            timeout=_timeout(int(packed["size"])),
            remove=False,
        )
    except NodePushError:
        return todo

    def fetch(node: Node, c: Connection) -> dict[str, Any]:
        peers = {"peers": [srv.peer()]}
        return _apply(node, c, _target(todo, node), {**base, "fetch": peers, "fetch_timeout": 60})

    try:
        res = fleet.map(fetch, nodes=[t.node for t in todo], timeout=_timeout(int(packed["size"])))
    finally:
        stop_serve(srv.stream)
    left = []
    for t in todo:
        out = res[t.node.name]
        if isinstance(out, BaseException):
            left.append(t)
        else:
            report.nodes[t.node.name] = _said(out, f"copied from {source.node.name}")
    return left


def _by_controller(
    fleet: FanOut,
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
    from fleetctl.phases.push.nodecall import call_mode  # not at import: see _by_peer

    payload = call_mode(
        node, conn, "push_helper.py", mode, cfg, timeout, failed=f"{mode}: no answer"
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
