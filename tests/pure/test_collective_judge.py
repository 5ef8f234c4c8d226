"""The collective preflight's verdict (fleetctl.phases.check.collective_judge) as a golden table,
and the node program's InfiniBand sysfs reader on fake trees; plus the node program imports
on Python 3.8 without torch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.phases.check.collective_judge import (
    CollectiveOptions,
    ib_problems,
    judge,
    shifts,
)
from fleetctl.remote.programs import collective as node_program

SIZE = 1 << 24


def results(
    hosts: list[str], bw: Callable[[str, str], float], intra: dict[str, float] | None = None
) -> dict[str, dict]:
    """Each node's ``D`` answer for a fleet whose link src → dst runs at ``bw`` GB/s."""
    n = len(hosts)
    out = {}
    for r, h in enumerate(hosts):
        links = []
        for k in shifts(n, hosts):
            src = hosts[(r - k) % n]
            links.append(
                {
                    "src": (r - k) % n,
                    "dst": r,
                    "shift": k,
                    "bytes": SIZE,
                    "seconds": SIZE / (bw(src, h) * 1e9),
                }
            )
        ar = min(bw(a, b) for a in hosts for b in hosts if a != b) * 1e9
        out[h] = {
            "rank": r,
            "backend": "gloo",
            "torch": "2.13",
            "allreduce": {
                "bytes": SIZE,
                "seconds": SIZE / ar,
                "algbw": ar,
                "busbw": ar * 2 * (n - 1) / n,
            },
            "links": links,
            "intra": {"gpus": 8, "busbw": intra[h] * 1e9} if intra else None,
            "ib": [],
        }
    return out


H4 = ["n0", "n1", "n2", "n3"]
H12 = [f"n{i}" for i in range(12)]
NOISE = {("n0", "n1"): 0.7, ("n2", "n0"): 1.25, ("n3", "n2"): 0.8, ("n1", "n3"): 1.1}
# a healthy 4-host lab as measured (gloo, 2 cores, every host sending at once): 0.66..1.8x
LAB = dict(
    zip(
        [(a, b) for a in H4 for b in H4 if a != b],
        [0.66, 1.54, 0.79, 1.0, 0.82, 1.38, 0.89, 1.05, 0.74, 1.18, 1.01, 0.91],
        strict=True,
    )
)


def noisy(bw: Callable[[str, str], float]) -> Callable[[str, str], float]:
    return lambda a, b: bw(a, b) * LAB.get((a, b), 1.0)


def slow_recv(host: str) -> Callable[[str, str], float]:
    return lambda a, b: 0.006 if b == host else 1.0


CASES = [
    # (id, hosts, bandwidth, options, expected failing hosts, words in their reasons)
    ("healthy", H4, lambda a, b: 1.0, {}, set(), ()),
    ("noise passes", H4, lambda a, b: NOISE.get((a, b), 1.0), {}, set(), ()),
    ("uniformly slow fleet passes", H4, lambda a, b: 0.006, {}, set(), ()),
    ("one slow node, named alone", H4, slow_recv("n2"), {}, {"n2"}, ("slow node (recv side)",)),
    (
        "slow node sending",
        H4,
        lambda a, b: 0.01 if a == "n1" else 1.0,
        {},
        {"n1"},
        ("slow node (send side)",),
    ),
    (
        "one slow link names its two ends",
        H4,
        lambda a, b: 0.1 if (a, b) == ("n1", "n3") else 1.0,
        {},
        {"n1", "n3"},
        ("slow link n1 → n3",),
    ),
    ("lab noise passes", H4, noisy(lambda a, b: 1.0), {}, set(), ()),
    ("noise: slow node still named alone", H4, noisy(slow_recv("n1")), {}, {"n1"}, ("slow node",)),
    (
        "noise: slow link still names its ends",
        H4,
        noisy(lambda a, b: 0.1 if (a, b) == ("n2", "n0") else 1.0),
        {},
        {"n2", "n0"},
        ("slow link n2 → n0",),
    ),
    (
        # CI, stop 41: n3's sender on the ring (n2) had one more link at 0.46x the median
        "the host sending to a throttled NIC is named for its slow link, not as a slow node",
        H4,
        lambda a, b: 0.006 if b == "n3" else (0.46 if (a, b) == ("n2", "n0") else 1.0),
        {},
        {"n3", "n2", "n0"},
        ("slow node (recv side)", "slow link n2 → n0"),
    ),
    (
        "two throttled NICs are both named",
        H4,
        lambda a, b: 0.006 if b in ("n1", "n3") else 1.0,
        {},
        {"n1", "n3"},
        ("slow node (recv side)",),
    ),
    (
        "two hosts cannot tell which end is slow: both named",
        H4[:2],
        slow_recv("n1"),
        {"floor": 0.5},
        {"n0", "n1"},
        ("slow node",),
    ),
    ("slow node in a 12-host fleet", H12, slow_recv("n7"), {}, {"n7"}, ("slow node",)),
    ("3 hosts, slow node", H4[:3], slow_recv("n0"), {}, {"n0"}, ("slow node",)),
    (
        "floor fails a uniformly slow fleet",
        H4,
        lambda a, b: 0.006,
        {"floor": 0.5},
        set(H4),
        ("floor 0.5 GB/s",),
    ),
    (
        "a tighter fraction names the noisy link",
        H4,
        lambda a, b: NOISE.get((a, b), 1.0),
        {"min_fraction": 0.75},
        {"n0", "n1"},
        ("slow link n0 → n1",),
    ),
]


