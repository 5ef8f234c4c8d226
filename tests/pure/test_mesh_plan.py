"""The mesh plan: every pair up to 32 hosts, a ring plus random peers beyond, and a host whose
link is down still blamed alone from the pairs it was tested in."""

from __future__ import annotations

import pytest

from fleetctl.phases.check.mesh_plan import FULL_UP_TO, RANDOM_PEERS, mesh_mode, mesh_peers
from fleetctl.phases.check.report import CheckOptions
from tests.pure.test_check_report import failing, good, judge, nodes, outcome


def names(n: int) -> list[str]:
    return [f"gpu{i:03d}" for i in range(1, n + 1)]


@pytest.mark.parametrize(
    ("mode", "n", "want"),
    [
        ("auto", 2, "full"),
        ("auto", FULL_UP_TO, "full"),
        ("auto", FULL_UP_TO + 1, "sparse"),
        ("auto", 128, "sparse"),
        ("full", 128, "full"),
        ("sparse", 4, "sparse"),
        ("off", 8, "off"),
    ],
)
def test_auto_is_full_up_to_the_threshold_and_sparse_beyond(mode: str, n: int, want: str) -> None:
    assert mesh_mode(mode, n) == want


def test_a_full_mesh_tests_every_ordered_pair() -> None:
    plan = mesh_peers(names(5), "auto")
    assert sum(len(p) for p in plan.values()) == 5 * 4
    assert plan["gpu001"] == ["gpu002", "gpu003", "gpu004", "gpu005"]


@pytest.mark.parametrize("n", [33, 64, 128, 1000])
def test_a_sparse_mesh_is_linear_connected_and_tests_every_host_from_two_sides(n: int) -> None:
    hosts = names(n)
    plan = mesh_peers(hosts, "auto")
    assert all(len(p) == RANDOM_PEERS + 2 and h not in p for h, p in plan.items())
    assert sum(len(p) for p in plan.values()) == n * (RANDOM_PEERS + 2)  # not n * (n - 1)
    tested_by = {h: {s for s, p in plan.items() if h in p} for h in hosts}
    assert all(len(by) >= 2 for by in tested_by.values())  # its ring neighbours at least
    seen, todo = {hosts[0]}, [hosts[0]]
    while todo:  # every host reachable through tested pairs: one cut shows somewhere
        for peer in plan[todo.pop()]:
            if peer not in seen:
                seen.add(peer)
                todo.append(peer)
    assert seen == set(hosts)
    assert mesh_peers(hosts, "auto") == plan  # the same fleet, the same pairs: re-checks agree
    assert {hosts[0], hosts[2]} <= set(plan["gpu002"])  # its ring neighbours


def test_a_host_cut_off_in_a_sparse_mesh_is_blamed_alone() -> None:
    ns = nodes(40)
    hosts = [n.name for n in ns]
    plan = mesh_peers(hosts, "sparse")
    cut = {"ping": "timeout", "tcp": "timed out"}
    bad = {(s, d): cut for s in hosts for d in hosts if s != d and "node7" in (s, d)}
    outs = good(ns, bad)
    for i, n in enumerate(ns, start=1):  # each host reports only the peers it was given
        full = outs[n.name].mesh["peers"]
        outs[n.name] = outcome(i, peers={d: full[d] for d in plan[n.name]})
        outs[n.name].mesh_peers = plan[n.name]
    r = judge(ns, outs, options=CheckOptions(mesh_mode="sparse"))
    assert failing(r) == {("node7", "mesh")}
    assert all(f.src == "node7" or f.dst == "node7" for f in r.mesh_failures)
    for host in ("node1", "node6", "node8"):  # node6/8: node7's ring neighbours
        paired = set(plan[host]) | {s for s, p in plan.items() if host in p}
        k = len(paired)
        want = f"{k - 1}/{k} peers (except node7)" if "node7" in paired else f"{k}/{k} peers"
        assert r.hosts[host].checks["mesh"].status == "ok"
        assert r.hosts[host].checks["mesh"].detail == want
