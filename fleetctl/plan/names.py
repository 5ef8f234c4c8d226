"""The names a job's things go by, pure: its id, and a node's folder in a run folder (on the
node under ``W/runs/<job>/`` and in the controller's run folder alike)."""

from __future__ import annotations

import re
from datetime import datetime

from fleetctl.errors import PlanError


def format_job_id(now: datetime, suffix: str) -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>``: sortable by start time, unique with the random suffix.

    The caller passes the clock and the randomness (``secrets.token_hex(3)``), keeping this pure.
    """
    if not re.fullmatch(r"[0-9a-f]{6}", suffix):
        raise PlanError(f"job id suffix must be 6 lowercase hex digits, got {suffix!r}")
    return f"{now:%Y%m%d-%H%M%S}-{suffix}"


def node_folder_name(rank: int, host: str) -> str:
    """``<rank>-<host>`` with anything but [A-Za-z0-9._-] in the host name replaced: a node's
    run folder, on the node (under ``W/runs/<job>/``) and in the controller's run folder."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in host).lstrip(".") or "node"
    return f"{rank}-{safe}"
