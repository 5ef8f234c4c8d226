"""The push phase entry point: :func:`push` and the per-run ``_Push`` that probes every
node, drives the transfer and peer stages, verifies the env and builds the report."""

from __future__ import annotations

import collections
import contextlib
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import NodePushError, PushError, UsageError
from fleetctl.phases import codesync
from fleetctl.phases.envpack import EnvArchive, archive_info, human_bytes, nccl_version
from fleetctl.phases.push.nodecall import call_mode
from fleetctl.phases.push.peers import _PeerDistribution
from fleetctl.phases.push.report import NodePush, ProgressFn, PushEvent, PushOptions, PushReport
from fleetctl.phases.push.state import _node_error, _one_line, _State
from fleetctl.phases.push.transfer import _Transfer
from fleetctl.results import FleetResult

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.phases.push.request import PushRequest
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection


ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar")


def push(
    fleet: FanOut,
    what: PushRequest,
    *,
    options: PushOptions | None = None,
    progress: ProgressFn | None = None,
) -> PushReport:
    """Push ``what`` (its code, its env: without one, each node's ``fleetctl_env_archive``) to
    every node of ``fleet`` (connected or not); verify the env.

    Raises UsageError for bad local input (SecretError: a file that looks like a private key
    and is not allowed), PushError (every node's outcome in ``.result``, the partial report in
    ``.report``) when any node failed or NCCL versions disagree.
    """
    return _Push(fleet, what, options or PushOptions(), progress).run()


class _Push(_Transfer, _PeerDistribution):
    def __init__(
        self,
        fleet: FanOut,
        what: PushRequest,
        options: PushOptions,
        progress: ProgressFn | None,
    ) -> None:
        self.fleet, self.options = fleet, options
        self._progress = progress
        self.t0 = time.monotonic()
        self.snap = what.snapshot() if what.code is not None else None
        self.archives = self._archives(what)
        self.states: dict[str, _State] = {}  # nodes still in the push
        self._every: dict[str, _State] = {}
        self._fetchers: set[str] = set()
        self._seeds: dict[str, list[_State]] = {}
        self.outcomes: dict[str, NodePush | BaseException] = {}
        # about the code folder itself, not a node: files that look like checkpoints or data
        bulky = codesync.bulky_warning(self.snap) if self.snap is not None else None
        self.code_warnings: list[str] = [bulky] if bulky else []
        self.peer_fetches = 0
        self._lock = threading.Lock()
        self._have_local_rsync = shutil.which("rsync") is not None

    # -- helpers ---------------------------------------------------------------------------
    def emit(self, node: str, stage: str, done: int = 0, total: int = 0, message: str = "") -> None:
        if self._progress is not None:
            with contextlib.suppress(Exception):  # a display bug never fails a push
                self._progress(PushEvent(node, stage, done, total, message))

    def _archives(self, what: PushRequest) -> dict[str, EnvArchive]:
        by_path: dict[str, EnvArchive] = {}
        out: dict[str, EnvArchive] = {}
        for node in self.fleet.nodes:
            path, own = what.archive_of(node)
            if not path:
                continue
            key = str(Path(path).expanduser())
            if not key.endswith(ARCHIVE_SUFFIXES):
                raise UsageError(
                    f"env archive {key}"
                    + (f" (host {node.name})" if own else "")
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
        followers = self._set_aside_shared()
        fetchers = self._plan_env()
        self._fetchers = {st.node.name for st in fetchers}
        self._map(
            self._send_and_finalize, list(self.states.values()), self.options.transfer_timeout
        )
        self._distribute([st for st in fetchers if st.node.name in self.states])
        self._follow(followers)
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
            "want_manifest": True if self._rsync_reaches(conn) else "always",
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
        conn.remember_home(out["home"])
        st.workdir = st.result.workdir = out["workdir"]
        st.workdir_id = out.get("workdir_id")
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

    # shared workdirs -------------------------------------------------------------------------
    def _set_aside_shared(self) -> list[tuple[str, _State]]:
        """Nodes that see one workdir (one id in ``W/.fleetctl-id``: an NFS home) need one
        transfer: the first of each group pushes, the others wait aside as (leader name,
        state) and only check what it made (``_follow``)."""
        leaders: dict[str, str] = {}
        followers: list[tuple[str, _State]] = []
        for name, st in list(self.states.items()):
            done = (self.snap is None or st.code_present) and (st.archive is None or st.env_present)
            if st.workdir_id is None or done:
                continue
            leader = leaders.setdefault(st.workdir_id, name)
            if leader != name:
                followers.append((leader, self.states.pop(name)))
        return followers

    def _follow(self, followers: list[tuple[str, _State]]) -> None:
        """Probe the set-aside nodes again: what their leader made is there now (verified with
        their own python); a node whose leader failed pushes for itself."""
        if not followers:
            return
        for _, st in followers:
            self.states[st.node.name] = st
        sts = [st for _, st in followers]
        self._map(self._probe, sts, self.options.command_timeout + self.options.verify_timeout)
        alone = []
        for leader, st in followers:
            if st.node.name not in self.states:
                continue  # its probe failed: recorded
            code_ok = self.snap is None or st.code_present
            env_ok = st.archive is None or st.env_present
            if code_ok and env_ok:
                if self.snap is not None:
                    st.result.code_method = f"shared with {leader}"
                if st.archive is not None:
                    st.result.env_method = f"shared with {leader}"
            else:
                alone.append(st)
        self._map(self._send_and_finalize, alone, self.options.transfer_timeout)

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
            code_warnings=list(self.code_warnings),
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
            from fleetctl.phases.push.state import ENVINFO_SRC

            cfg = {**cfg, "envinfo": ENVINFO_SRC}
        payload = call_mode(
            node,
            conn,
            "push_helper.py",
            mode,
            cfg,
            timeout,
            failed=f"push {mode} failed",
            missing_python=" (set fleetctl_python in the inventory)",
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
