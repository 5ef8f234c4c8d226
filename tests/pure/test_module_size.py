"""No module of the package is over 600 lines: past that a module holds more than one
responsibility and is split along its seams (issue 27)."""

from __future__ import annotations

from pathlib import Path

import fleetctl

ROOT = Path(fleetctl.__file__).parent
LIMIT = 600


def test_no_fleetctl_module_is_over_600_lines() -> None:
    big = {}
    for path in sorted(ROOT.rglob("*.py")):
        with path.open("rb") as f:
            count = sum(1 for _ in f)
        if count > LIMIT:
            big[str(path.relative_to(ROOT.parent))] = count
    assert not big, f"modules over {LIMIT} lines (split them along their seams): {big}"
