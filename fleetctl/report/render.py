"""The report as one self-contained HTML file: :func:`render` writes a
:class:`~fleetctl.report.model.Report` out as the page, section by section, in plain Python.

Self-contained means: inline CSS (``templates/report.css``, shipped as package data) and SVG
only, no script, no external URL (the page makes no request: it opens from a copied folder, an
air-gapped cluster, a mail attachment); links point at the run folder's own files, relative to
where the report is written.

Every value from the run folder goes through :func:`_e` (``& < > " '`` as entities, as
markupsafe writes them) and every link through :func:`_url` (percent-quoted, ``/`` kept), so
no text a job printed can become markup. The page was made by jinja2 templates until issue 35:
with jinja2's import and the templates' load the report cost a run ~35 ms of CPU at its end
(~70 ms with a fresh cache folder, compiling them); written this way, ~7 ms in all
(docs/performance.md). tests/pure/test_report_golden.py holds the page to what the templates
wrote, byte for byte.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from fleetctl.report import svg

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetctl.report.model import Report

    Writer = Callable[[str], None]  # appends a piece of the page

_LEGEND = ("connect", "check", "push", "launch", "running", "teardown", "postmortem", "collect")


def _e(value: object) -> str:
    """``value`` as HTML text (markupsafe's entities: ``&#34;`` and ``&#39;`` for quotes)."""
    s = value if type(value) is str else str(value)
    if "&" in s:
        s = s.replace("&", "&amp;")
    return s.replace("<", "&lt;").replace(">", "&gt;").replace('"', "&#34;").replace("'", "&#39;")


def _url(path: object) -> str:
    """A run-folder path as a link (jinja2's ``urlencode`` of a string: UTF-8, ``/`` kept)."""
    return quote(str(path), safe="/")


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def _gbps(value: float) -> str:
    return f"{value:.3g}"


@cache
def _css() -> str:
    text = (Path(__file__).parent / "templates" / "report.css").read_text(encoding="utf-8")
    return text[:-1] if text.endswith("\n") else text


def render(report: Report, *, link_base: str = "") -> str:
    """The HTML text. ``link_base``: the run folder relative to the report file ('' when the
    report lies in it), prefixed to every link to a log."""
    timeline = svg.timeline(report.lanes, report.t0, report.t1)
    heatmap = svg.heatmap(report.collective) if report.collective else None
    lanes = svg.lanes(report.progress, report.t0, report.t1) if report.progress else None
    base = _e(link_base.rstrip("/") + "/" if link_base else "")
    out: list[str] = []
    w = out.append
    _head(w, report)
    _culprit(w, report, base)
    if report.errors:
        items = "".join(f"<li>{_e(x)}</li>" for x in report.errors)
        w(f'<section id="errors"><h2>Errors</h2><ul>{items}</ul></section>\n')
    _nav(w, report, heatmap is not None, lanes is not None)
    _timeline(w, report, timeline)
    _ranks(w, report, base)
    _checks(w, report)
    if heatmap is not None:
        _collective(w, report, heatmap)
    if lanes is not None:
        w('<section id="progress">\n<h2>Progress lanes per rank</h2>\n')
        w(
            "<p class=\"legend\">Bar: the node's run, shaded by the rank's output lines per"
            ' second (<span class="key p0"></span>low <span class="key p1"></span>mid'
            ' <span class="key p2"></span>high, against the busiest rank);'
            ' <span class="key m touch"></span>the node\'s last FLEET_PROGRESS_FILE touch.</p>\n'
        )
        w(f'<div class="plot">{_plot(lanes)}</div>\n</section>\n')
    _stacks(w, report)
    _logs(w, report, base)
    w(
        f"<footer>Written by fleetctl from the run folder {_e(report.job_id)} alone; links open"
        " that folder's files.</footer>\n</body>\n</html>"
    )
    return "".join(out)


def _head(w: Writer, r: Report) -> None:
    hosts = {h.lower() if isinstance(h, str) else h for h in (x.host for x in r.lanes)}
    w(
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\';'
        " style-src 'unsafe-inline'; img-src data:\">\n"
        f"<title>fleetctl report: {_e(r.job_id)} {_e(r.status)}</title>\n"
        f"<style>\n{_css()}</style>\n</head>\n<body>\n"
        f'<header id="verdict" class="{"ok" if r.status == "succeeded" else "bad"}">\n'
        f'<h1>Job {_e(r.job_id)}: <span class="status">{_e(r.status)}</span></h1>\n'
        f'<p class="verdict">{_e(r.verdict)}</p>\n'
        f'<p class="meta">{_e(r.launcher or "-")}'
        + (f" · {_e(r.script)}" if r.script else "")
        + f" · {len(hosts)} node(s) · launched {_e(r.started or '-')} · ran"
        f" {_seconds(r.duration)}"
        + (f" · {r.attempts} attempts" if r.attempts > 1 else "")
        + "</p>\n</header>\n"
    )


def _culprit(w: Writer, r: Report, base: str) -> None:
    c = r.culprit
    if not c:
        return
    w(
        f'<section id="culprit">\n<h2>Culprit: <span class="host">{_e(c.host)}</span></h2>\n'
        f'<table class="facts">\n<tr><th>node</th><td>{_e(c.node_rank)} ({_e(c.host)}'
        + (f", {_e(c.address)}" if c.address else "")
        + ")"
        + (f", attempt {_e(c.attempt)}" if r.attempts > 1 else "")
        + "</td></tr>\n"
    )
    if c.rank is not None:
        w(f"<tr><th>rank</th><td>{_e(c.rank)} (local rank {_e(c.local_rank)})</td></tr>")
    w(f"<tr><th>reason</th><td>{_e(c.reason)}</td></tr>\n")
    for cause in c.likely_cause:
        w(f"<tr><th>likely cause</th><td>{_e(cause)}</td></tr>")
    if c.hint:
        w(f"<tr><th>hint</th><td>{_e(c.hint)}</td></tr>")
    if c.error_log:
        link = f'<a href="{base}{_url(c.error_log)}">{_e(c.error_log)}</a>'
        w(f"<tr><th>log</th><td>{link}</td></tr>")
    w("</table>\n")
    if c.error_lines:
        w('<pre class="error">' + "".join(f"{_e(x)}\n" for x in c.error_lines) + "</pre>\n")
    w("</section>\n")


def _nav(w: Writer, r: Report, heatmap: bool, lanes: bool) -> None:
    w(
        '<nav><a href="#timeline">timeline</a> · <a href="#ranks">rank map</a> ·'
        ' <a href="#checks">check</a>'
        + (' · <a href="#collective">collective</a>' if heatmap else "")
        + (' · <a href="#progress">progress</a>' if lanes else "")
        + (' · <a href="#stacks">stacks</a>' if r.stacks else "")
        + (' · <a href="#logs">logs</a>' if r.excerpts else "")
        + "</nav>\n"
    )


def _timeline(w: Writer, r: Report, plot: svg.Plot) -> None:
    keys = "".join(f'<span class="key {k}"></span>{k} ' for k in _LEGEND)
    w(
        '<section id="timeline">\n<h2>Timeline per node</h2>\n'
        f'<p class="legend">{keys}<span class="key m failure"></span>first failure'
        ' <span class="key stall"></span>stalled <span class="key m stall"></span>stall called'
        ' <span class="key m slow"></span>slow node</p>\n'
        f'<div class="plot">{_plot(plot)}</div>\n'
        '<table class="nodes">\n<thead><tr><th>attempt</th><th>node</th><th>host</th>'
        "<th>state</th><th>end</th></tr></thead>\n<tbody>\n"
    )
    for x in r.lanes:
        w(
            f'<tr class="{"bad" if x.culprit else ""}"><td>{_e(x.attempt)}</td>'
            f"<td>{_e(x.rank)}</td><td>{_e(x.host)}{' (spare)' if x.spare else ''}</td>"
            f"<td>{_e(x.state)}</td><td>{_e(x.outcome)}</td></tr>\n"
        )
    w("</tbody>\n</table>\n</section>\n")


def _ranks(w: Writer, r: Report, base: str) -> None:
    w('<section id="ranks">\n<h2>Rank map</h2>\n')
    if r.ranks:
        w(
            "<table>\n<thead><tr><th>rank</th><th>node</th><th>local</th><th>pid</th>"
            "<th>end</th><th>logs</th></tr></thead>\n<tbody>\n"
        )
        for k in r.ranks:
            logs = "".join(
                f'<a href="{base}{_url(p)}">{_e(p.rsplit("/", 1)[-1])}</a> ' for p in k.logs
            )
            pid = _e(k.pid) if k.pid is not None else "-"
            w(
                f'<tr class="{"bad" if k.failed else ""}"><td>{_e(k.rank)}</td>'
                f"<td>{_e(k.node_rank)} {_e(k.host)}</td><td>{_e(k.local_rank)}</td>"
                f"<td>{pid}</td><td>{_e(k.outcome)}</td><td>{logs}</td></tr>\n"
            )
        w("</tbody>\n</table>\n")
    else:
        w("<p>No rank map in this run folder.</p>")
    w("".join(f'<p class="note">{_e(n)}</p>' for n in r.notes) + "</section>\n")


def _checks(w: Writer, r: Report) -> None:
    names = [c.name for c in r.checks[0].cells] if r.checks else []
    w(
        '<section id="checks">\n<h2>Check</h2>\n<table>\n<thead><tr><th>node</th><th>host</th>'
        "<th>address</th><th>NIC</th><th>training address</th><th>python</th><th>state</th>"
        "<th>note</th></tr></thead>\n<tbody>\n"
    )
    for k in r.checks:
        w(
            f"<tr><td>{_e(k.node_rank)}</td><td>{_e(k.host)}</td><td>{_e(k.address)}</td>"
            f"<td>{_e(k.nic or '-')}</td><td>{_e(k.train_addr or '-')}</td>"
            f"<td>{_e(k.python or '-')}</td><td>{_e(k.state)}</td><td>{_e(k.note)}</td></tr>\n"
        )
    w("</tbody>\n</table>\n")
    if names:
        heads = "".join(f"<th>{_e(n)}</th>" for n in names)
        w(f'<table class="cells">\n<thead><tr><th>host</th>{heads}</tr></thead>\n<tbody>\n')
        for k in r.checks:
            cells = "".join(
                f'<td class="{_e(c.status)}" title="{_e(c.status)}">'
                + (f"{_e(c.status)}: " if c.status in ("fail", "warn") else "")
                + f"{_e(c.detail or c.status)}</td>"
                for c in k.cells
            )
            w(f"<tr><td>{_e(k.host)}</td>{cells}</tr>\n")
        w("</tbody>\n</table>\n")
    w("</section>\n")


def _collective(w: Writer, r: Report, plot: svg.Plot) -> None:
    co = r.collective
    assert co is not None  # the heatmap is drawn from it
    allreduce = ""
    if "busbw" in co.allreduce:
        allreduce = f" All-reduce: {_e(_gbps(co.allreduce['busbw']))} GB/s."
    w(
        '<section id="collective">\n<h2>Collective matrix</h2>\n'
        "<p>Per-link bus bandwidth (row sends, column receives): median"
        f" {_e(_gbps(co.median))} GB/s, threshold {_e(_gbps(co.threshold))} GB/s.{allreduce}</p>\n"
    )
    if co.failures:
        items = "".join(f"<li><b>{_e(h)}</b>: {_e(why)}</li>" for h, why in co.failures)
        w(f'<ul class="bad">{items}</ul>')
    w(
        '<p class="legend"><span class="key h0"></span>&lt; 50 % of median'
        ' <span class="key h1"></span>&lt; 80 % <span class="key h2"></span>about the median'
        ' <span class="key h3"></span>above</p>\n'
        f'<div class="plot">{_plot(plot)}</div>\n</section>\n'
    )


def _stacks(w: Writer, r: Report) -> None:
    if not r.stacks:
        return
    w(
        '<section id="stacks">\n<h2>Stacks of the stall (folded)</h2>\n<table>\n'
        "<thead><tr><th>where</th><th>ranks</th><th>launchers (node)</th></tr></thead>\n"
        "<tbody>\n"
    )
    for i, s in enumerate(r.stacks, 1):
        bad = "bad" if i > 1 and s.ranks else ""
        ranks, nodes = ", ".join(map(str, s.ranks)), ", ".join(map(str, s.nodes))
        w(
            f'<tr class="{bad}"><td><code>{_e(s.frame)}</code></td><td>{_e(ranks)}</td>'
            f"<td>{_e(nodes)}</td></tr>\n"
        )
    w("</tbody>\n</table>\n</section>\n")


def _logs(w: Writer, r: Report, base: str) -> None:
    if not r.excerpts:
        return
    w('<section id="logs">\n<h2>Logs of the failing ranks</h2>\n')
    for x in r.excerpts:
        w(f'<h3>{_e(x.title)}: <a href="{base}{_url(x.path)}">{_e(x.path)}</a></h3>\n')
        if x.cut:
            w(
                f'<p class="note">the last {len(x.lines)} lines of {_e(x.total_bytes)} bytes;'
                " the whole file is in the run folder.</p>"
            )
        w("<pre>" + "".join(f"{_e(line)}\n" for line in x.lines) + "</pre>\n")
    w("</section>\n")


def _plot(p: svg.Plot) -> str:
    """One plot as inline SVG: texts, then rects (spans, cells), then marks."""
    out = [
        f'<svg role="img" aria-label="{_e(p.label)}" width="{_e(p.width)}"'
        f' height="{_e(p.height)}" viewBox="0 0 {_e(p.width)} {_e(p.height)}">\n'
    ]
    out += [
        f'<text x="{_e(t.x)}" y="{_e(t.y)}" class="{_e(t.cls)}"'
        f' text-anchor="{_e(t.anchor)}">{_e(t.text)}</text>\n'
        for t in p.texts
    ]
    for rects, prefix in ((p.rects, ""), (p.marks, "m ")):
        out += [
            f'<rect x="{_e(b.x)}" y="{_e(b.y)}" width="{_e(b.w)}" height="{_e(b.h)}"'
            f' class="{prefix}{_e(b.cls)}"><title>{_e(b.title)}</title></rect>\n'
            for b in rects
        ]
    out.append("</svg>\n")
    return "".join(out)


def link_base(folder: Path, out: Path) -> str:
    """The run folder as a link from the report file ``out``: relative ('' when ``out`` is in
    it), so the pair can be moved together."""
    rel = os.path.relpath(folder.resolve(), out.resolve().parent)
    return "" if rel == "." else rel
