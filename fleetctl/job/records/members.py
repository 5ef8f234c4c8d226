"""``run --elastic``: who holds each node slot of the job now, read from job.json.

The running controller records every membership change (``fleetctl.job.run.elastic``) in
job.json's ``membership`` and the slot's current host in ``nodes``; ``fleetctl status`` and
``Job.status()`` show both as one list: each slot's holder (``running``, ``joining`` while a
spare is being started, ``left`` when the job went on without it, or how it ended) and every
host that lost its slot (``lost``), each since when. None for a run without ``--elastic``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.job.records.jobrecord import JobRecord

#: node states in which a slot's holder is still a member that runs (or is about to)
_RUNNING = {"pending", "running"}


@dataclass(frozen=True)
class Member:
    """One host's place in an elastic job: its slot (node rank), state, since when (ISO-8601
    UTC, None when not recorded) and why (a lost host's reason; a spare: whose place)."""

    slot: int
    host: str
    state: str  # running, joining, left, lost, or how the node ended (succeeded, failed, ...)
    since: str | None = None
    why: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "slot": self.slot,
            "host": self.host,
            "state": self.state,
            "since": self.since,
            "why": self.why,
        }


def members(job: JobRecord) -> list[Member] | None:
    """Every slot's holder, then the hosts that lost it, slot by slot; None without
    ``--elastic`` (an elastic run records ``membership``, empty until a change)."""
    if job.membership is None:
        return None
    changes = [c for c in job.membership if isinstance(c, dict)]
    out: list[Member] = []
    for node in sorted(job.nodes, key=lambda n: n.rank):
        mine = [c for c in changes if c.get("rank") == node.rank]
        joined = next((c for c in reversed(mine) if c.get("joined") == node.host), None)
        if joined is not None and not joined.get("joined_at") and node.state in _RUNNING:
            state, since = "joining", _text(joined.get("lost_at"))
        elif node.state in _RUNNING:
            state, since = "running", node.start_time
        else:
            state, since = node.state, node.end_time
        why = None if joined is None else f"spare for {joined.get('left')}"
        if state in ("left", "lost"):  # the job went on without it, or ended (node 0)
            why = node.reason
        out.append(Member(node.rank, node.host, state, since, why))
        for c in reversed(mine):  # the hosts that held this slot before, newest first
            if c.get("joined") is not None:
                out.append(
                    Member(
                        node.rank,
                        str(c.get("left")),
                        "lost",
                        _text(c.get("lost_at")),
                        _text(c.get("why")),
                    )
                )
    return out


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
