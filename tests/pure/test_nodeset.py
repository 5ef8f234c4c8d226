"""Node set folding (clush-style ``node[1-3,5]``): golden table plus a round-trip property."""

from __future__ import annotations

import random

import pytest

from fleetctl.cli.nodeset import expand, fold

GOLDEN = [
    (["node1"], "node1"),
    (["node1", "node2", "node3", "node5"], "node[1-3,5]"),
    (["node3", "node1", "node2"], "node[1-3]"),
    (["node1", "node2", "node1"], "node[1-2]"),
    (["login", "node1", "node2"], "login,node[1-2]"),
    (["node1", "login", "node2"], "node[1-2],login"),
    (["gpu08", "gpu09", "gpu10", "gpu11"], "gpu[08-11]"),
    (["gpu1", "gpu01"], "gpu[01,1]"),
    (["n9", "n10", "n11"], "n[9-11]"),
    (["n098", "n099", "n100", "n1000"], "n[098-100,1000]"),
    (["n0", "n1"], "n[0-1]"),
    (["rack1-n01", "rack1-n02", "rack2-n01"], "rack1-n[01-02],rack2-n01"),
    (["a1b", "a2b", "a3c"], "a[1-2]b,a3c"),
    (["h1.lab", "h2.lab", "h4.lab"], "h[1-2,4].lab"),
    (["alpha", "beta"], "alpha,beta"),
    ([], ""),
]


@pytest.mark.parametrize(("names", "folded"), GOLDEN)
def test_fold_golden(names: list[str], folded: str) -> None:
    assert fold(names) == folded


@pytest.mark.parametrize(("names", "folded"), [g for g in GOLDEN if g[0]])
def test_expand_inverts_fold(names: list[str], folded: str) -> None:
    assert sorted(expand(folded)) == sorted(set(names))


def test_round_trip_random_names() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        names = set()
        for _ in range(rng.randint(1, 30)):
            prefix = rng.choice(["node", "gpu", "r1-n", "x"])
            value = rng.randint(0, 120)
            digits = str(value).zfill(rng.choice([0, 0, 2, 3]))
            names.add(prefix + digits + rng.choice(["", "", ".lab"]))
        folded = fold(sorted(names))
        assert sorted(expand(folded)) == sorted(names), folded
        assert fold(expand(folded)) == folded  # canonical: folding is idempotent


def test_many_consecutive_hosts_fold_to_one_range() -> None:
    assert fold(f"node{i}" for i in range(1, 33)) == "node[1-32]"


def test_unfoldable_names_kept_literally() -> None:
    assert fold(["weird[1]", "a,b"]) == "weird[1],a,b"


@pytest.mark.parametrize("bad", ["node[1-", "node[3-1]", "node]1[", "n[1-2][3]", "n[-2]"])
def test_expand_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        expand(bad)
