"""The slow-node verdict's stack evidence: py-spy samples of every rank, as shares.

The judge (``pace.py``) names the node from the kernel's account of where its ranks' time
goes; it cannot say *which* wait the peers are in. Once it names one, every rank of every node
is sampled a few times with ``py-spy dump`` (``fleetctl.remote.programs.stacksample`` classifies
each sample node-side: ``wait`` in a collective, ``idle`` asleep elsewhere, ``compute``) and the
tallies become the evidence ``peers wait in all_reduce 78% of the time``. Pure: tallies in,
shares and words out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = ("wait", "idle", "compute")


@dataclass(frozen=True)
class NodeSamples:
    """One node's samples, summed over its ranks (``error``: why it has none, or some failed)."""

    rank: int
    host: str
    wait: int = 0
    idle: int = 0
    compute: int = 0
    unknown: int = 0
    places: dict[str, int] = field(default_factory=dict)
    error: str | None = None

    @property
    def samples(self) -> int:
        return self.wait + self.idle + self.compute

    @classmethod
    def from_reply(cls, rank: int, host: str, reply: dict[str, Any]) -> NodeSamples:
        """From ``phases.stacks.sample_stacks``'s answer for one node."""
        sums = dict.fromkeys((*KINDS, "unknown"), 0)
        places: dict[str, int] = {}
        errors = [reply["error"]] if isinstance(reply.get("error"), str) else []
        for row in reply.get("ranks") or []:
            if not isinstance(row, dict):
                continue
            for k in sums:
                sums[k] += int(row.get(k) or 0)
            for p, n in (row.get("places") or {}).items():
                places[str(p)] = places.get(str(p), 0) + int(n)
            if isinstance(row.get("error"), str):
                errors.append(row["error"])
        return cls(rank, host, **sums, places=places, error=errors[0] if errors else None)


@dataclass(frozen=True)
class SlowStacks:
    """The shares in a verdict (job.json's ``slow.stacks``). ``peers_wait``: the share of the
    peers' samples inside a collective (None: no peer sample); ``places``: that share by
    collective; ``peers_idle``: asleep outside any; ``node_compute``: the share of the slow
    node's samples computing; ``samples``: all classified samples; ``note``: why there is no
    figure, or what failed."""

    samples: int
    peers_wait: float | None
    places: dict[str, float]
    node_compute: float | None
    nodes: list[NodeSamples]
    note: str | None = None
    peers_idle: float | None = None  # the share of the peers' samples asleep elsewhere

    def phrase(self) -> str | None:
        """``peers wait in all_reduce 78% of the time (py-spy, 24 samples)``; None: no figure."""
        if self.peers_wait is None:
            return None
        where = sorted(self.places.items(), key=lambda kv: (-kv[1], kv[0]))
        if len(where) == 1:
            said = f"{where[0][0]} {100 * self.peers_wait:.0f}%"
        elif where:
            said = ", ".join(f"{p} {100 * s:.0f}%" for p, s in where)
        elif self.peers_idle:  # asleep, but in no collective: not waiting for this node
            return (
                f"peers wait in no collective, asleep elsewhere {100 * self.peers_idle:.0f}% "
                f"of the time (py-spy, {self.samples} samples)"
            )
        else:
            said = "collectives 0%"
        return f"peers wait in {said} of the time (py-spy, {self.samples} samples)"


def shares(slow: int, nodes: list[NodeSamples]) -> SlowStacks:
    """The evidence for node ``slow`` against the others."""
    mine = [n for n in nodes if n.rank == slow]
    peers = [n for n in nodes if n.rank != slow]
    total = sum(n.samples for n in nodes)
    seen = sum(n.samples for n in peers)
    waited = sum(n.wait for n in peers)
    places: dict[str, float] = {}
    for n in peers:
        for p, k in n.places.items():
            places[p] = places.get(p, 0.0) + k
    own = sum(n.samples for n in mine)
    errors = sorted({f"{n.host}: {n.error}" for n in nodes if n.error})
    note = None
    if errors:
        note = "; ".join(errors)
    if total == 0:
        note = f"no stack samples: {note or 'no rank answered'}"
    return SlowStacks(
        samples=total,
        peers_wait=round(waited / seen, 3) if seen else None,
        places={p: round(k / seen, 3) for p, k in places.items()} if seen else {},
        node_compute=round(sum(n.compute for n in mine) / own, 3) if own else None,
        nodes=nodes,
        note=note,
        peers_idle=round(sum(n.idle for n in peers) / seen, 3) if seen else None,
    )


def from_replies(slow: int, hosts: dict[int, str], report: dict[str, Any]) -> SlowStacks:
    """The evidence from what the sampling thread posted: ``replies`` by node rank (each
    ``phases.stacks.sample_stacks``'s answer for a node), or ``error`` (it failed whole)."""
    if isinstance(report.get("error"), str):
        return SlowStacks(0, None, {}, None, [], note=f"no stack samples: {report['error']}")
    replies = report.get("replies") or {}
    return shares(
        slow, [NodeSamples.from_reply(r, hosts[r], got) for r, got in sorted(replies.items())]
    )