@pytest.mark.parametrize(
    ("hosts", "bw", "opts", "bad", "words"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_verdict(hosts, bw, opts, bad, words) -> None:
    rep = judge(hosts, results(hosts, bw), CollectiveOptions(**opts))
    assert set(rep.failed_hosts) == bad, rep.failures
    assert rep.ok == (not bad)
    text = "\n".join(r for _, r in rep.failures)
    for w in words:
        assert w in text
    assert {(x.src, x.dst) for x in rep.links} >= {(hosts[0], hosts[1])}
    assert rep.to_dict()["nodes"][hosts[0]]["busbw"] is not None


def test_busbw_is_nccl_tests_definition() -> None:
    rep = judge(H4, results(H4, lambda a, b: 1.0), CollectiveOptions())
    assert rep.allreduce["algbw"] == pytest.approx(1.0)
    assert rep.allreduce["busbw"] == pytest.approx(1.0 * 2 * 3 / 4)
    assert rep.median == pytest.approx(1.0)


def test_hung_errors_and_intra() -> None:
    res = results(H4, lambda a, b: 1.0, intra={"n0": 200, "n1": 210, "n2": 40, "n3": 205})
    res["n3"] = {"error": "cannot import torch with /usr/bin/python3: No module named 'torch'"}
    rep = judge(H4, res, CollectiveOptions(), hung={"n1": "Thread 0x1 (most recent call first)"})
    reasons = dict(rep.failures)
    assert set(reasons) == {"n1", "n2", "n3"}
    assert reasons["n1"].startswith("hung")
    assert rep.hung == {"n1": "Thread 0x1 (most recent call first)"}
    assert "intra-node all-reduce busbw 40" in reasons["n2"]
    assert "No module named 'torch'" in reasons["n3"]


def test_suspect_links_are_measured_again() -> None:
    """The node program's re-measure: a link below the fraction of the median runs again
    (every rank picks the same from the same figures), unless that takes past the budget."""
    t = 1e-3
    rows = [[t, t, t], [t, 3 * t, t], [t, t, t], [t, t, 1.5 * t]]
    assert node_program.suspect_links([1, 2, 3], rows, 0.625, 3, 1.0) == [(2, 1)]
    assert node_program.suspect_links([1, 2, 3], rows, 0.7, 3, 1.0) == [(2, 1), (3, 3)]
    assert node_program.suspect_links([1, 2, 3], rows, 0.625, 3, 5e-3) == []  # over budget
    # CI, stop 41: a throttled NIC (rank 2 receives at 1/100) makes its ring neighbour's link
    # look slow too; the throttled links do not fit in the budget, the neighbour's does
    rows = [[t, t, 2.2 * t], [t, t, t], [100 * t, 100 * t, 100 * t], [t, t, t]]
    assert node_program.suspect_links([1, 2, 3], rows, 0.625, 3, 0.05) == [(3, 0)]
    assert node_program.suspect_links([1, 2, 3], rows, 0.625, 3, 1.0) == [
        (1, 2),
        (2, 2),
        (3, 0),
        (3, 2),
    ]
    assert node_program.suspect_links([1, 2, 3], [[t] * 3] * 4, 0.625, 3, 1.0) == []


def test_shifts() -> None:
    assert shifts(1) == []
    assert shifts(2) == [1]
    assert shifts(4) == [1, 2, 3]
    big = shifts(64, [f"h{i}" for i in range(64)])
    assert big[:2] == [1, 63] and len(big) == 4
    assert big == shifts(64, [f"h{i}" for i in range(64)])  # seeded: the same plan again


def _port(root: Path, dev: str, port: str, state: str, rate: str, layer: str = "InfiniBand"):
    d = root / dev / "ports" / port
    d.mkdir(parents=True)
    (d / "state").write_text(state + "\n")
    (d / "rate").write_text(rate + "\n")
    (d / "link_layer").write_text(layer + "\n")


def test_ib_sysfs(tmp_path: Path) -> None:
    _port(tmp_path, "mlx5_0", "1", "4: ACTIVE", "200 Gb/sec (4X HDR)")
    _port(tmp_path, "mlx5_1", "1", "1: DOWN", "10 Gb/sec (4X SDR)")
    _port(tmp_path, "mlx5_2", "1", "4: ACTIVE", "100 Gb/sec (2X HDR)")
    _port(tmp_path, "mlx5_3", "1", "1: DOWN", "40 Gb/sec", layer="Ethernet")
    got = node_program.ib_ports(str(tmp_path))
    assert [(p["device"], p["state"], p["rate"]) for p in got] == [
        ("mlx5_0", "ACTIVE", 200.0),
        ("mlx5_1", "DOWN", 10.0),
        ("mlx5_2", "ACTIVE", 100.0),
        ("mlx5_3", "DOWN", 40.0),
    ]
    assert node_program.ib_ports(str(tmp_path / "none")) == []  # no IB: nothing, no error
    healthy = [got[0]]
    problems = ib_problems({"a": healthy, "b": healthy, "c": got})
    assert problems == {
        "c": ["IB mlx5_1/1 is DOWN", "IB mlx5_2/1 at 100 Gb/s, the fleet's ports run 200 Gb/s"]
    }
