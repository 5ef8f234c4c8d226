"""The probe's mesh tries a failed pair once more with load-scaled timeouts: a loaded host
answers late and passes on the second try; a cut link (no echo where other peers echo, or
this host's own training NIC down) and "refused" (an answer) are not retried; where no peer
echoes (ICMP filtered), a timeout is. (fleetctl/remote/programs/probe.py runs alone on nodes; its
functions import.)"""

from __future__ import annotations

from typing import Any

import pytest

from fleetctl.remote.programs import probe


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, float]]:
    seen: list[tuple[str, str, float]] = []
    answers = {"slow": ["timed out", "ok"], "cut": ["unreachable", "timed out"], "off": ["refused"]}

    def tcp(src: str, dst: str, port: int, timeout: float) -> str:
        seen.append(("tcp", dst, timeout))
        return answers[dst].pop(0)

    def ping(src: str, dst: str, timeout: float) -> str:
        seen.append(("ping", dst, timeout))
        return "ok" if dst != "cut" else "timeout"

    monkeypatch.setattr(probe, "tcp", tcp)
    monkeypatch.setattr(probe, "ping", ping)
    monkeypatch.setattr(probe, "route_source", lambda dst: "10.0.0.1")
    monkeypatch.setattr(probe.os, "getloadavg", lambda: (6.0, 0.0, 0.0))
    monkeypatch.setattr(probe.os, "cpu_count", lambda: 2)  # slowdown 3 → retry 2 x 3 = 6 x
    return seen


def test_a_failed_pair_is_tried_again_with_load_scaled_timeouts(calls: list[Any]) -> None:
    peers = [{"name": n, "addr": n, "port": 1} for n in ("slow", "cut", "off")]
    out = probe.mesh("10.0.0.1", peers, timeout=2.0, max_slowdown=4.0)["peers"]
    assert out["slow"]["tcp"] == "ok" and out["slow"]["retried"] == 6.0
    # no echo while the others echo: the address is unreachable, a retry would only wait
    assert out["cut"] == {"ping": "timeout", "tcp": "unreachable", "route_src": "10.0.0.1"}
    assert out["off"]["tcp"] == "refused" and "retried" not in out["off"]
    tcp_timeouts = sorted((dst, t) for kind, dst, t in calls if kind == "tcp")
    assert tcp_timeouts == [("cut", 2.0), ("off", 2.0), ("slow", 2.0), ("slow", 12.0)]


def test_where_no_peer_echoes_a_timeout_is_tried_again(
    calls: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ICMP filtered (or not permitted) on this network: no echo says nothing about a peer."""
    monkeypatch.setattr(probe, "ping", lambda src, dst, timeout: "timeout")
    peers = [{"name": n, "addr": n, "port": 1} for n in ("slow", "cut")]
    out = probe.mesh("10.0.0.1", peers, timeout=2.0, max_slowdown=4.0)["peers"]
    assert out["slow"]["tcp"] == "ok" and out["slow"]["retried"] == 6.0
    assert out["cut"]["tcp"] == "timed out" and out["cut"]["retried"] == 6.0


def test_the_slowdown_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probe.os, "getloadavg", lambda: (500.0, 0.0, 0.0))
    monkeypatch.setattr(probe.os, "cpu_count", lambda: 2)
    assert probe.load_factor(4.0) == 4.0
    monkeypatch.setattr(probe.os, "getloadavg", lambda: (0.1, 0.0, 0.0))
    assert probe.load_factor(4.0) == 1.0


def test_a_host_whose_own_training_link_is_down_tries_nothing(calls: list[Any]) -> None:
    """Its NIC check fails it already; nothing passes a NIC without link, so every pair would
    only wait out the timeouts: each fails at once, saying so."""
    peers = [{"name": n, "addr": n, "port": 1} for n in ("slow", "cut")]
    out = probe.mesh("10.0.0.1", peers, timeout=2.0, max_slowdown=4.0, link_up=False)["peers"]
    assert out["slow"] == {
        "ping": "not tried",
        "tcp": "not tried: the source's NIC has no link",
        "route_src": "10.0.0.1",
    }
    assert calls == []


def test_a_peer_whose_own_training_link_is_down_is_not_tried(calls: list[Any]) -> None:
    """The controller marks it from that host's facts (``"link": false``); the other peers are
    measured (and retried) as ever."""
    peers = [{"name": "cut", "addr": "cut", "port": 1, "link": False}]
    peers += [{"name": n, "addr": n, "port": 1} for n in ("slow", "off")]
    out = probe.mesh("10.0.0.1", peers, timeout=2.0, max_slowdown=4.0)["peers"]
    assert out["cut"]["tcp"] == "not tried: the destination's NIC has no link"
    assert "retried" not in out["cut"]
    assert out["slow"]["tcp"] == "ok" and out["slow"]["retried"] == 6.0
    assert sorted({dst for _, dst, _ in calls}) == ["off", "slow"]


def test_the_second_round_remembers_that_other_peers_echoed(calls: list[Any]) -> None:
    """The second round measures only the failed pairs: without the first round's echoes a cut
    peer alone looks ICMP-filtered and waits out the long timeouts (64 hosts: 9 -> 22 s)."""
    cut = [{"name": "cut", "addr": "cut", "port": 1}]
    out = probe.mesh("10.0.0.1", cut, timeout=2.0, max_slowdown=4.0, echoed=True)["peers"]
    assert out["cut"]["tcp"] == "unreachable" and "retried" not in out["cut"]
    assert [t for kind, _, t in calls if kind == "tcp"] == [2.0]


def test_a_second_round_alone_where_nothing_echoed_still_retries(calls: list[Any]) -> None:
    cut = [{"name": "cut", "addr": "cut", "port": 1}]
    out = probe.mesh("10.0.0.1", cut, timeout=2.0, max_slowdown=4.0)["peers"]
    assert out["cut"]["tcp"] == "timed out" and out["cut"]["retried"] == 6.0
