"""``FanOut`` fan-out semantics without a network: LocalConnection nodes, or a fake ``connect``.

Every node's outcome is kept (value, its own exception, ``Cancelled`` for work that never
started, ``NodeTimeout`` past the deadline), results come back in rank order whatever order the
work finished in, and the fan-out bound is never exceeded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fleetctl.ssh.fanout as fleet_mod
from fleetctl.errors import ConnectError, FleetctlError
from fleetctl.node import Node
from fleetctl.results import Cancelled
from fleetctl.ssh.fanout import FanOut, NodeTimeout
from fleetctl.transport.connection import Connection, LocalConnection, SSHSettings


def local_nodes(n: int) -> list[Node]:
    return [Node.localhost(name=f"n{i}") for i in range(n)]


class CountingConnection(LocalConnection):
    closed = 0

    def close(self) -> None:
        CountingConnection.closed += 1


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test so no worker thread is left blocked on it."""
    ev = threading.Event()
    try:
        yield ev
    finally:
        ev.set()


def test_connect_keeps_every_nodes_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = local_nodes(4)
    calls: list[str] = []
    lock = threading.Lock()

    def fake_connect(node: Node, settings: SSHSettings | None = None) -> Connection:
        with lock:
            calls.append(node.name)
        if node.name == "n2":
            raise ConnectError(node.label, "connection refused by 10.0.0.2:22")
        return LocalConnection(node)

    monkeypatch.setattr(fleet_mod, "connect", fake_connect)
    with FanOut(nodes) as fleet:
        res = fleet.connect()
        assert list(res) == ["n0", "n1", "n2", "n3"]  # rank order
        assert set(res.succeeded) == {"n0", "n1", "n3"}
        err = res.failed["n2"]
        assert isinstance(err, ConnectError) and "refused" in str(err)
        assert not res.ok and res.cancelled == []
        assert [n.name for n in fleet.connected] == ["n0", "n1", "n3"]
        # The failed node keeps its error; map reports it without calling fn for that node.
        with pytest.raises(ConnectError):
            fleet.connection("n2")
        seen: list[str] = []
        out = fleet.map(lambda n, c: seen.append(n.name) or n.name.upper(), timeout=10)
        assert out.succeeded == {"n0": "N0", "n1": "N1", "n3": "N3"}
        assert out["n2"] is err and "n2" not in seen
        # A second connect reuses open connections and retries only the failed node.
        calls.clear()
        again = fleet.connect()
        assert calls == ["n2"]
        assert again["n0"] is res["n0"]


@pytest.mark.slow  # connect()'s deadline has a fixed 5 s floor
def test_connect_still_running_at_the_deadline_is_a_timeout_not_cancelled(
    monkeypatch: pytest.MonkeyPatch, release: threading.Event
) -> None:
    def fake_connect(node: Node, settings: SSHSettings | None = None) -> Connection:
        if node.name == "n1":
            release.wait(30)  # a handshake that never ends
        return LocalConnection(node)

    monkeypatch.setattr(fleet_mod, "connect", fake_connect)
    # connect()'s own deadline is connect_timeout * 2 + 5 s.
    with FanOut(local_nodes(3), SSHSettings(connect_timeout=0.01)) as fleet:
        res = fleet.connect()
    assert set(res.succeeded) == {"n0", "n2"}
    assert isinstance(res.failed.get("n1"), NodeTimeout), res.outcomes
    assert res.cancelled == []


def test_connect_of_no_nodes_connects_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_connect(node: Node, settings: SSHSettings | None = None) -> Connection:
        raise AssertionError(f"connected {node.name}")

    monkeypatch.setattr(fleet_mod, "connect", fake_connect)
    with FanOut(local_nodes(2)) as fleet:
        assert dict(fleet.connect([])) == {}


def test_map_runs_real_commands_and_keeps_rank_order() -> None:
    nodes = local_nodes(5)

    def fn(node: Node, conn: Connection) -> str:
        # Later ranks finish first: the result must still be in rank order.
        delay = (len(nodes) - int(node.name[1:])) * 0.02
        return conn.run(["sh", "-c", f"sleep {delay}; echo {node.name}"], timeout=10).stdout

    with FanOut(nodes) as fleet:
        out = fleet.map(fn, timeout=20)
    assert list(out) == [n.name for n in nodes]
    assert out.succeeded == {n.name: f"{n.name}\n" for n in nodes}
    assert out.ok


