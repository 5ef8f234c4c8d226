"""Smoke run of the benchmark (``bench/run.py --quick --hosts 2 --only …``): it runs end to
end on a real lab, writes a report whose numbers come from that run, and leaves no lab behind.

Speed is never asserted here (numbers go to docs/benchmarks.md, not to pass/fail). Only the
measurements whose rows are checked below run (``MEASURED``): the others (containers, ssh,
stall, before, scale: over half the smoke's time) were never judged here — one that fails says
``not measured`` and the smoke passed anyway — so running them proved nothing but that they
end. tests/pure/test_bench_report.py renders every section from the recorded rows of every
measurement (docs/benchmarks.json).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.lab.constants import REGISTRY
from fleetctl.testing.pytest_plugin import require_lab

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [
    "## 1. Fan-out",
    "## 2. Teardown latency",
    "## 3. Lost-node latency",
    "## 4. Push",
    "## 5. Log streaming",
    "## 6. Whole pipeline",
    "## 8. A fleet of",
]
# The measurements whose rows the test checks; bench/run.py names the rest "not selected".
MEASURED = ("fanout", "teardown", "lost", "push", "logs", "pipeline", "fleet")


def test_quick_bench_writes_a_measured_report(tmp_path: Path) -> None:
    require_lab()
    out = tmp_path / "bench.md"
    env = dict(os.environ, FLEETCTL_SSH_CONFIG="/dev/null")
    env.pop("SSH_AUTH_SOCK", None)
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "--quick",
            "--hosts",
            "2",
            "--only",
            ",".join(MEASURED),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    m = re.search(r"bench: lab (\w+) up", p.stderr)
    assert m, p.stderr[-2000:]
    name = m.group(1)
    assert not (REGISTRY / f"{name}.json").exists(), "the bench left its lab registered"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{name}-" not in netns, "the bench left lab namespaces behind"
    text = out.read_text()
    for section in SECTIONS:
        assert section in text
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["meta"]["quick"] is True and data["meta"]["sizes"] == [2]
    rows = {(r["group"], r["tool"], r["n"]): r for r in data["results"]}
    # fleetctl's own fan-out row must be a real, checked measurement (every host answered)
    fl = rows[("fanout", "fleetctl exec", 2)]
    assert fl["failed"] is None and len(fl["samples"]) == 1 and fl["samples"][0] > 0
    assert "| fleetctl exec | 2 |" in text
    # every measurement either produced rows or says why it did not, never silently nothing
    groups = {r["group"] for r in data["results"]}
    # the fleet rows are checked answers: the healthy check passed, the cut link was named
    for tool in ("fleetctl check (healthy lab)", "fleetctl check, one data link cut (node3)"):
        row = rows[("fleet", tool, 4)]
        assert row["failed"] is None and row["failures"] == 0, row
    run = rows[("fleet", "fleetctl run no-op job (check + no-op push + launch + collect)", 4)]
    assert run["failed"] is None and run["extra"]["check CPU ms/node"][0] > 0, run
    for group in ("teardown", "lost", "push", "logs", "pipeline", "fleet"):
        assert group in groups or group in data["skipped"], group
        if group in data["skipped"]:
            assert data["skipped"][group].startswith("not measured: ")
    # and what was left out says so (the report is never silent about a measurement)
    for name, why in data["skipped"].items():
        assert name in MEASURED or why == "not selected (--only)", (name, why)
