""".ci/run's plain-user and shared-home passes pick their tests by marker (``login``,
``shared_home``) from the files it lists: a test marked for a pass in a file the list misses
would silently never run under that condition."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKS = re.compile(r"pytest\.mark\.(login|shared_home)\b")


def listed() -> list[str]:
    script = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^condition_tests=\(([^)]*)\)", script, re.M)
    assert m, "no condition_tests=(…) in .ci/run"
    return m.group(1).split()


def test_every_file_with_a_login_or_shared_home_test_is_in_the_passes_list() -> None:
    marked = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if p.parent.name != "pure" and MARKS.search(p.read_text())
    }
    files = listed()
    assert marked - set(files) == set(), "marked but not in .ci/run's condition_tests"
    assert set(files) - marked == set(), "in .ci/run's condition_tests, with no marked test"
    assert len(files) == len(set(files))


def test_each_pass_runs_only_its_marker_with_its_condition() -> None:
    script = (ROOT / ".ci" / "run").read_text().replace("\\\n", " ")
    runs = [x for x in script.splitlines() if '"${condition_tests[@]}"' in x]
    assert len(runs) == 2, runs
    login, shared = runs
    assert login.startswith("FLEETCTL_LAB_USER=fleetci ") and " -m login " in login
    assert "SHARED_HOME" not in login
    assert shared.startswith("FLEETCTL_LAB_USER=fleetci FLEETCTL_LAB_SHARED_HOME=1 ")
    assert " -m shared_home " in shared
