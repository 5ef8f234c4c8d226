"""The offline report of a real failing 3-node lab run, read after the lab is gone and opened
in a real browser: headless Chromium (Debian's ``chromium``) in a network namespace of its
own with no interface up, so nothing could leave even if the page asked.

Two browser runs: one dumps the DOM of a copy of the report with a probe script appended (the
copy's Content-Security-Policy removed, so the page itself is all that stands between it and
the network) while Chromium's net log records every request; one takes the screenshot of the
report as written. ``FLEETCTL_REPORT_SCREENSHOT=PATH`` keeps that screenshot (docs/report.md's
picture is made so).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zlib
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.jobs import launched_job_id

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
WINDOW = (1280, 900)  # the first screen
# Node rank 1 prints a traceback and fails after ~1 s; the others tick until stopped.
FAILS_ON_1 = """\
import os, sys, time
rank = int(os.environ["FLEET_NODE_RANK"])
for i in range(600):
    print(f"step {i} rank={rank}", flush=True)
    if rank == 1 and i == 5:
        print("Traceback (most recent call last):", file=sys.stderr, flush=True)
        print("RuntimeError: <loss is nan> on node rank 1", file=sys.stderr, flush=True)
        sys.exit(7)
    time.sleep(0.2)
"""
# Appended to the DOM probe's copy: where the culprit's host name lies on the first screen.
PROBE = """<script>
var h = document.querySelector('#culprit .host').getBoundingClientRect();
document.body.setAttribute('data-culprit-bottom', String(h.bottom));
document.body.setAttribute('data-window', String(window.innerHeight));
</script>"""


def chromium(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Headless Chromium in a fresh network namespace (``unshare -n``: only a loopback that
    is down), without its own background traffic (updates, spell-check dictionaries)."""
    argv = [
        "unshare", "-n", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-component-update", "--no-first-run",
        f"--window-size={WINDOW[0]},{WINDOW[1]}", *args,
    ]  # fmt: skip
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def page_requests(net_log: Path) -> list[str]:
    """The URLs the page asked for (requests whose network isolation key is the file's
    origin), from Chromium's net log."""
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    return [
        e["params"]["url"]
        for e in log["events"]
        if e.get("type") == start
        and str(e.get("params", {}).get("network_isolation_key", "")).startswith("file://")
    ]


def png_colours(path: Path) -> tuple[tuple[int, int], int]:
    """A PNG's size and how many distinct byte values its (unfiltered) image data holds:
    a blank page has one or two."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", (0, 0)
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            size = (int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big"))
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return size, len(set(zlib.decompress(idat)))


def test_a_failing_lab_runs_report_is_made_after_lab_down_and_renders_offline_in_chromium(
    make_lab, tmp_path: Path
) -> None:
    lab: Lab = make_lab(3)
    code, runs = tmp_path / "code", tmp_path / "runs"
    code.mkdir()
    (code / "fails_on_1.py").write_text(FAILS_ON_1)
    r = run_cli(
        "run", "-i", str(lab.inventory_path), "--launcher", "plain", "--grace", "2",
        "--runs-dir", str(runs), "--code-dir", str(code), str(code / "fails_on_1.py"),
        cwd=ROOT,
    )  # fmt: skip
    assert r.exit_code == 3, r.stderr
    job_id = launched_job_id(r.stderr)
    assert "1-node2/console.log" in (runs / job_id / "report.html").read_text()  # the run's own
    lab.down()

    out = tmp_path / "report.html"
    r = run_cli("report", job_id[:15], "--runs-dir", str(runs), "-o", str(out))
    assert r.exit_code == 0 and r.stdout == f"{out}\n", r.stderr
    html = out.read_text()
    assert len(html.encode()) <= 2 * 1024 * 1024
    assert not re.search(r"https?://", html)
    assert "RuntimeError: &lt;loss is nan&gt; on node rank 1" in html

    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    probe, net_log = tmp_path / "probe.html", tmp_path / "net-log.json"
    csp = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>\n?')
    probe.write_text(csp.sub("", html).replace("</body>", PROBE + "</body>"))
    p = chromium(f"--log-net-log={net_log}", "--dump-dom", probe.as_uri())
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    culprit = re.search(r'<section id="culprit">.*?</section>', dom, re.S)
    assert culprit and '<span class="host">node2</span>' in culprit.group(0)
    assert "exit code 7" in culprit.group(0) and "loss is nan" in culprit.group(0)
    bottom = float(re.search(r'data-culprit-bottom="([\d.]+)"', dom).group(1))  # type: ignore[union-attr]
    assert 0 < bottom <= WINDOW[1], bottom  # in the first screen
    timeline = re.search(r'<section id="timeline">.*?</section>', dom, re.S)
    lanes = re.findall(
        r'class="lane[^"]*"[^>]*>([^<]+)</text>', timeline.group(0) if timeline else ""
    )
    assert lanes == ["0 node1", "1 node2", "2 node3"], lanes
    assert page_requests(net_log) == [], page_requests(net_log)

    shot = tmp_path / "report.png"
    p = chromium(f"--screenshot={shot}", out.as_uri())
    assert p.returncode == 0 and shot.is_file(), p.stderr[-2000:]
    size, colours = png_colours(shot)
    assert size == WINDOW and colours > 50, (size, colours)
    keep = os.environ.get("FLEETCTL_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
