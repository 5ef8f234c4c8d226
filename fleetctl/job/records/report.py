"""report.html, written into a job's run folder when it ends: by the attached run
(``fleetctl.job.run.submit``) and by a detached job's monitor (``fleetctl.job.monitor.watch``)
alike, so neither imports the other for it. The writer itself (``fleetctl.report``) sits
above the job core: the API hands it in as a :data:`ReportWriter`, so the job layer only
calls it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.job.records.result import JobEvent

# Writes the report of the job whose first run folder it is given; returns the file written
# (``fleetctl.report.write_report``).
ReportWriter = Callable[[Path], Path]


def write_run_report(
    writer: ReportWriter, folder: str | Path, job_id: str, on_event: Callable[[JobEvent], None]
) -> None:
    """report.html into the job's first run folder (every attempt in it), for an attached
    run and a detached job's monitor alike. Never changes the run's outcome: a failure to
    write it is a warning, and so is a Ctrl-C while it is written (the job has ended and its
    result is final: the run still returns it, and ``fleetctl report`` writes the page later)."""
    from fleetctl.job.records.result import JobEvent
    from fleetctl.job.records.runs import ATTEMPT_RE

    if not folder:
        return
    folder = Path(folder)
    m = ATTEMPT_RE.match(folder.name)
    if m and (folder.parent / m.group("base")).is_dir():
        folder = folder.parent / m.group("base")
    try:
        path = writer(folder)
        on_event(JobEvent("notice", f"report: {path} (`fleetctl report {job_id}`)"))
    except Exception as e:  # a report is a convenience, never the run's verdict
        on_event(JobEvent("warning", f"report not written: {type(e).__name__}: {e}"))
    except KeyboardInterrupt:
        later = f"`fleetctl report {job_id}`"
        on_event(JobEvent("warning", f"report not written: interrupted ({later} writes it)"))
