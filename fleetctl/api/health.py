"""The health ledger as the command line and scripts use it (``fleetctl health``): which
hosts are out and why, clearing them, and the Slurm drain line for each."""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Sequence
from typing import Any

from fleetctl.errors import FleetctlError
from fleetctl.health.ledger import Entry, HostStatus, Ledger, record_sick

__all__ = [
    "Entry",
    "HostStatus",
    "Ledger",
    "clear",
    "clear_all",
    "drain",
    "drain_argv",
    "record_sick",
    "status",
    "to_dict",
]


def status(hosts: Sequence[str] | None = None) -> list[HostStatus]:
    """The hosts the ledger keeps out now (of ``hosts`` only, when given)."""
    held = Ledger().status()
    return [s for h, s in held.items() if hosts is None or h in hosts]


def clear(hosts: Sequence[str]) -> list[str]:
    """Forget ``hosts``; those that had entries."""
    return Ledger().clear(hosts)


def clear_all() -> int:
    """Forget every host; how many entries there were."""
    return Ledger().clear_all()


def to_dict(s: HostStatus) -> dict[str, Any]:
    """One host as ``fleetctl health --json`` prints it."""
    return {
        "host": s.host,
        "out": s.out,
        "pinned": s.pinned,
        "why": s.why(),
        "entries": [
            {
                "source": e.source,
                "reason": e.reason,
                "evidence": e.evidence,
                "job_id": e.job_id,
                "at": e.at,
                "expires": e.expires,
            }
            for e in s.entries
        ],
    }


def drain_argv(s: HostStatus) -> list[str]:
    """The ``scontrol`` command that drains ``s.host`` in Slurm with the ledger's reason."""
    reason = f"fleetctl: {s.entries[-1].reason}"[:200]
    return ["scontrol", "update", f"nodename={s.host}", "state=drain", f"reason={reason}"]


def drain(s: HostStatus, timeout: float = 30.0) -> None:
    """Run ``drain_argv(s)`` (``fleetctl health --drain``); one-line error when it fails."""
    argv = drain_argv(s)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FleetctlError(f"{shlex.join(argv)}: {e}") from None
    if proc.returncode != 0:
        last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        raise FleetctlError(f"{shlex.join(argv)} exited {proc.returncode}: {last[0]}")
