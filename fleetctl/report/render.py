"""The report as one self-contained HTML file: :func:`render` fills the package's jinja2
templates (``templates/``, shipped as package data) with a :class:`~fleetctl.report.model.Report`.

Self-contained means: inline CSS and SVG only, no script, no external URL (the page makes
no request: it opens from a copied folder, an air-gapped cluster, a mail attachment); links
point at the run folder's own files, relative to where the report is written. jinja2 is
imported here and only here, when a report is made, never at ``fleetctl`` start-up.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.report import svg

if TYPE_CHECKING:
    import jinja2

    from fleetctl.report.model import Report


def _env() -> jinja2.Environment:  # jinja2: imported here, lazily
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("fleetctl.report", "templates"),
        bytecode_cache=_bytecode_cache(jinja2),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["seconds"] = _seconds
    env.filters["gbps"] = lambda v: f"{v:.3g}"
    return env


def _bytecode_cache(jinja2: Any) -> jinja2.BytecodeCache | None:
    """The templates compiled once, kept in the controller's cache folder (``jinja2/``, keyed
    by each template's source): compiling them cost ~0.07 s of CPU at the end of every run,
    loading them ~2 ms. Best effort: a folder that cannot be made or written, or a damaged
    entry, only means compiling again."""
    from fleetctl.phases.codesync import cache_dir

    class Cache(jinja2.FileSystemBytecodeCache):
        def load_bytecode(self, bucket: Any) -> None:
            try:
                super().load_bytecode(bucket)
            except Exception:  # a damaged entry: compile as without one
                bucket.reset()

        def dump_bytecode(self, bucket: Any) -> None:
            with contextlib.suppress(OSError):
                super().dump_bytecode(bucket)

    folder = cache_dir() / "jinja2"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.lstat()
    except OSError:
        return None
    # compiled code is loaded from it: only from a folder of ours that no one else may write
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return Cache(str(folder))


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
