"""Peer distribution of the env archive: nodes that hold it serve it to the next wave over
the training network through a short-lived token-protected HTTP server."""

from __future__ import annotations

import collections
import contextlib
import secrets
from typing import TYPE_CHECKING

from fleetctl.phases.push.serving import Serving, start_serve
from fleetctl.phases.push.state import _State
from fleetctl.phases.push.waves import wave

if TYPE_CHECKING:
    from fleetctl.transport.connection import Connection


class _FetchFailed(Exception):
    """A peer fetch failed in a way a direct upload can fix."""


class _PeerDistribution:
    """The peer stages of :class:`~fleetctl.phases.push.phase._Push` (a mixin); a failed
    fetch falls back to a direct upload."""

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
            servers: dict[str, Serving] = {}
            fallback: list[tuple[_State, str]] = []
            try:
                while pending:
                    new = [h for h in holders if h.node.name not in servers]
                    self._map(lambda h, c, _s=servers: self._start_server(h, c, _s), new, 60)
                    live = [servers[h.node.name] for h in holders if h.node.name in servers]
                    if not live:
                        fallback += [(st, "no peer could serve the archive") for st in pending]
                        break
                    assigned, pending = wave(live, pending, self.options.peer_fanout)
                    batch = [st for st, _ in assigned]
                    orders = {st.node.name: order for st, order in assigned}
                    keep = bool(pending)
                    failed: dict[str, str] = {}

                    def fetch_one(
                        st: _State,
                        conn: Connection,
                        _orders: dict = orders,
                        _keep: bool = keep,
                        _failed: dict = failed,
                    ) -> None:
                        self._fetch(st, conn, _orders[st.node.name], _keep, _failed)

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
        self, st: _State, conn: Connection, order: list[Serving], keep: bool, failed: dict[str, str]
    ) -> None:
        arch = st.archive
        assert arch is not None
        name = f".tmp-{arch.sha256[:16]}-{secrets.token_hex(4)}.archive"
        peers = [s.peer() for s in order]
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

    def _start_server(self, st: _State, conn: Connection, servers: dict[str, Serving]) -> None:
        node, arch = st.node, st.archive
        assert arch is not None and st.kept_archive
        bind = (
            self.options.train_addrs.get(node.name)
            or node.train_addr
            or ("127.0.0.1" if node.local else node.address)
        )
        srv = start_serve(
            node,
            conn,
            path=f"{st.workdir}/envs/{st.kept_archive}",
            sha=arch.sha256,
            bind=bind,
            timeout=self.options.server_timeout,
            remove=True,
        )
        with self._lock:
            servers[node.name] = srv

    def _stop_servers(self, servers: dict[str, Serving]) -> None:
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

    def _drop_unserved(self, holders: list[_State], servers: dict[str, Serving]) -> None:
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
