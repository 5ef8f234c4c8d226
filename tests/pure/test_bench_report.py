"""bench/run.py's report from real recorded rows (docs/benchmarks.json, every measurement's):
each measured section gets its table, never a ``not measured``. The lab smoke
(tests/lab/test_bench_smoke.py) runs only the measurements it checks; this keeps the rendering
of all the others' rows proven, in a second."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDED = ROOT / "docs" / "benchmarks.json"


def test_every_recorded_measurement_is_rendered_as_a_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from report import SECTIONS

    out = tmp_path / "bench.md"
    render = [sys.executable, str(ROOT / "bench" / "run.py"), "--render", str(RECORDED)]
    p = subprocess.run(
        [*render, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    rows = json.loads(RECORDED.read_text())["results"]
    groups = {r["group"] for r in rows}
    assert len(groups) >= 10, groups  # the recording holds most measurements, not a stub
    for group, title, _ in SECTIONS:
        if group not in groups:
            continue
        body = text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
        assert "not measured" not in body.split("|", 1)[0], (group, body[:300])
        table = [x for x in body.splitlines() if x.startswith("| ")]
        tools = {r["tool"] for r in rows if r["group"] == group}
        assert len(table) >= len(tools), (group, body[:600])  # a row per tool, and a header
        for tool in tools:
            assert any(f"| {tool} |" in x for x in table), (group, tool)
    # the committed page is exactly this rendering: a by-hand section (bench/by_hand.md) or a
    # report change that was not rendered into docs/benchmarks.md shows here
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert page == text, "docs/benchmarks.md is stale: python bench/run.py --render " + (
        "docs/benchmarks.json --out docs/benchmarks.md"
    )
