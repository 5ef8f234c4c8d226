"""The jobs of a runs folder, read from their run folders alone (no node is reached):
``fleetctl runs``' rows, retry attempts folded into their job."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.job.records import RunRecord

DEFAULT_RUNS_DIR = "fleet-runs"


def runs(runs_dir: str | Path = DEFAULT_RUNS_DIR) -> list[RunRecord]:
    """Every job under ``runs_dir``, oldest first: ``RunRecord`` (job_id, launcher, nodes,
    status, started, duration, first_failure in words, attempts, detached, folder, left_out;
    ``to_dict()`` is ``fleetctl runs --json``'s row). A job.json that cannot be read (or has a
    value of the wrong type) is left out, never hiding the others."""
    from fleetctl.job.records import list_records

    return list_records(runs_dir)
