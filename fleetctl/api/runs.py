"""The jobs of a runs folder, read from their run folders alone (no node is reached):
``fleetctl runs``' rows, retry attempts folded into their job."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.job.records.runs import RunRecord

DEFAULT_RUNS_DIR = "fleet-runs"


def runs(runs_dir: str | Path = DEFAULT_RUNS_DIR) -> list[RunRecord]:
    """Every job under ``runs_dir``, oldest first: ``RunRecord`` (job_id, launcher, nodes,
    status, started, duration, first_failure in words, attempts, detached, folder, left_out;
    ``to_dict()`` is ``fleetctl runs --json``'s row). A job.json that cannot be read (or has a
    value of the wrong type) is left out, never hiding the others."""
    from fleetctl.job.records.runs import list_records

    return list_records(runs_dir)


def report(
    job: str | Path, *, runs_dir: str | Path = DEFAULT_RUNS_DIR, out: str | Path | None = None
) -> Path:
    """Write the offline HTML report of ``job`` (a job id or unique prefix in ``runs_dir``,
    or the path of its run folder) from its run folder alone, every retry attempt included,
    to ``out`` (default ``<run folder>/report.html``); the path written. RunFolderError when
    there is no such job or the file cannot be written (docs/report.md)."""
    from fleetctl.errors import RunFolderError
    from fleetctl.job.records.runfolder import load_run
    from fleetctl.job.records.runs import ATTEMPT_RE
    from fleetctl.report import write_report

    path = Path(job)
    if os.sep in str(job) or (path.is_dir() and (path / "job.json").is_file()):
        if not (path / "job.json").is_file():
            raise RunFolderError(f"{path}: not a run folder (no job.json)")
        folder = path
    else:
        folder = load_run(runs_dir, str(job)).path
    m = ATTEMPT_RE.match(folder.name)
    if m and (folder.parent / m.group("base") / "job.json").is_file():
        folder = folder.parent / m.group("base")  # a retry's folder: the job's first
    try:
        return write_report(folder, out)
    except OSError as e:
        where = out or folder / "report.html"
        raise RunFolderError(f"{where}: cannot write the report: {e}") from e
