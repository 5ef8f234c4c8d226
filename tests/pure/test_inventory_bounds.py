"""Unbounded inventory input is refused in one line, before it costs memory or time."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory import load_inventory


def test_a_host_range_past_the_limit_is_refused_before_expanding(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\ngpu[0:99999999]\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    msg = e.value.one_line()
    assert msg.startswith(f"{inv}:2:") and "names 100000000 hosts, more than 10000" in msg


def test_nested_ranges_multiply_and_are_bounded_too(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\nr[0:999]n[0:999]\n")
    with pytest.raises(InventoryError, match="more than 10000 hosts per pattern"):
        load_inventory(inv)


def test_a_range_at_the_limit_still_loads(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\ngpu[00001:10000]\n")
    assert len(load_inventory(inv).nodes) == 10_000


def test_a_yaml_alias_bomb_is_refused_naming_the_file(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        levels.append(f"a{i}: &a{i} [{refs}]")
    body = "\n".join("    " + line for line in levels)
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  vars:\n{body}\n  hosts:\n    g1: {{}}\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    msg = e.value.one_line()
    assert msg.startswith(f"{inv}:") and "aliases expand to more than 1000000 values" in msg


def test_ordinary_aliases_and_merges_still_work(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n    g1: &base {fleetctl_gpus: 2}\n    g2:\n      <<: *base\n"
        "      fleetctl_nic: ib0\n"
    )
    g1, g2 = load_inventory(inv).nodes
    assert g1.gpus == g2.gpus == 2 and g2.nic == "ib0"
