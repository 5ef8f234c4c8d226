"""The collective preflight's plan and verdict (its options: ``plan/collective.py``). Pure.

Figures are bus bandwidth in nccl-tests' sense (GB/s = 1e9 bytes/s): an all-reduce moves
``algbw x 2(n-1)/n`` over each rank's link; a send/recv's busbw is its algbw.

Which pairs: one round of send/recv per ring shift ``k`` (rank r → r+k, all ranks at once, so a
round is a permutation and every node sends and receives once). Up to ``ALL_PAIRS_UP_TO`` nodes
every shift (every ordered pair), beyond the ring both ways plus ``RANDOM_SHIFTS`` seeded ones
(as the mesh plan draws its random peers: the same fleet gets the same plan).

The verdict: a node's figure is the lower of the upper medians of its outgoing and incoming
links, so one slow link does not make either end slow, while a node whose NIC is slow has most
of its links slow and is named alone; slow nodes are named worst first and their peers judged
without their links to them (the host sending to a throttled NIC is not its culprit). A node
or link below ``min_fraction`` of the fleet's (upper) median link, or below the absolute
``floor``, fails; a uniformly slow fleet passes unless the floor says otherwise. A node
whose program did not finish is hung.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# the options record lives in plan/ (a role job file holds one); the judge reads it
from fleetctl.plan.collective import CollectiveOptions
from fleetctl.plan.collective import MiB as MiB

ALL_PAIRS_UP_TO = 8
RANDOM_SHIFTS = 2
GB = 1e9


def shifts(n: int, names: Sequence[str] = ()) -> list[int]:
    """The ring shifts whose send/recv rounds run on a fleet of ``n`` nodes."""
    if n < 2:
        return []
    if n <= ALL_PAIRS_UP_TO:
        return list(range(1, n))
    seed = hashlib.sha256("\0".join(names).encode()).hexdigest()
    middle = list(range(2, n - 1))
    picked = random.Random(seed).sample(middle, min(RANDOM_SHIFTS, len(middle)))
    return [1, n - 1, *sorted(picked)]


def upper_median(values: Sequence[float]) -> float:
    s = sorted(values)
    return s[len(s) // 2] if s else 0.0


@dataclass(frozen=True)
class Link:
    src: str
    dst: str
    busbw: float  # GB/s

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "busbw": round(self.busbw, 4)}


@dataclass
class CollectiveReport:
    """Per-node and per-link figures (GB/s), and who failed why (host → reasons)."""

    order: list[str]
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    allreduce: dict[str, Any] = field(default_factory=dict)
    median: float = 0.0
    threshold: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)
    hung: dict[str, str] = field(default_factory=dict)  # host -> its stacks (may be "")
    elapsed: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failed_hosts(self) -> list[str]:
        bad = {h for h, _ in self.failures}
        return [h for h in self.order if h in bad]

    def summary(self) -> str:
        if self.ok:
            return f"collective ok: median link {self.median:.3g} GB/s"
        return f"collective: {len(self.failed_hosts)} host(s) slow, hung or failing"

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": self.nodes,
            "links": [x.to_dict() for x in self.links],
            "allreduce": self.allreduce,
            "median_link_busbw": round(self.median, 4),
            "threshold_busbw": round(self.threshold, 4),
            "failures": [{"host": h, "reason": r} for h, r in self.failures],
            "hung": dict(self.hung),
            "elapsed": round(self.elapsed, 3),
        }


def _gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / GB if seconds > 0 else 0.0


def judge(
    order: Sequence[str],
    results: Mapping[str, Mapping[str, Any]],
    options: CollectiveOptions,
    *,
    hung: Mapping[str, str] | None = None,
    errors: Mapping[str, str] | None = None,
) -> CollectiveReport:
    """The verdict from each node's ``D`` answer (``results``, by host), the hosts that did
    not finish (``hung``: host → stacks) and those that failed otherwise (``errors``)."""
    order = list(order)
    rep = CollectiveReport(order=order)
    hung = dict(hung or {})
    errors = dict(errors or {})
    for host in order:
        r = results.get(host)
        if r is not None and r.get("error"):
            errors.setdefault(host, str(r["error"]))
    for host in order:
        if host in hung:
            rep.hung[host] = hung[host]
            rep.failures.append((host, "hung: the collective did not complete in time"))
        elif host in errors:
            rep.failures.append((host, errors[host]))
    good = {h: r for h, r in results.items() if h in order and not r.get("error")}
    for h, r in good.items():
        for x in r.get("links") or ():
            src = order[int(x["src"])]
            rep.links.append(Link(src, h, _gbps(x["bytes"], x["seconds"])))
    rep.links.sort(key=lambda x: (order.index(x.src), order.index(x.dst)))
    for h in order:
        if h not in good:
            continue
        r = good[h]
        ar = r.get("allreduce") or {}
        outs = [x.busbw for x in rep.links if x.src == h]
        ins = [x.busbw for x in rep.links if x.dst == h]
        node: dict[str, Any] = {
            "busbw": round(min(upper_median(outs), upper_median(ins)), 4) if outs and ins else None,
            "send": round(upper_median(outs), 4) if outs else None,
            "recv": round(upper_median(ins), 4) if ins else None,
            "allreduce_busbw": round(ar.get("busbw", 0.0) / GB, 4) if ar else None,
            "backend": r.get("backend"),
            "torch": r.get("torch"),
        }
        intra = r.get("intra")
        if intra:
            node["intra_busbw"] = round(intra["busbw"] / GB, 4)
            node["gpus"] = intra.get("gpus")
        if r.get("ib"):
            node["ib"] = list(r["ib"])
        rep.nodes[h] = node
    ars = [good[h]["allreduce"] for h in good if good[h].get("allreduce")]
    if ars:
        worst = max(ars, key=lambda a: a["seconds"])  # the collective ends with its last rank
        rep.allreduce = {
            "bytes": worst["bytes"],
            "seconds": round(worst["seconds"], 6),
            "algbw": round(worst["algbw"] / GB, 4),
            "busbw": round(worst["busbw"] / GB, 4),
            "ranks": len(order),
        }
    rep.median = upper_median([x.busbw for x in rep.links])
    rep.threshold = max(options.min_fraction * rep.median, options.floor or 0.0)
    _slow(rep, options)
    _intra_and_ib(rep, options)
    if options.floor and rep.allreduce and rep.allreduce["busbw"] < options.floor:
        for h in good:
            rep.failures.append(
                (
                    h,
                    f"fleet all-reduce busbw {rep.allreduce['busbw']:.3g} GB/s "
                    f"< floor {options.floor:g} GB/s",
                )
            )
    rep.failures.sort(key=lambda f: order.index(f[0]))
    return rep


def _why(what: str, bw: float, rep: CollectiveReport, options: CollectiveOptions) -> str:
    if options.floor and rep.threshold == options.floor:
        ref = f"floor {options.floor:g} GB/s"
    else:
        ref = f"{options.min_fraction:g} x fleet median {rep.median:.3g} GB/s"
    return f"{what} busbw {bw:.3g} GB/s < {rep.threshold:.3g} GB/s ({ref})"


def _slow(rep: CollectiveReport, options: CollectiveOptions) -> None:
    """Name slow nodes worst first: once a node is named, its peers are judged on their links
    to the others, so the host sending to a throttled NIC is not named with it. A node left
    with no link to judge by keeps its own figure (two nodes cannot tell which end is slow)."""
    slow: list[str] = []
    while True:
        worst: tuple[float, float, str, str] | None = None
        for h, node in rep.nodes.items():
            if h in slow or node.get("busbw") is None:
                continue
            outs = [x.busbw for x in rep.links if x.src == h and x.dst not in slow]
            ins = [x.busbw for x in rep.links if x.dst == h and x.src not in slow]
            send = upper_median(outs) if outs else node["send"] or 0.0
            recv = upper_median(ins) if ins else node["recv"] or 0.0
            side, bw, links = ("recv", recv, ins) if recv <= send else ("send", send, outs)
            # on a tie the node whose every link on that side is slow goes first
            mean = sum(links) / len(links) if links else bw
            if bw < rep.threshold and (worst is None or (bw, mean) < worst[:2]):
                worst = (bw, mean, h, side)
        if worst is None:
            break
        bw, _, h, side = worst
        slow.append(h)
        rep.failures.append((h, _why(f"slow node ({side} side)", bw, rep, options)))
    for x in rep.links:
        if x.busbw < rep.threshold and x.src not in slow and x.dst not in slow:
            what = f"slow link {x.src} → {x.dst}"
            for h in (x.src, x.dst):
                rep.failures.append((h, _why(what, x.busbw, rep, options)))


def _intra_and_ib(rep: CollectiveReport, options: CollectiveOptions) -> None:
    intra = {h: n["intra_busbw"] for h, n in rep.nodes.items() if n.get("intra_busbw")}
    if len(intra) > 1 or options.floor:
        med = upper_median(list(intra.values()))
        limit = max(options.min_fraction * med if len(intra) > 1 else 0.0, options.floor or 0)
        for h, bw in intra.items():
            if bw < limit:
                rep.failures.append(
                    (
                        h,
                        f"intra-node all-reduce busbw {bw:.3g} GB/s < {limit:.3g} GB/s "
                        f"(fleet median {med:.3g})",
                    )
                )
    for h, bad in ib_problems({h: n.get("ib") or [] for h, n in rep.nodes.items()}).items():
        for why in bad:
            rep.failures.append((h, why))


def ib_problems(ports: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, list[str]]:
    """InfiniBand ports not ACTIVE, or ACTIVE below the fleet's common rate (the most
    frequent rate of active ports, the higher on a tie), by host."""
    rates: dict[float, int] = {}
    for plist in ports.values():
        for p in plist:
            if p.get("state") == "ACTIVE" and p.get("rate"):
                rates[p["rate"]] = rates.get(p["rate"], 0) + 1
    common = max(rates, key=lambda r: (rates[r], r)) if rates else None
    out: dict[str, list[str]] = {}
    for host, plist in ports.items():
        for p in plist:
            name = f"IB {p.get('device')}/{p.get('port')}"
            if p.get("link_layer") == "Ethernet":
                continue  # RoCE ports follow the NIC's own link, judged by the traffic
            if p.get("state") != "ACTIVE":
                out.setdefault(host, []).append(f"{name} is {p.get('state') or 'unknown'}")
            elif common is not None and (p.get("rate") or 0) < common:
                out.setdefault(host, []).append(
                    f"{name} at {p.get('rate'):g} Gb/s, the fleet's ports run {common:g} Gb/s"
                )
    return out