def test_map_keeps_each_failure_and_runs_everything_without_fail_fast() -> None:
    def fn(node: Node, conn: Connection) -> str:
        if node.name in ("n1", "n3"):
            raise RuntimeError(f"{node.name} broke")
        return node.name

    with FanOut(local_nodes(5), fanout=2) as fleet:
        out = fleet.map(fn, timeout=10)
    assert set(out.failed) == {"n1", "n3"}
    assert str(out.failed["n3"]) == "n3 broke"
    assert out.succeeded == {"n0": "n0", "n2": "n2", "n4": "n4"}
    assert out.cancelled == []


def test_map_fail_fast_cancels_work_not_yet_started() -> None:
    nodes = local_nodes(6)
    started: list[str] = []
    lock = threading.Lock()
    both_running = threading.Barrier(2, timeout=10)

    def fn(node: Node, conn: Connection) -> str:
        with lock:
            started.append(node.name)
        both_running.wait()  # n0 and n1 run together (fanout 2) ...
        if node.name == "n0":
            raise RuntimeError("n0 broke")  # ... then n0 fails while n1 is still at work
        time.sleep(0.2)
        return node.name

    with FanOut(nodes, fanout=2) as fleet:
        out = fleet.map(fn, timeout=10, fail_fast=True)
    assert sorted(started) == ["n0", "n1"]  # nothing started after the failure
    assert isinstance(out["n0"], RuntimeError)
    assert out["n1"] == "n1"  # already running: finished and kept
    assert out.cancelled == ["n2", "n3", "n4", "n5"]
    assert all(isinstance(out[f"n{i}"], Cancelled) for i in range(2, 6))
    assert set(out.failed) == {"n0"}  # Cancelled is not a failure of its own
    assert not out.ok


def test_map_fail_fast_with_one_worker_starts_nothing_after_the_failure() -> None:
    started: list[str] = []

    def fn(node: Node, conn: Connection) -> str:
        started.append(node.name)
        if node.name == "n0":
            raise RuntimeError("boom")
        return node.name

    with FanOut(local_nodes(5), fanout=1) as fleet:
        out = fleet.map(fn, timeout=10, fail_fast=True)
    # The freed worker takes the next queued node at once; it must not run it.
    assert started == ["n0"]
    assert out.cancelled == ["n1", "n2", "n3", "n4"]


def test_node_over_the_map_timeout_is_a_node_timeout_and_the_others_succeed(
    release: threading.Event,
) -> None:
    def fn(node: Node, conn: Connection) -> str:
        if node.name == "n1":
            release.wait(30)  # stuck (a hung remote command)
        return node.name

    with FanOut(local_nodes(3)) as fleet:
        out = fleet.map(fn, timeout=0.5)
    assert out.succeeded == {"n0": "n0", "n2": "n2"}
    err = out["n1"]
    assert isinstance(err, NodeTimeout) and isinstance(err, FleetctlError)
    assert err.exit_code == 3
    assert "n1" in str(err) and "0.5s" in str(err)
    assert set(out.failed) == {"n1"} and out.cancelled == []


def test_fanout_bound_is_respected_and_reached() -> None:
    active = 0
    peak = 0
    lock = threading.Lock()
    group = threading.Barrier(3, timeout=10)  # nodes can only pass in threes

    def fn(node: Node, conn: Connection) -> str:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            group.wait()
            time.sleep(0.02)
            return node.name
        finally:
            with lock:
                active -= 1

    with FanOut(local_nodes(9), fanout=3) as fleet:
        out = fleet.map(fn, timeout=20)
    assert out.ok and len(out) == 9
    assert peak == 3

    # width= overrides the fleet's bound for one call.
    active = peak = 0
    group = threading.Barrier(2, timeout=10)
    with FanOut(local_nodes(6), fanout=64) as fleet:
        out = fleet.map(fn, timeout=20, width=2)
    assert out.ok and peak == 2


