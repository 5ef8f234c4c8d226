"""Push phase: ship the code snapshot and the conda-pack env to every node, then prove they work.

Per node, in the common cases: a no-op push is ONE remote command (probe: is
``W/code/<digest>`` there, is ``W/envs/<sha256>`` there and does its python load NCCL); a full
push is probe, rsync (real OpenSSH with fleetctl's trust settings), an SFTP upload of the
archive and ONE finalize command (rename code, unpack env into a temp dir, rewrite prefixes for
the final location, rename, verify). Large fleets fetch the archive from already-served peers
over the training network through a short-lived token-protected HTTP server, so the
controller's uplink carries the archive about once. Every node's outcome is kept; any failure
raises ``PushError`` whose ``result`` maps each node to its ``NodePush`` or its error.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import FleetctlError, NodePushError, PushError, UsageError
from fleetctl.phases import codesync
from fleetctl.phases.envpack import EnvArchive, archive_info, human_bytes, nccl_version
from fleetctl.phases.frames import PUSH_KINDS, FrameStream, last_data
from fleetctl.results import FleetResult
from fleetctl.ssh.connection import SSHConnection

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.ssh.connection import Connection, Stream
    from fleetctl.ssh.fleet import Fleet

REMOTE_SRC = remote.source("push_helper.py").decode("utf-8")
ENVINFO_SRC = remote.source("envinfo.py").decode("utf-8")  # run by the env's python
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar")


# ----------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class PushEvent:
    """Progress of one node, for a live display. ``stage``: probe, code, upload, fetch,
    finalize, done, failed. ``done``/``total`` are bytes for transfers, else 0."""

    node: str
    stage: str
    done: int = 0
    total: int = 0
    message: str = ""


ProgressFn = Callable[[PushEvent], None]


@dataclass(frozen=True)
class PushOptions:
    """How to push. ``peer`` None = peer distribution when at least ``peer_min_nodes`` nodes
    need the same archive; ``train_addrs`` (node name -> training-network address, from check
    facts) is where seed servers listen; ``require_nccl`` when the job uses the nccl backend."""

    keep_snapshots: int = 5
    require_nccl: bool = False
    check_torch: bool = False
    peer: bool | None = None
    peer_min_nodes: int = 4
    peer_fanout: int = 2
    seeds: int = 1
    train_addrs: Mapping[str, str] = field(default_factory=dict)
    use_rsync: bool = True
    transfer_timeout: float = 1800.0
    command_timeout: float = 300.0
    verify_timeout: float = 120.0
    server_timeout: float = 1800.0
    # Nodes where a preflight made moments ago (not a cached one) found this very code
    # snapshot: when they need no env either, there is nothing to probe or send.
    known_present: frozenset[str] = frozenset()


@dataclass
class NodePush:
    """What push did on one node. ``bytes_sent`` counts controller -> node payload bytes
    (rsync's "Total bytes sent", SFTP uploads); peer fetches cost the controller nothing."""

    node: str
    workdir: str = ""
    code_dir: str | None = None
    code_method: str | None = None  # present | rsync | sftp
    env_sha256: str | None = None
    env_dir: str | None = None
    env_method: str | None = None  # present | sftp | peer
    env_source: str | None = None  # the peer a fetched archive came from
    bytes_sent: int = 0
    nccl_version: str | None = None
    nccl_path: str | None = None
    python_version: str | None = None
    torch_version: str | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PushReport:
    """The phase's result. ``code_dir`` is relative to each node's workdir (``code/<digest>``);
    ``code_dirs``/``env_dirs`` are absolute per node. ``env_dirs`` is None when no env was
    pushed; the run phase puts ``<env_dir>/bin`` first on PATH."""

    nodes: dict[str, NodePush]
    code_digest: str | None = None
    code_dir: str | None = None
    code_dirs: dict[str, str] = field(default_factory=dict)
    env_sha256: dict[str, str] = field(default_factory=dict)
    env_dirs: dict[str, str] | None = None
    nccl_versions: dict[str, str | None] = field(default_factory=dict)
    controller_bytes: int = 0
    archive_bytes: int = 0
    peer_fetches: int = 0
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_by_node(self) -> dict[str, int]:
        return {k: v.bytes_sent for k, v in self.nodes.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = {k: v.to_dict() for k, v in self.nodes.items()}
        return d


def env_path_prefix(report: PushReport, node: str) -> str | None:
    """``<env>/bin`` to put first on PATH for ``node``'s job (None without an env)."""
    if not report.env_dirs or node not in report.env_dirs:
        return None
    return report.env_dirs[node].rstrip("/") + "/bin"


def push(
    fleet: Fleet,
    *,
    code: str | Path | None,
    env_archive: str | Path | None = None,
    options: PushOptions | None = None,
    progress: ProgressFn | None = None,
) -> PushReport:
    """Push code and env to every node of ``fleet`` (connected or not); verify the env.

    ``env_archive`` None uses each node's ``fleetctl_env_archive``. Raises UsageError for bad
    local input, PushError (every node's outcome in ``.result``, the partial report in
    ``.report``) when any node failed or NCCL versions disagree.
    """
    return _Push(fleet, code, env_archive, options or PushOptions(), progress).run()


# ------------------------------------------------------------------------------ internals


@dataclass
class _State:
    """One node's mutable push state between phases."""

    node: Node
    result: NodePush
    archive: EnvArchive | None = None
    workdir: str = ""
    rsync: str | None = None
    free: int = 0
    code_present: bool = False
    code_prev: str | None = None
    prev_manifest: dict[str, list] | None = None
    env_present: bool = False
    verify: dict[str, Any] | None = None
    code_pending: dict[str, Any] | None = None
    kept_archive: str | None = None  # archive name kept under W/envs to serve peers
    t0: float = field(default_factory=time.monotonic)


@dataclass
class _Server:
    node: str
    stream: Stream
    host: str
    port: int
    token: str


class _FetchFailed(Exception):
    """A peer fetch failed in a way a direct upload can fix."""


class _Push:
    def __init__(
        self,
        fleet: Fleet,
        code: str | Path | None,
        env_archive: str | Path | None,
        options: PushOptions,
        progress: ProgressFn | None,
    ) -> None:
        self.fleet, self.options = fleet, options
        self._progress = progress
        self.t0 = time.monotonic()
        self.snap = codesync.snapshot(code) if code is not None else None
        self.archives = self._archives(env_archive)
        self.states: dict[str, _State] = {}  # nodes still in the push
        self._every: dict[str, _State] = {}
        self._fetchers: set[str] = set()
        self._seeds: dict[str, list[_State]] = {}
        self.outcomes: dict[str, NodePush | BaseException] = {}
        self.warnings: list[str] = []
        self.peer_fetches = 0
        self._lock = threading.Lock()
        self._have_local_rsync = shutil.which("rsync") is not None

    # -- helpers ---------------------------------------------------------------------------
    def emit(self, node: str, stage: str, done: int = 0, total: int = 0, message: str = "") -> None:
        if self._progress is not None:
            with contextlib.suppress(Exception):  # a display bug never fails a push
                self._progress(PushEvent(node, stage, done, total, message))

    def _archives(self, override: str | Path | None) -> dict[str, EnvArchive]:
        by_path: dict[str, EnvArchive] = {}
        out: dict[str, EnvArchive] = {}
        for node in self.fleet.nodes:
            path = override or node.env_archive
            if not path:
                continue
            key = str(Path(path).expanduser())
            if not key.endswith(ARCHIVE_SUFFIXES):
                raise UsageError(
                    f"env archive {key}"
                    + (f" (host {node.name})" if not override else "")
                    + ": not a tar archive; pack it with `conda-pack --format tar.gz`"
                )
            if key not in by_path:
                by_path[key] = archive_info(key)
            out[node.name] = by_path[key]
        return out

    def _fail(self, st: _State, err: BaseException) -> None:
        with self._lock:
            self.outcomes[st.node.name] = err
            self.states.pop(st.node.name, None)
        self.emit(st.node.name, "failed", message=_one_line(err))

    def _map(
        self, fn: Callable[[_State, Connection], None], states: list[_State], timeout: float
    ) -> None:
        """Run ``fn`` per node; a node whose ``fn`` raised leaves ``states`` with its error."""
        if not states:
            return
        by_name = {st.node.name: st for st in states}
        res = self.fleet.map(
            lambda n, c: fn(by_name[n.name], c), timeout=timeout, nodes=[st.node for st in states]
        )
        for name, value in res.outcomes.items():
            if isinstance(value, BaseException):
                self._fail(by_name[name], _node_error(by_name[name].node, value))

    # -- the phase -------------------------------------------------------------------------
    def run(self) -> PushReport:
        for node in self.fleet.nodes:
            arch = self.archives.get(node.name)
            self.states[node.name] = self._every[node.name] = _State(
                node, NodePush(node.name, env_sha256=arch.sha256 if arch else None), arch
            )
        to_probe = [st for st in self.states.values() if not self._known_present(st)]
        self._map(self._probe, to_probe, self.options.command_timeout + self.options.verify_timeout)
        fetchers = self._plan_env()
        self._fetchers = {st.node.name for st in fetchers}
        self._map(
            self._send_and_finalize, list(self.states.values()), self.options.transfer_timeout
        )
        self._distribute([st for st in fetchers if st.node.name in self.states])
        for st in list(self.states.values()):
            self._conclude(st)
        self._check_nccl()
        return self._report()

    # probe ---------------------------------------------------------------------------------
    def _known_present(self, st: _State) -> bool:
        """The preflight already saw this snapshot on the node and no env is wanted: record it
        as present without a remote command (a no-op push costs nothing in `fleetctl run`)."""
        if self.snap is None or st.archive is not None:
            return False
        if st.node.name not in self.options.known_present:
            return False
        try:
            workdir = self.fleet.connection(st.node).expand(st.node.workdir)
        except Exception:  # the probe will say what is wrong with this node
            return False
        st.workdir = st.result.workdir = workdir
        st.code_present = True
        st.result.code_dir = f"{workdir}/code/{self.snap.digest}"
        st.result.code_method = "present"
        self.emit(st.node.name, "present")
        return True

    def _probe(self, st: _State, conn: Connection) -> None:
        node = st.node
        self.emit(node.name, "probe")
        cfg: dict[str, Any] = {
            "workdir": node.workdir,
            "keep": self.options.keep_snapshots,
            "want_manifest": True
            if self.options.use_rsync and self._have_local_rsync
            else "always",
            "check_torch": self.options.check_torch,
            "verify_timeout": self.options.verify_timeout,
        }
        if self.snap is not None:
            cfg["digest"] = self.snap.digest
        if st.archive is not None:
            cfg["env_sha"] = st.archive.sha256
        out = self._remote(
            node, conn, "probe", cfg, self.options.command_timeout + self.options.verify_timeout
        )
        if isinstance(conn, SSHConnection):
            conn.set_home(out["home"])
        st.workdir = st.result.workdir = out["workdir"]
        st.rsync, st.free = out.get("rsync"), int(out.get("free", 0))
        st.code_present = bool(out.get("code_present"))
        st.code_prev = out.get("code_prev")
        st.prev_manifest = out.get("code_prev_manifest")
        st.env_present = bool(out.get("env_present"))
        st.verify = out.get("verify")
        if self.snap is not None and st.code_present:
            st.result.code_dir = f"{st.workdir}/code/{self.snap.digest}"
            st.result.code_method = "present"
        if st.archive is not None and st.env_present:
            st.result.env_dir = f"{st.workdir}/envs/{st.archive.sha256}"
            st.result.env_method = "present"

    def _plan_env(self) -> list[_State]:
        """Disk check for nodes missing their env; choose peer groups. Returns the fetchers."""
        needing: dict[str, list[_State]] = collections.defaultdict(list)
        for st in list(self.states.values()):
            if st.archive is None or st.env_present:
                continue
            need = 2 * st.archive.size
            if st.free < need:
                self._fail(
                    st,
                    NodePushError(
                        st.node.label,
                        f"not enough disk space in {st.workdir}/envs: "
                        f"{human_bytes(st.free)} free, need {human_bytes(need)} "
                        f"(2x the {human_bytes(st.archive.size)} archive)",
                        stage="disk",
                        enospc=True,
                    ),
                )
                continue
            needing[st.archive.sha256].append(st)
        fetchers: list[_State] = []
        for sha, group in needing.items():
            use_peer = self.options.peer
            if use_peer is None:
                use_peer = len(group) >= self.options.peer_min_nodes
            if not use_peer or len(group) < 2:
                continue
            n_seeds = max(1, min(self.options.seeds, len(group) - 1))
            self._seeds[sha] = group[:n_seeds]
            fetchers += group[n_seeds:]
        return fetchers

    # code ----------------------------------------------------------------------------------
    def _send_code(self, st: _State, conn: Connection) -> None:
        snap = self.snap
        if snap is None or st.code_present or st.code_pending is not None:
            return
        tmp = f".tmp-{snap.digest}-{secrets.token_hex(4)}"
        pending: dict[str, Any] = {"digest": snap.digest, "tmp": tmp, "manifest": snap.manifest}
        if self.options.use_rsync and st.rsync and self._have_local_rsync:
            st.result.bytes_sent += self._rsync(st, conn, tmp)
            st.result.code_method = "rsync"
        else:
            why = (
                "rsync not found on the node"
                if not st.rsync
                else "rsync not found on this machine"
                if not self._have_local_rsync
                else "rsync disabled"
            )
            st.result.warnings.append(f"{why}: code sent over SFTP (content-hash delta)")
            prev = st.prev_manifest or {}
            reuse = [rel for rel, e in snap.manifest.items() if prev.get(rel) == e]
            changed = [rel for rel in snap.manifest if prev.get(rel) != snap.manifest[rel]]
            with tempfile.TemporaryDirectory(prefix="fleetctl-push-") as td:
                tar_path = Path(td) / "code.tar.gz"
                with tarfile.open(tar_path, "w:gz", compresslevel=6) as tf:
                    for rel in changed:
                        tf.add(snap.root / rel, arcname=rel, recursive=False)
                name = tmp + ".tar"
                st.result.bytes_sent += self._upload(
                    st, conn, tar_path, f"{st.workdir}/code/{name}", "code"
                )
            pending.update(tar=name, prev=st.code_prev if reuse else None, reuse=reuse)
            st.result.code_method = "sftp"
        st.code_pending = pending

    def _rsync(self, st: _State, conn: Connection, tmp: str) -> int:
        snap, node = self.snap, st.node
        assert snap is not None
        dest = f"{st.workdir}/code/{tmp}"
        link = f"{st.workdir}/code/{st.code_prev}" if st.code_prev else None
        with tempfile.NamedTemporaryFile("wb", prefix="fleetctl-files-", delete=False) as f:
            f.write(b"\0".join(rel.encode("utf-8", "surrogateescape") for rel in snap.files))
            listing = f.name
        timeout = self.options.transfer_timeout
        argv = codesync.rsync_argv(
            node,
            self.fleet.settings,
            snap.root,
            dest,
            files_from=listing,
            link_dest=link,
            io_timeout=int(min(timeout, 300)),
        )
        self.emit(node.name, "code", 0, snap.total_bytes)
        try:
            code, out, err = _run_streaming(
                argv, timeout, lambda done: self.emit(node.name, "code", done, snap.total_bytes)
            )
        finally:
            os.unlink(listing)
        if code != 0:
            with contextlib.suppress(Exception):
                self._remote(
                    node, conn, "cleanup", {"workdir": st.workdir, "code_paths": [tmp]}, 60
                )
            last = (err.strip().splitlines() or [f"exit {code}"])[-1]
            full = "No space left on device" in err
            raise NodePushError(
                node.label,
                f"rsync of the code failed (exit {code}): {last}",
                stage="code",
                enospc=full,
            )
        m = re.search(r"Total bytes sent:\s*([\d,.]+)", out)
        return int(re.sub(r"[,.]", "", m.group(1))) if m else 0

    # env -----------------------------------------------------------------------------------
    def _upload(self, st: _State, conn: Connection, local: Path, remote: str, stage: str) -> int:
        """SFTP ``local`` to ``remote`` (absolute) through ``.part`` + rename; bytes sent."""
        size = local.stat().st_size
        node = st.node
        self.emit(node.name, stage, 0, size)

        def tick(done: int, total: int) -> None:
            self.emit(node.name, stage, done, total or size)

        part = remote + ".part"
        try:
            if isinstance(conn, SSHConnection):
                sftp = conn.client.open_sftp()  # own channel: parallel uploads don't serialise
                try:
                    sftp.put(str(local), part, callback=tick, confirm=True)
                    sftp.posix_rename(part, remote)
                finally:
                    sftp.close()
            else:
                _copy_local(local, part, tick)
                os.replace(part, remote)
        except Exception as e:
            free = None
            with contextlib.suppress(Exception):
                base, name = remote.rsplit("/", 1)
                key = "env_paths" if base.endswith("/envs") else "code_paths"
                free = self._remote(
                    node, conn, "cleanup", {"workdir": st.workdir, key: [name, name + ".part"]}, 60
                ).get("free")
            enospc = getattr(e, "errno", None) == 28 or (free is not None and free < size)
            what = "env archive" if stage == "upload" else "code"
            if enospc:
                msg = (
                    f"disk full while uploading the {what} to {remote.rsplit('/', 1)[0]} "
                    f"({human_bytes(free or 0)} free); partial files removed"
                )
            else:
                msg = f"upload of the {what} failed: {_one_line(e)}; partial files removed"
            raise NodePushError(node.label, msg, stage="upload", enospc=enospc) from e
        return size

    def _send_and_finalize(self, st: _State, conn: Connection) -> None:
        """Stage A: code for all; direct/seed upload and one finalize for all but fetchers."""
        self._send_code(st, conn)
        if st.node.name in self._fetchers:
            return  # code is renamed into place by the fetch's finalize
        env: dict[str, Any] | None = None
        arch = st.archive
        if arch is not None and not st.env_present:
            seed = any(st is s for s in self._seeds.get(arch.sha256, []))
            name = f".tmp-{arch.sha256[:16]}-{secrets.token_hex(4)}.archive"
            st.result.bytes_sent += self._upload(
                st, conn, arch.path, f"{st.workdir}/envs/{name}", "upload"
            )
            env = {"sha": arch.sha256, "archive": name, "size": arch.size, "keep_archive": seed}
            st.result.env_method = "sftp"
            if seed:
                st.kept_archive = name
        self._finalize(st, conn, env)

    def _finalize(self, st: _State, conn: Connection, env: dict[str, Any] | None) -> None:
        if st.code_pending is None and env is None:
            return
        node = st.node
        self.emit(node.name, "finalize")
        cfg: dict[str, Any] = {
            "workdir": node.workdir,
            "check_torch": self.options.check_torch,
            "verify_timeout": self.options.verify_timeout,
        }
        if st.code_pending is not None:
            cfg["code"] = st.code_pending
        if env is not None:
            cfg["env"] = env
        out = self._remote(node, conn, "finalize", cfg, self.options.transfer_timeout)
        if st.code_pending is not None:
            st.result.code_dir, st.code_pending = out["code_dir"], None
        if env is None:
            return
        if out.get("env_error"):
            st.kept_archive = None
            if out.get("env_stage") == "fetch" and not out.get("enospc"):
                raise _FetchFailed(out["env_error"])
            if out.get("enospc"):
                raise NodePushError(
                    node.label,
                    f"disk full in {st.workdir}/envs during {out.get('env_stage')} "
                    f"({human_bytes(int(out.get('free') or 0))} free): {out['env_error']}; "
                    "partial files removed",
                    stage=out.get("env_stage", "unpack"),
                    enospc=True,
                )
            raise NodePushError(
                node.label,
                f"env {out.get('env_stage')} failed: {out['env_error']}; partial files removed",
                stage=out.get("env_stage", "unpack"),
            )
        st.result.env_dir = out["env_dir"]
        st.verify = out.get("verify")
        if out.get("fetched"):
            st.result.env_source = out["fetched"].get("peer")

    # peer distribution ---------------------------------------------------------------------
    def _distribute(self, fetchers: list[_State]) -> None:
        """Waves: every node holding the archive serves up to ``peer_fanout`` fetchers; a
        fetched node serves the next wave. Fetch failures fall back to a direct upload."""
        by_sha: dict[str, list[_State]] = collections.defaultdict(list)
        for st in fetchers:
            assert st.archive is not None
            by_sha[st.archive.sha256].append(st)
        for sha, pending in by_sha.items():
            holders = [
                s for s in self._seeds.get(sha, []) if s.node.name in self.states and s.kept_archive
            ]
            servers: dict[str, _Server] = {}
            fallback: list[tuple[_State, str]] = []
            try:
                while pending:
                    new = [h for h in holders if h.node.name not in servers]
                    self._map(lambda h, c, _s=servers: self._start_server(h, c, _s), new, 60)
                    live = [servers[h.node.name] for h in holders if h.node.name in servers]
                    if not live:
                        fallback += [(st, "no peer could serve the archive") for st in pending]
                        break
                    slots = [srv for srv in live for _ in range(max(1, self.options.peer_fanout))]
                    batch, pending = pending[: len(slots)], pending[len(slots) :]
                    keep = bool(pending)
                    failed: dict[str, str] = {}

                    def fetch_one(
                        st: _State,
                        conn: Connection,
                        _batch: list = batch,
                        _slots: list = slots,
                        _live: list = live,
                        _keep: bool = keep,
                        _failed: dict = failed,
                    ) -> None:
                        mine = _slots[_batch.index(st)]
                        order = [mine] + [s for s in _live if s is not mine]
                        self._fetch(st, conn, order, _keep, _failed)

                    self._map(fetch_one, batch, self.options.transfer_timeout)
                    for st in batch:
                        if st.node.name in failed:
                            fallback.append((st, failed[st.node.name]))
                        elif st.node.name in self.states and keep and st.kept_archive:
                            holders.append(st)
            finally:
                self._stop_servers(servers)
                self._drop_unserved(holders, servers)
            for st, why in fallback:
                st.result.warnings.append(f"peer fetch failed ({why}); archive sent directly")
            self._map(
                lambda st, c: self._direct_env(st, c),
                [st for st, _ in fallback],
                self.options.transfer_timeout,
            )

    def _fetch(
        self, st: _State, conn: Connection, order: list[_Server], keep: bool, failed: dict[str, str]
    ) -> None:
        arch = st.archive
        assert arch is not None
        name = f".tmp-{arch.sha256[:16]}-{secrets.token_hex(4)}.archive"
        peers = [{"name": s.node, "host": s.host, "port": s.port, "token": s.token} for s in order]
        env = {
            "sha": arch.sha256,
            "archive": name,
            "size": arch.size,
            "keep_archive": keep,
            "fetch": {"peers": peers},
            "fetch_timeout": 60,
        }
        self.emit(st.node.name, "fetch", 0, arch.size, f"from {order[0].node}")
        try:
            self._finalize(st, conn, env)
        except _FetchFailed as e:
            with self._lock:
                failed[st.node.name] = str(e)
            return
        st.result.env_method = "peer"
        st.kept_archive = name if keep else None
        with self._lock:
            self.peer_fetches += 1

    def _direct_env(self, st: _State, conn: Connection) -> None:
        arch = st.archive
        assert arch is not None
        name = f".tmp-{arch.sha256[:16]}-{secrets.token_hex(4)}.archive"
        st.result.bytes_sent += self._upload(
            st, conn, arch.path, f"{st.workdir}/envs/{name}", "upload"
        )
        st.result.env_method = "sftp"
        self._finalize(st, conn, {"sha": arch.sha256, "archive": name, "size": arch.size})

    def _start_server(self, st: _State, conn: Connection, servers: dict[str, _Server]) -> None:
        node, arch = st.node, st.archive
        assert arch is not None and st.kept_archive
        bind = (
            self.options.train_addrs.get(node.name)
            or node.train_addr
            or ("127.0.0.1" if node.local else node.address)
        )
        token = secrets.token_hex(32)
        stream = conn.start([node.python, "-c", REMOTE_SRC, "serve"])
        cfg = {
            "path": f"{st.workdir}/envs/{st.kept_archive}",
            "sha": arch.sha256,
            "token": token,
            "bind": bind,
            "timeout": self.options.server_timeout,
            "remove": True,
        }
        try:
            stream.send(json.dumps(cfg).encode() + b"\n")
            frames = FrameStream(stream, PUSH_KINDS, json_kinds=PUSH_KINDS)
            got = frames.next("AD", time.monotonic() + 30)
            if got is None and not frames.eof:
                raise NodePushError(node.label, "peer server did not start in 30s", stage="serve")
            if got is None:
                raise NodePushError(
                    node.label, "peer server exited: " + frames.tail[-200:], stage="serve"
                )
            info = got.data()
            if not isinstance(info, dict) or "port" not in info:
                error = info.get("error") if isinstance(info, dict) else info
                raise NodePushError(node.label, f"peer server: {error}", stage="serve")
        except BaseException:
            with contextlib.suppress(Exception):
                stream.close_stdin()
                stream.exit_code(5)
                stream.close()
            raise
        with self._lock:
            servers[node.name] = _Server(node.name, stream, info["host"], int(info["port"]), token)

    def _stop_servers(self, servers: dict[str, _Server]) -> None:
        for srv in servers.values():  # closing stdin tells each server to exit and clean up
            with contextlib.suppress(Exception):
                srv.stream.close_stdin()
        for srv in servers.values():
            with contextlib.suppress(Exception):
                srv.stream.exit_code(15)
            with contextlib.suppress(Exception):
                srv.stream.close()
            st = self.states.get(srv.node)
            if st is not None:
                st.kept_archive = None

    def _drop_unserved(self, holders: list[_State], servers: dict[str, _Server]) -> None:
        """Archives kept for a wave that never came: remove them."""
        left = [h for h in holders if h.kept_archive and h.node.name not in servers]

        def drop(st: _State, conn: Connection) -> None:
            self._remote(
                st.node,
                conn,
                "cleanup",
                {"workdir": st.workdir, "env_paths": [st.kept_archive]},
                60,
            )
            st.kept_archive = None

        with contextlib.suppress(Exception):
            self._map(drop, left, 120)

    # verify --------------------------------------------------------------------------------
    def _conclude(self, st: _State) -> None:
        """Turn the node's verify output into its NodePush (or its error)."""
        res, node = st.result, st.node
        res.seconds = round(time.monotonic() - st.t0, 3)
        if st.archive is not None:
            v = st.verify or {"error": "env was not verified"}
            if v.get("error"):
                self._fail(
                    st,
                    NodePushError(node.label, f"env {res.env_dir}: {v['error']}", stage="verify"),
                )
                return
            res.python_version = v.get("python")
            res.nccl_path = v.get("nccl_path")
            if v.get("nccl_code") is not None:
                res.nccl_version = nccl_version(int(v["nccl_code"]))
            elif self.options.require_nccl:
                why = v.get("nccl_error") or "no libnccl.so.2 in lib/ or site-packages/nvidia"
                self._fail(
                    st,
                    NodePushError(
                        node.label,
                        f"env {res.env_dir} has no usable NCCL ({why}) but the job uses nccl",
                        stage="nccl",
                    ),
                )
                return
            elif v.get("nccl_error"):
                res.warnings.append(f"libnccl.so.2 does not load: {v['nccl_error']}")
            if self.options.check_torch:
                if v.get("torch_error"):
                    self._fail(
                        st,
                        NodePushError(
                            node.label,
                            f"`import torch` fails in the env: {v['torch_error']}",
                            stage="verify",
                        ),
                    )
                    return
                res.torch_version = v.get("torch")
        with self._lock:
            self.outcomes[node.name] = res
        self.emit(node.name, "done", message=_summary(res))

    def _check_nccl(self) -> None:
        ok = {
            k: v
            for k, v in self.outcomes.items()
            if isinstance(v, NodePush) and v.nccl_version is not None
        }
        counts = collections.Counter(v.nccl_version for v in ok.values())
        if len(counts) < 2:
            return
        first = next(iter(ok.values())).nccl_version
        top = max(counts.values())
        majority = first if counts[first] == top else counts.most_common(1)[0][0]
        agree = sorted(k for k, v in ok.items() if v.nccl_version == majority)
        for name, res in ok.items():
            if res.nccl_version != majority:
                node = next(n for n in self.fleet.nodes if n.name == name)
                self.outcomes[name] = NodePushError(
                    node.label,
                    f"NCCL {res.nccl_version} differs from NCCL {majority} on "
                    f"{_names(agree)} (env {res.env_sha256 and res.env_sha256[:12]})",
                    stage="nccl",
                )
                self.emit(name, "failed", message=f"NCCL {res.nccl_version} != {majority}")

    def _report(self) -> PushReport:
        order = [n.name for n in self.fleet.nodes]
        nodes = {k: self.outcomes[k] for k in order if isinstance(self.outcomes.get(k), NodePush)}
        pushed: dict[str, NodePush] = nodes  # type: ignore[assignment]
        report = PushReport(
            nodes=pushed,
            code_digest=self.snap.digest if self.snap else None,
            code_dir=f"code/{self.snap.digest}" if self.snap else None,
            code_dirs={k: v.code_dir for k, v in pushed.items() if v.code_dir},
            env_sha256={k: v.env_sha256 for k, v in pushed.items() if v.env_sha256},
            env_dirs={k: v.env_dir for k, v in pushed.items() if v.env_dir}
            if self.archives
            else None,
            nccl_versions={k: v.nccl_version for k, v in pushed.items() if v.env_dir},
            controller_bytes=sum(v.bytes_sent for v in pushed.values()),
            archive_bytes=max((a.size for a in self.archives.values()), default=0),
            peer_fetches=self.peer_fetches,
            warnings=[f"{k}: {w}" for k, v in pushed.items() for w in v.warnings],
            seconds=round(time.monotonic() - self.t0, 3),
        )
        failed = {k: v for k, v in self.outcomes.items() if isinstance(v, BaseException)}
        if failed:
            result: FleetResult[NodePush] = FleetResult(
                {k: self.outcomes[k] for k in order if k in self.outcomes}
            )
            first = _one_line(next(iter(failed.values())))
            err = PushError(f"push failed on {len(failed)} of {len(order)} nodes: {first}", result)
            err.report = report  # type: ignore[attr-defined]
            report.controller_bytes += sum(
                st.result.bytes_sent for st in self._every.values() if st.node.name in failed
            )
            raise err
        return report

    # remote --------------------------------------------------------------------------------
    def _remote(
        self, node: Node, conn: Connection, mode: str, cfg: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        """One node-side command; its JSON answer. Raises NodePushError with the reason."""
        if mode in ("probe", "finalize"):  # these may verify an env
            cfg = {**cfg, "envinfo": ENVINFO_SRC}
        res = conn.run(
            [node.python, "-c", REMOTE_SRC, mode],
            timeout=timeout,
            stdin=json.dumps(cfg).encode() + b"\n",
        )
        payload = last_data(res.stdout)
        if not isinstance(payload, dict):
            payload = None
        if payload is None:
            tail = (res.stderr.strip() or res.stdout.strip()).splitlines()
            last = tail[-1] if tail else ""
            if res.exit_code == 127:
                raise NodePushError(
                    node.label,
                    f"python {node.python!r} not found on the node "
                    "(set fleetctl_python in the inventory)",
                    stage=mode,
                )
            raise NodePushError(
                node.label,
                f"push {mode} failed (exit {res.exit_code})" + (f": {last}" if last else ""),
                stage=mode,
            )
        if "error" in payload and mode != "finalize":
            raise NodePushError(
                node.label,
                f"{mode}: {payload['error']}",
                stage=payload.get("stage", mode),
                enospc=bool(payload.get("enospc")),
            )
        if "error" in payload:
            full = bool(payload.get("enospc"))
            raise NodePushError(
                node.label,
                ("disk full: " if full else "") + f"{payload.get('stage')}: "
                f"{payload['error']}; partial files removed",
                stage=payload.get("stage", mode),
                enospc=full,
            )
        return payload


# -------------------------------------------------------------------------------- helpers


def _node_error(node: Node, e: BaseException) -> BaseException:
    if isinstance(e, FleetctlError):
        return e
    return NodePushError(node.label, _one_line(e), stage="push")


def _one_line(e: BaseException) -> str:
    if isinstance(e, FleetctlError):
        return e.one_line()
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _names(names: list[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + (
        f" (+{len(names) - limit} more)" if len(names) > limit else ""
    )


def _summary(res: NodePush) -> str:
    parts = []
    if res.code_method:
        parts.append(f"code {res.code_method}")
    if res.env_method:
        parts.append(
            f"env {res.env_method}" + (f" from {res.env_source}" if res.env_source else "")
        )
    if res.nccl_version:
        parts.append(f"NCCL {res.nccl_version}")
    return ", ".join(parts)


def _copy_local(src: Path, dest: str, tick: Callable[[int, int], None]) -> None:
    size = src.stat().st_size
    done = 0
    with open(src, "rb") as fi, open(dest, "wb") as fo:
        for chunk in iter(lambda: fi.read(1 << 20), b""):
            fo.write(chunk)
            done += len(chunk)
            tick(done, size)


_PROGRESS = re.compile(rb"^\s*([\d,.]+)\s+\d+%")


def _run_streaming(
    argv: list[str], timeout: float, on_bytes: Callable[[int], None]
) -> tuple[int, str, str]:
    """Run rsync, reporting ``--info=progress2`` byte counts; kill it at the deadline."""
    import select

    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errf,
            start_new_session=True,
        )
        assert proc.stdout is not None
        out = bytearray()
        pending = b""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rsync did not finish in {timeout:g}s")
                ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
                pending += chunk
                *lines, pending = re.split(rb"[\r\n]", pending)
                for line in lines:
                    m = _PROGRESS.match(line)
                    if m:
                        on_bytes(int(re.sub(rb"[,.]", b"", m.group(1))))
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
            raise
        finally:
            proc.stdout.close()
        errf.seek(0)
        err = errf.read().decode(errors="replace")
    return code, out.decode(errors="replace"), err
