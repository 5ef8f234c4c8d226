"""Many nodes: open one connection per node in parallel and fan work out over them.

``FanOut`` is the engine under every phase (and under the public ``fleetctl.api.Fleet``, the
one class called ``Fleet``): it holds the connections, it never decides what runs.

Every node's outcome is kept (``FleetResult``): a fan-out never reports only the first error.
Every wait is bounded; a node still busy at the deadline is recorded as timed out.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from fleetctl.errors import FleetctlError
from fleetctl.results import Cancelled, FleetResult
from fleetctl.transport.connection import Connection, SSHSettings, connect

if TYPE_CHECKING:
    from fleetctl.node import Node

T = TypeVar("T")

DEFAULT_FANOUT = 64


class NodeTimeout(FleetctlError):
    """A node's share of a fan-out did not finish before the deadline."""

    exit_code = 3


class FanOut:
    """The selected nodes and their open connections, in rank order. Use as a context manager."""

    def __init__(
        self,
        nodes: Sequence[Node],
        settings: SSHSettings | None = None,
        *,
        fanout: int = DEFAULT_FANOUT,
    ) -> None:
        self.nodes: tuple[Node, ...] = tuple(nodes)
        self.settings = settings or SSHSettings()
        self.fanout = max(1, fanout)
        self._conns: dict[str, Connection] = {}
        self._errors: dict[str, BaseException] = {}
        self._lock = threading.Lock()

    # -- connections ------------------------------------------------------------------------
    def connect(self, nodes: Iterable[Node] | None = None) -> FleetResult[Connection]:
        """Open (or reuse) a connection to each node; failures are kept per node, not raised."""
        selected = list(self.nodes if nodes is None else nodes)  # [] means none, not all
        todo = [n for n in selected if n.name not in self._conns]
        # Connecting is handshake-bound: run them all at once, up to the fan-out bound.
        opened = self._fan(
            todo, self._open, timeout=self.settings.connect_timeout * 2 + 5, width=self.fanout
        )
        # A connect still running at the deadline is a NodeTimeout (a failure), not Cancelled.
        return FleetResult(
            {n.name: opened[n.name] if n.name in opened else self._conns[n.name] for n in selected}
        )

    def _open(self, node: Node) -> Connection:
        try:
            conn = connect(node, self.settings)
        except BaseException as e:
            with self._lock:
                self._errors[node.name] = e
            raise
        with self._lock:
            self._conns[node.name] = conn
            self._errors.pop(node.name, None)
        return conn

    def connection(self, node: Node | str) -> Connection:
        """The open connection to a node; raises the node's connect error if it had one."""
        name = node if isinstance(node, str) else node.name
        if name in self._conns:
            return self._conns[name]
        if name in self._errors:
            raise self._errors[name]
        n = next((x for x in self.nodes if x.name == name), None)
        if n is None:
            raise KeyError(name)
        return self._open(n)

    def drop(self, node: Node | str) -> None:
        """Forget a node's connection or connect error (lost node) so the next use reconnects."""
        name = node if isinstance(node, str) else node.name
        with self._lock:
            conn = self._conns.pop(name, None)
            self._errors.pop(name, None)
        if conn is not None:
            conn.close()

    def join(self, node: Node, conn: Connection) -> None:
        """A node that was not one of the fleet's (``run --elastic``: a spare taking a lost
        node's place) is one from now on, reached over ``conn``."""
        with self._lock:
            if all(x.name != node.name for x in self.nodes):
                self.nodes = (*self.nodes, node)
        self.adopt(node, conn)

    def adopt(self, node: Node | str, conn: Connection) -> None:
        """Make ``conn`` (a new connection to the node) its connection from now on; the old
        one, maybe stalled on a dead link, is closed in the background (never blocks us)."""
        name = node if isinstance(node, str) else node.name
        with self._lock:
            old = self._conns.get(name)
            self._conns[name] = conn
            self._errors.pop(name, None)
        if old is not None and old is not conn:
            threading.Thread(target=old.close, daemon=True, name=f"close-{name}").start()

    @property
    def connected(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.name in self._conns)

    # -- fan-out ----------------------------------------------------------------------------
    def map(
        self,
        fn: Callable[[Node, Connection], T],
        *,
        timeout: float,
        nodes: Iterable[Node] | None = None,
        fail_fast: bool = False,
        width: int | None = None,
    ) -> FleetResult[T]:
        """Run ``fn(node, connection)`` on every node in parallel; keep each node's outcome.

        Nodes that could not be connected get their connect error. With ``fail_fast``, work not
        yet started when a node fails is recorded as ``Cancelled``.
        """
        selected = list(self.nodes if nodes is None else nodes)  # [] means none, not all

        def work(node: Node) -> T:
            return fn(node, self.connection(node))

        return self._fan(
            selected, work, timeout=timeout, width=width or self.fanout, fail_fast=fail_fast
        )

    def _fan(
        self,
        nodes: list[Node],
        fn: Callable[[Node], T],
        *,
        timeout: float,
        width: int,
        fail_fast: bool = False,
    ) -> FleetResult[T]:
        outcomes: dict[str, T | BaseException] = {n.name: Cancelled(n.name) for n in nodes}
        if not nodes:
            return FleetResult(outcomes)
        pool = cf.ThreadPoolExecutor(max_workers=min(width, len(nodes)), thread_name_prefix="fleet")
        # Checked by each worker before it starts a node: a free worker takes the next queued node
        # before this thread can cancel() it, so cancel() alone lets work start after a failure.
        stop = threading.Event()

        def guarded(node: Node) -> T:
            if stop.is_set():
                raise Cancelled(node.name)
            try:
                return fn(node)
            except BaseException:
                if fail_fast:
                    stop.set()
                raise

        def settle(fut: cf.Future[T]) -> None:
            if not fut.cancelled():  # a cancelled one never started: it stays Cancelled
                exc = fut.exception()
                outcomes[futures[fut].name] = exc if exc is not None else fut.result()

        try:
            futures = {pool.submit(guarded, n): n for n in nodes}
            deadline = time.monotonic() + timeout
            pending = set(futures)
            while pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                done, pending = cf.wait(pending, timeout=left, return_when=cf.FIRST_EXCEPTION)
                for fut in done:
                    settle(fut)
                if stop.is_set():
                    for other in pending:
                        other.cancel()
            for fut in pending:
                if fut.done():  # finished between the last wait and the deadline
                    settle(fut)
                else:
                    node = futures[fut]
                    outcomes[node.name] = NodeTimeout(
                        f"{node.label}: no answer within {timeout:g}s"
                    )
        finally:
            stop.set()  # queued work must not start after we returned
            pool.shutdown(wait=False, cancel_futures=True)
        return FleetResult({n.name: outcomes[n.name] for n in nodes})

    # -- lifecycle --------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            conn.close()

    def __enter__(self) -> FanOut:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
