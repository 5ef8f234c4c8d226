"""Before a retry, the lost hosts are dialled until they answer or --reboot-timeout passed
(fleetctl.job.run.comeback): a clock that only the dials and the pauses move, hosts that refuse
(at once) or time out (the whole try) a given number of times before they answer."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fleetctl.errors import ConnectError
from fleetctl.job.run.comeback import PAUSE, TRY, await_hosts


@dataclass(frozen=True)
class Host:
    name: str


class Fleet:
    """``fails[name]``: how many dials fail before it answers (None: never); ``timeouts``:
    hosts whose failures take the whole try (SYNs unanswered) instead of a refusal."""

    def __init__(self, fails: dict[str, int | None], timeouts: frozenset[str] = frozenset()):
        self.fails, self.timeouts = dict(fails), timeouts
        self.now = 100.0
        self.dials: list[tuple[str, float]] = []
        self.said: list[str] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        assert s > 0
        self.now += s

    def dial(self, node: Host, seconds: float) -> None:
        self.dials.append((node.name, seconds))
        left = self.fails[node.name]
        if left is None or left > 0:
            self.fails[node.name] = None if left is None else left - 1
            self.now += seconds if node.name in self.timeouts else 0.01
            raise ConnectError(node.name, "connection refused")
        self.now += 0.2

    def wait(self, names: list[str], timeout: float) -> dict[str, float | None]:
        hosts = [Host(n) for n in names]
        return await_hosts(hosts, timeout, self.dial, say=self.said.append, clock=self.clock,
                           sleep=self.sleep)  # fmt: skip


def test_a_host_refusing_while_it_boots_is_dialled_until_it_answers() -> None:
    f = Fleet({"node2": 30})
    back = f.wait(["node2"], 300)
    assert back["node2"] is not None and 30 * PAUSE <= back["node2"] < 31 * PAUSE + 1
    assert len(f.dials) == 31
    assert f.said[0] == "waiting up to 300s for node2 to answer SSH again (a reboot?)"
    assert f.said[-1] == f"node2: answers SSH again after {back['node2']:g}s"


def test_a_host_that_never_answers_ends_the_wait_at_the_timeout_not_later() -> None:
    f = Fleet({"node2": None}, timeouts=frozenset({"node2"}))
    back = f.wait(["node2"], 12)
    assert back == {"node2": None}
    assert f.now - 100.0 == pytest.approx(12, abs=0.01)  # the last try is cut to what is left
    assert all(0.5 <= s <= TRY for _, s in f.dials)
    assert f.said[-1] == "node2: no answer over SSH within 12s; the retry goes on"


def test_each_lost_host_is_waited_for_on_its_own() -> None:
    f = Fleet({"node1": 0, "node3": 4})
    back = f.wait(["node1", "node3"], 60)
    assert back["node1"] == pytest.approx(0.2) and back["node3"] is not None
    assert [n for n, _ in f.dials].count("node1") == 1  # answered: not dialled again
    assert [n for n, _ in f.dials].count("node3") == 5


@pytest.mark.parametrize("names,timeout", [([], 300.0), (["node2"], 0.0)])
def test_no_lost_host_or_a_zero_timeout_dials_nothing(names: list[str], timeout: float) -> None:
    f = Fleet({"node2": 0})
    assert f.wait(names, timeout) == {n: None for n in names}
    assert f.dials == [] and f.said == []
