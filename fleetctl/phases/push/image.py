"""``fleetctl push --image``: ship an image this machine has to the nodes that lack it, for
fleets with no registry.

One fan-out asks every node for the image's id (``remote/programs/image_load.py query``); nodes with
this machine's id are skipped, the others get it: ``save`` once here into a private temp
folder, SFTP to one node (the seed), which serves it over the training network through push's
token-protected ``serve``; in waves, as env archives: a node that fetched it serves the next
wave, so the controller sends the image about once and no one uplink carries the whole fleet.
Each node ``load``s it and answers the id, checked against this machine's. A fetch that fails
falls back to an SFTP upload from here. Temp archives are removed here and on every node
whatever happens.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import NodePushError, PushError, UsageError, one_line
from fleetctl.phases.push.waves import wave, waves_needed
from fleetctl.plan.runtimes import runtime
from fleetctl.results import FleetResult

if TYPE_CHECKING:
    from fleetctl.api.runspec import Container
    from fleetctl.node import Node
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection

SAVABLE = ("podman", "docker")  # apptainer's image is a SIF file: copy it like any file
QUERY_TIMEOUT = 120.0
RATE = 10e6  # bytes/s assumed for a transfer's or a load's timeout (plus a fixed 2 minutes)
PEER_MIN = 2  # nodes needing the image from which they fetch it from each other
PEER_FANOUT = 2  # fetchers each node holding the image serves per wave (as env archives)


@dataclass
class NodeImage:
    """One node's outcome: ``present`` (same id already), ``loaded``, ``replaced`` (another
    build was under the tag: ``previous_id``); ``via`` sftp or peer (``source``)."""

    status: str
    runtime: str | None = None
    image_id: str | None = None
    previous_id: str | None = None
    via: str | None = None
    source: str | None = None
    bytes_sent: int = 0
    seconds: float = 0.0


@dataclass
class ImagePushReport:
    image: str
    image_id: str
    runtime: str
    archive_bytes: int = 0
    controller_bytes: int = 0
    peer_fetches: int = 0
    seconds: float = 0.0
    nodes: dict[str, NodeImage] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def runtime_here(box: Container) -> str:
    """The runtime that saves the image on this machine: the one named, else podman (each
    node's: ``Container.runtime_for``, else the first found there)."""
    return box.container_runtime or "podman"


def local_image_id(image: str, rt: str = "podman") -> str:
    """This machine's id of ``image``; UsageError (exit 2) when it has none."""
    if rt not in SAVABLE:
        raise UsageError(
            f"--image push: {rt} images cannot be saved and loaded (use podman or docker)"
        )
    if shutil.which(rt) is None:
        raise UsageError(f"--image {image}: {rt} is not installed on this machine")
    try:
        p = subprocess.run(
            runtime(rt).image_id_argv(image), capture_output=True, text=True, timeout=QUERY_TIMEOUT
        )
    except subprocess.TimeoutExpired as e:
        raise UsageError(f"--image {image}: {rt} image inspect did not answer in time") from e
    words = p.stdout.split()
    if p.returncode != 0 or not words:
        raise UsageError(f"image {image} is not present on this machine ({rt})")
    return _bare(words[0])


def push_image(
    fleet: FanOut,
    box: Container,
    *,
    peer: bool | None = None,
    image_id: str | None = None,
    peer_fanout: int = PEER_FANOUT,
) -> ImagePushReport:
    """Make ``box``'s image (this machine's build, ``image_id`` when already looked up; its
    runtime here and on the nodes) present on every node of ``fleet``.

    Raises UsageError (nothing sent) when this machine lacks the image, PushError (``.result``:
    every node's NodeImage or error, ``.report``) when a node cannot get it.
    """
    push = _ImagePush(fleet, box, peer, image_id)
    push.fanout = max(1, peer_fanout)
    return push.run()


class _ImagePush:
    def __init__(
        self, fleet: FanOut, box: Container, peer: bool | None, image_id: str | None
    ) -> None:
        self.fleet, self.box, self.image, self.peer = fleet, box, str(box.image), peer
        self.fanout = PEER_FANOUT
        self.local_rt = runtime_here(box)
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.outcomes: dict[str, NodeImage | BaseException] = {}
        self.info: dict[str, dict[str, Any]] = {}
        self.report = ImagePushReport(
            self.image, image_id or local_image_id(self.image, self.local_rt), self.local_rt
        )

    def run(self) -> ImagePushReport:
        res = self.fleet.map(self._query, timeout=QUERY_TIMEOUT + 30)
        need: list[Node] = []
        for node in self.fleet.nodes:
            got = res[node.name]
            if isinstance(got, BaseException):
                self.outcomes[node.name] = got
            elif got["image_id"] == self.report.image_id:
                self.outcomes[node.name] = NodeImage("present", got["runtime"], got["image_id"])
            else:
                self.info[node.name] = got
                need.append(node)
        if need:
            with tempfile.TemporaryDirectory(prefix="fleetctl-image-") as tmp:  # 0700
                archive = Path(tmp) / "image.tar"
                self._save(archive)
                self._ship(need, archive)
        self.report.seconds = round(time.monotonic() - self.t0, 3)
        return self._conclude()

    # -- the steps ------------------------------------------------------------------------
    def _query(self, node: Node, conn: Connection) -> dict[str, Any]:
        named = self.box.runtime_for(node)
        names = [str(named)] if named else list(SAVABLE)
        for name in names:
            if name not in SAVABLE:
                raise NodePushError(node.label, f"{name} images cannot be loaded by push --image")
        cfg = {
            "workdir": node.workdir,
            "runtimes": names,
            "id_argv": {n: runtime(n).image_id_argv(self.image) for n in names},
            "timeout": QUERY_TIMEOUT,
        }
        out = _helper(node, conn, "query", cfg, QUERY_TIMEOUT + 30)
        if not out.get("runtime"):
            raise NodePushError(node.label, f"no container runtime found ({', '.join(names)})")
        if out.get("image_id"):
            out["image_id"] = _bare(out["image_id"])
        return out

    def _save(self, archive: Path) -> None:
        argv = [self.local_rt, "save", "-o", str(archive), self.image]
        if self.local_rt == "podman":
            argv[2:2] = ["--format", "docker-archive"]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
        except subprocess.TimeoutExpired as e:
            raise PushError(
                f"{self.local_rt} save {self.image} took over an hour", FleetResult({})
            ) from e
        if p.returncode != 0:
            tail = p.stderr.strip().splitlines()
            raise PushError(
                f"{self.local_rt} save {self.image} failed (exit {p.returncode})"
                + (f": {tail[-1]}" if tail else ""),
                FleetResult({}),
            )
        h = hashlib.sha256()
        with open(archive, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        self.sha, self.size = h.hexdigest(), archive.stat().st_size
        self.report.archive_bytes = self.size

    def _ship(self, need: list[Node], archive: Path) -> None:
        use_peer = self.peer if self.peer is not None else len(need) >= PEER_MIN
        if not use_peer or len(need) < 2:
            self._map(lambda n, c: self._direct(n, c, archive), need)
            return
        seed, rest = need[0], need[1:]
        name = _archive_name()
        try:
            conn = self.fleet.connection(seed)
            sent = self._upload(seed, conn, archive, name)
        except BaseException as e:  # the seed cannot take it: everyone gets it from here
            self._fail(seed, e)
            self._map(lambda n, c: self._direct(n, c, archive), rest)
            return
        fallback = self._waves(seed, name, sent, rest)
        self._map(lambda n, c: self._direct(n, c, archive), fallback)

    def _waves(self, seed: Node, name: str, sent: int, pending: list[Node]) -> list[Node]:
        """Every node holding the archive serves up to ``fanout`` fetchers a wave (newest
        holders first, so the seed's uplink is not the one every wave leans on); a node that
        fetched it keeps it to serve the next wave. The seed loads its upload alongside the
        first wave. Returns the nodes to upload to from here (no server, a failed fetch)."""
        holders: list[tuple[Node, str]] = [(seed, name)]
        servers: dict[str, tuple[Any, dict[str, Any]]] = {}
        fallback: list[Node] = []
        failed: list[tuple[Node, str]] = []  # kept an archive, then failed: no server
        server_timeout = waves_needed(len(pending), self.fanout) * 2 * _timeout(self.size) + 60
        first = True
        try:
            while pending or first:
                new = [h for h in holders if h[0].name not in servers]
                self._map(
                    lambda n, c: self._start_server(n, c, holders, servers, server_timeout),
                    [h[0] for h in new],
                    wait=60,
                )
                live = [servers[h[0].name][1] for h in reversed(holders) if h[0].name in servers]
                if not live:  # nobody can serve: this machine sends it to each
                    fallback.extend(pending)
                    pending = []
                assigned, pending = wave(live, pending, self.fanout)
                orders = {f.name: order for f, order in assigned}
                keep = bool(pending)
                fetched: list[tuple[Node, str]] = []

                def work(
                    node: Node,
                    c: Connection,
                    _orders: dict = orders,
                    _keep: bool = keep,
                    _fetched: list = fetched,
                ) -> None:
                    if node is seed:
                        self._load(node, c, {"archive": name, "keep_archive": True}, "sftp", sent)
                        return
                    cfg = {
                        "archive": _archive_name(),
                        "fetch": {"peers": _orders[node.name]},
                        "keep_archive": _keep,
                    }
                    try:
                        self._load(node, c, cfg, "peer", 0)
                    except _FetchFailed:
                        with self.lock:
                            fallback.append(node)
                        return
                    except BaseException:  # fetched, kept, not loaded: its archive goes too
                        if _keep:
                            with self.lock:
                                failed.append((node, cfg["archive"]))
                        raise
                    if _keep:
                        with self.lock:
                            _fetched.append((node, cfg["archive"]))

                self._map(work, ([seed] if first else []) + [f for f, _ in assigned])
                first = False
                holders.extend(fetched)
        finally:
            for stream, _peer in servers.values():
                _close(stream)  # each server removes its node's archive as it exits
            self._drop_kept([h for h in holders if h[0].name not in servers] + failed)
        return fallback

    def _start_server(
        self,
        node: Node,
        conn: Connection,
        holders: list[tuple[Node, str]],
        servers: dict[str, tuple[Any, dict[str, Any]]],
        timeout: float,
    ) -> None:
        name = next(a for n, a in holders if n is node)
        with contextlib.suppress(Exception):  # no server there: the others serve, or we do
            got = self._serve(node, conn, name, timeout)
            with self.lock:
                servers[node.name] = got

    def _drop_kept(self, holders: list[tuple[Node, str]]) -> None:
        """Archives kept for a server that never started: remove them."""

        def drop(node: Node, c: Connection) -> None:
            archive = next(a for n, a in holders if n is node)
            with contextlib.suppress(Exception):  # the node's outcome stands either way
                _helper(node, c, "cleanup", {"workdir": node.workdir, "archive": archive}, 60)

        self._map(drop, [n for n, _ in holders], wait=120)

    def _direct(self, node: Node, conn: Connection, archive: Path) -> None:
        name = _archive_name()
        sent = self._upload(node, conn, archive, name)
        self._load(node, conn, {"archive": name}, "sftp", sent)

    def _upload(self, node: Node, conn: Connection, archive: Path, name: str) -> int:
        envs = f"{self.info[node.name]['workdir']}/envs"
        need = 2 * self.size  # the archive and the loaded layers
        free = int(self.info[node.name].get("free") or 0)
        if free < need:
            raise NodePushError(
                node.label,
                f"not enough disk in {envs} for image {self.image}: {_mib(free)} free, "
                f"need {_mib(need)}",
                stage="disk",
                enospc=True,
            )
        conn.put(archive, f"{envs}/{name}", mode=0o600)
        with self.lock:
            self.report.controller_bytes += self.size
        return self.size

    def _load(
        self,
        node: Node,
        conn: Connection,
        cfg: dict[str, Any],
        via: str,
        sent: int,
        source: str | None = None,
    ) -> None:
        t0 = time.monotonic()
        rt = self.info[node.name]["runtime"]
        full = {
            "workdir": node.workdir,
            "sha": self.sha,
            "size": self.size,
            "load_argv": [rt, "load", "-i"],
            "id_argv": runtime(rt).image_id_argv(self.image),
            "timeout": _timeout(self.size),
            "fetch_timeout": 60,
            **cfg,
        }
        out = _helper(node, conn, "load", full, 2 * _timeout(self.size))
        source = out.get("peer") or source
        if via == "peer":
            with self.lock:
                self.report.peer_fetches += 1
        got = _bare(out.get("image_id") or "")
        if got != self.report.image_id:
            raise NodePushError(
                node.label,
                f"image {self.image} loaded, but its id there is {got or 'none'}, "
                f"not {self.report.image_id}",
                stage="verify",
            )
        prev = self.info[node.name].get("image_id")
        with self.lock:
            self.outcomes[node.name] = NodeImage(
                "replaced" if prev else "loaded",
                rt,
                got,
                previous_id=prev,
                via=via,
                source=source,
                bytes_sent=sent,
                seconds=round(time.monotonic() - t0, 3),
            )

    def _serve(
        self, seed: Node, conn: Connection, name: str, timeout: float
    ) -> tuple[Any, dict[str, Any]]:
        from fleetctl.phases.push.serving import start_serve

        srv = start_serve(
            seed,
            conn,
            path=f"{self.info[seed.name]['workdir']}/envs/{name}",
            sha=self.sha,
            bind=seed.train_addr or ("127.0.0.1" if seed.local else seed.address),
            timeout=timeout,
            remove=True,
        )
        return srv.stream, srv.peer()

    # -- outcomes -------------------------------------------------------------------------
    def _map(self, fn: Any, nodes: list[Node], wait: float | None = None) -> None:
        if not nodes:
            return
        timeout = wait if wait is not None else 3 * _timeout(self.size) + 60
        res = self.fleet.map(fn, nodes=nodes, timeout=timeout)
        for name, value in res.outcomes.items():
            if isinstance(value, BaseException) and not isinstance(value, _FetchFailed):
                node = next(n for n in nodes if n.name == name)
                self._fail(node, value)

    def _fail(self, node: Node, e: BaseException) -> None:
        if not isinstance(e, NodePushError):
            e = NodePushError(node.label, one_line(e, typed=True), stage="push")
        with self.lock:
            self.outcomes[node.name] = e

    def _conclude(self) -> ImagePushReport:
        order = [n.name for n in self.fleet.nodes]
        self.report.nodes = {k: v for k, v in self.outcomes.items() if isinstance(v, NodeImage)}
        self.report.nodes = {k: self.report.nodes[k] for k in order if k in self.report.nodes}
        failed = [k for k in order if not isinstance(self.outcomes.get(k), NodeImage)]
        if failed:
            for k in failed:
                self.outcomes.setdefault(k, NodePushError(k, "not reached", stage="push"))
            first = self.outcomes[failed[0]]
            why = first.reason if isinstance(first, NodePushError) else one_line(first)
            named = "" if len(failed) == 1 else f"{failed[0]}: "
            err = PushError(
                f"image {self.image} did not reach {', '.join(failed)}: {named}{why}",
                FleetResult({k: self.outcomes[k] for k in order}),
            )
            err.report = self.report  # type: ignore[attr-defined]
            raise err
        return self.report


class _FetchFailed(Exception):
    """The node could not fetch from the seed: the controller sends it instead."""


def _helper(
    node: Node, conn: Connection, mode: str, cfg: dict[str, Any], timeout: float
) -> dict[str, Any]:
    """One ``image_load.py`` command; its answer. Raises NodePushError with the node's reason
    (``_FetchFailed`` for a failed peer fetch)."""
    from fleetctl.phases.push.nodecall import call_mode

    payload = call_mode(
        node, conn, "image_load.py", mode, cfg, timeout, failed=f"image {mode}: no answer"
    )
    if "error" in payload:
        if payload.get("stage") == "fetch" and not payload.get("enospc"):
            raise _FetchFailed(payload["error"])
        raise NodePushError(
            node.label,
            str(payload["error"]),
            stage=payload.get("stage", mode),
            enospc=bool(payload.get("enospc")),
        )
    return payload


def _close(stream: Any) -> None:
    with contextlib.suppress(Exception):
        stream.close_stdin()  # the server exits, removing the seed's archive
        stream.exit_code(15)
    with contextlib.suppress(Exception):
        stream.close()


def _archive_name() -> str:
    return f".tmp-image-{secrets.token_hex(6)}.tar"


def _bare(image_id: str) -> str:
    return image_id.strip().split(":", 1)[-1]


def _timeout(size: int) -> float:
    return 120.0 + size / RATE


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