def test_map_on_a_subset_and_on_no_nodes() -> None:
    nodes = local_nodes(4)
    called: list[str] = []

    def fn(node: Node, conn: Connection) -> str:
        called.append(node.name)
        return node.name

    with FanOut(nodes) as fleet:
        out = fleet.map(fn, timeout=10, nodes=[nodes[3], nodes[1]])
        assert list(out) == ["n3", "n1"] and out.ok
        called.clear()
        empty = fleet.map(fn, timeout=10, nodes=[])  # an empty selection is empty, not "all"
        assert dict(empty) == {} and called == []


def test_drop_reconnects_and_close_closes_every_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fake_connect(node: Node, settings: SSHSettings | None = None) -> Connection:
        return CountingConnection(node)

    monkeypatch.setattr(fleet_mod, "connect", fake_connect)
    CountingConnection.closed = 0
    fleet = FanOut(local_nodes(3))
    with fleet:
        first = fleet.connection("n1")
        assert fleet.connection("n1") is first  # one connection per node, reused
        fleet.drop("n1")
        assert CountingConnection.closed == 1
        assert fleet.connection("n1") is not first  # the next use reconnects
        fleet.connect()
        with pytest.raises(KeyError):
            fleet.connection("nope")
    assert CountingConnection.closed == 1 + 3
    assert fleet.connected == ()


def test_transports_prefer_aes_gcm_and_keep_the_rest_as_fallback() -> None:
    import socket

    import paramiko

    from fleetctl.transport.tuning import transport_factory as _transport

    a, b = socket.socketpair()
    try:
        t = _transport(a)
        ciphers = tuple(t.get_security_options().ciphers)
        t.close()
    finally:
        a.close()
        b.close()
    assert ciphers[:2] == ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
    assert sorted(ciphers) == sorted(paramiko.Transport._preferred_ciphers)  # nothing dropped


class _RecordingSocket:
    """A real loopback TCP socket that records its setsockopt calls."""

    @staticmethod
    def pair() -> tuple[Any, Any]:
        import socket

        class Recording(socket.socket):
            calls: list[tuple[int, int, int]]

            def setsockopt(self, level: int, opt: int, value: Any, *rest: Any) -> None:
                self.calls.append((level, opt, value))
                super().setsockopt(level, opt, value, *rest)

        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen(1)
            c = Recording(socket.AF_INET, socket.SOCK_STREAM)
            c.calls = []
            c.connect(srv.getsockname())
            s, _ = srv.accept()
        return c, s


def test_transports_ack_at_once_and_send_without_nagles_delay() -> None:
    """sshd holds its first channel confirmation until its post-auth global request and debug
    message are ACKed; with delayed ACKs here, every connection's first command waited 40 ms,
    and with Nagle on, each small packet after the first waited for an ACK too."""
    import socket

    import paramiko
    from paramiko.common import MSG_GLOBAL_REQUEST

    from fleetctl.transport.tuning import transport_factory as _transport

    c, s = _RecordingSocket.pair()
    try:
        t = _transport(c)
        assert c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        quick = (socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        c.calls.clear()
        m = paramiko.Message()
        m.add_string("hostkeys-00@openssh.com")
        m.add_boolean(False)  # no reply wanted: nothing is sent back
        m.rewind()
        t._handler_table[MSG_GLOBAL_REQUEST](m)
        assert c.calls == [quick]
        m = paramiko.Message()
        m.add_boolean(False)
        m.add_string("key options: pty")
        m.add_string("")
        m.rewind()
        t._parse_debug(m)
        assert c.calls == [quick, quick]
        t.close()
    finally:
        c.close()
        s.close()


def test_dropping_a_node_forgets_its_connect_error_so_the_next_use_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job monitor reconnects to a node that was lost: drop() must not leave the old
    connect error cached for connection() to raise forever."""
    up = {"now": False}

    def fake_connect(node: Node, settings: object) -> LocalConnection:
        if not up["now"]:
            raise ConnectError(node.label, "connection refused")
        return LocalConnection(node)

    monkeypatch.setattr(fleet_mod, "connect", fake_connect)
    node = Node("n1", "10.0.0.1")
    fleet = FanOut([node])
    assert isinstance(fleet.connect()["n1"], ConnectError)
    up["now"] = True
    with pytest.raises(ConnectError):
        fleet.connection("n1")  # still the remembered error
    fleet.drop("n1")
    assert isinstance(fleet.connection("n1"), LocalConnection)
