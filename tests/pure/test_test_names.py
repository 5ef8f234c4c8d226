"""Test files are imported by basename (no packages under tests/): two folders holding the same
file name make ``pytest tests`` stop with "import file mismatch" before any test runs."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: where for name, where in seen.items() if len(where) > 1}
    assert not clashes, f"rename one of each: {clashes}"
