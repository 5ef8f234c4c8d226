"""docs/metrics.md's examples hold: its rules file passes ``promtool check rules`` and its
Grafana panel is JSON; both name only metrics a run serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl.job.monitor.exposition import render
from fleetctl.job.monitor.metrics import JobSample, NodeSample

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def _block(lang: str) -> str:
    blocks = re.findall(rf"^```{lang}\n(.*?)^```$", DOC.read_text(), re.M | re.S)
    assert len(blocks) == 1, f"docs/metrics.md: one ```{lang} block, found {len(blocks)}"
    return blocks[0]


def _served() -> set[str]:
    sample = JobSample(job_id="j", started=1.0, last_progress=2.0, now=3.0)
    sample.nodes = [NodeSample("h", 0, "running", 1, 2, 2.0, busbw=1.0)]
    return set(re.findall(r"^# TYPE (\S+) ", render(sample).decode(), re.M)) | {
        f"{n}_total" for n in re.findall(r"^# TYPE (\S+) counter", render(sample).decode(), re.M)
    }


def _named(text: str) -> set[str]:
    return set(re.findall(r"\bfleetctl_[a-z_]+", text))


def test_the_rules_example_passes_promtool_and_names_served_metrics(tmp_path: Path) -> None:
    rules = _block("yaml")
    assert _named(rules) <= _served()
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (apt-get install prometheus; .ci/run installs it)")
    (tmp_path / "rules.yml").write_text(rules)
    p = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yml")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS: 4 rules found" in p.stdout


def test_the_grafana_panel_is_json_that_names_served_metrics() -> None:
    panel = json.loads(_block("json"))
    exprs = [t["expr"] for t in panel["targets"]]
    assert exprs and all(_named(e) <= _served() for e in exprs)
