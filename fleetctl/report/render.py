"""The report as one self-contained HTML file: :func:`render` fills the package's jinja2
templates (``templates/``, shipped as package data) with a :class:`~fleetctl.report.model.Report`.

Self-contained means: inline CSS and SVG only, no script, no external URL (the page makes
no request: it opens from a copied folder, an air-gapped cluster, a mail attachment); links
point at the run folder's own files, relative to where the report is written. jinja2 is
imported here and only here, when a report is made, never at ``fleetctl`` start-up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.report import svg

if TYPE_CHECKING:
    import jinja2

    from fleetctl.report.model import Report


def _env() -> jinja2.Environment:  # jinja2: imported here, lazily
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("fleetctl.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seconds"] = _seconds
    env.filters["gbps"] = lambda v: f"{v:.3g}"
    return env


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


def render(report: Report, *, link_base: str = "") -> str:
    """The HTML text. ``link_base``: the run folder relative to the report file ('' when the
    report lies in it), prefixed to every link to a log."""
    plots = {
        "timeline": svg.timeline(report.lanes, report.t0, report.t1),
        "heatmap": svg.heatmap(report.collective) if report.collective else None,
        "lanes": svg.lanes(report.progress, report.t0, report.t1) if report.progress else None,
    }
    base = link_base.rstrip("/") + "/" if link_base else ""
    return _env().get_template("report.html.j2").render(r=report, plots=plots, base=base)


def link_base(folder: Path, out: Path) -> str:
    """The run folder as a link from the report file ``out``: relative ('' when ``out`` is in
    it), so the pair can be moved together."""
    rel = os.path.relpath(folder.resolve(), out.resolve().parent)
    return "" if rel == "." else rel
