"""A job's offline report: one self-contained HTML file made from its run folder alone.

:mod:`~fleetctl.report.model` reads the folder into typed facts (pure),
:mod:`~fleetctl.report.svg` lays out the plots, :mod:`~fleetctl.report.render` writes the
page. :func:`write_report` is the one entry the run's end and ``fleetctl report``
use (through ``fleetctl.api``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fleetctl.job.records.runfolder import REPORT_FILE


def build_report(folder: str | Path, *, out: str | Path | None = None) -> str:
    """The report of the job whose first run folder is ``folder``, as HTML text; its links
    are relative to ``out`` (default: a report inside ``folder``)."""
    from fleetctl.report.model import load
    from fleetctl.report.render import link_base, render

    folder = Path(folder)
    target = Path(out) if out is not None else folder / REPORT_FILE
    return render(load(folder), link_base=link_base(folder, target))


def write_report(folder: str | Path, out: str | Path | None = None) -> Path:
    """Write the report (atomically, mode 0600: it quotes the job's logs) to ``out``, default
    ``<folder>/report.html``; the path written."""
    folder = Path(folder)
    target = Path(out) if out is not None else folder / REPORT_FILE
    text = build_report(folder, out=target)
    fd, tmp = tempfile.mkstemp(prefix=".report-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
