"""``fleetctl_gpus`` as a count or a list of GPUs (indices or UUIDs), read from the inventory."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory import load_inventory

CASES = [
    ("4", 4, ()),
    ("'4'", 4, ()),
    ("'2,3'", 2, ("2", "3")),
    ("[2, 3]", 2, ("2", "3")),
    ("'3'", 3, ()),  # one number alone is a count, as before
    ("[5]", 1, ("5",)),  # a list of one is a list
    ("[GPU-8f2e9a3c-1b2d-4e5f-a6b7-c8d9e0f1a2b3, MIG-GPU-1/2/0]", 2,
     ("GPU-8f2e9a3c-1b2d-4e5f-a6b7-c8d9e0f1a2b3", "MIG-GPU-1/2/0")),
]  # fmt: skip


@pytest.mark.parametrize(("value", "count", "ids"), CASES)
def test_fleetctl_gpus_is_a_count_or_a_list(
    tmp_path: Path, value: str, count: int, ids: tuple[str, ...]
) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    g1:\n      fleetctl_gpus: {value}\n")
    [node] = load_inventory(inv).nodes
    assert (node.gpus, node.gpu_ids) == (count, ids)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("'2,x'", "'x' is not a GPU index or UUID"),
        ("[1, 1]", "names a GPU twice"),
        ("[]", "(empty)"),
        ("-1", "must be a count or a list"),
        ("{a: 1}", "must be a count or a list of GPUs"),
    ],
)
def test_a_bad_gpu_list_is_one_line_naming_file_line_and_host(
    tmp_path: Path, value: str, message: str
) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  hosts:\n    g1:\n      fleetctl_gpus: {value}\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    text = e.value.one_line()
    assert text.startswith(f"{inv}:4: host g1: ") and message in text and "\n" not in text
