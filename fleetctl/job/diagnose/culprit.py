"""After a failure: a quick fresh check of every host, to name the likely cause next to the
node that exited first.

When a data link is cut, the node blamed first is whichever rank noticed first (its collective
timed out), not the host whose link is down. A post-mortem probe — the same check as preflight,
uncached, with short timeouts — sees the fleet as it is now: a host that no peer can reach on
the training network, a host that stopped answering SSH, a full disk, a lost GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.phases.check.preflight import CheckReport
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.ssh.fanout import FanOut

# cells a finished job's own processes cannot explain away (ports are the job's business)
_CAUSES = ("ssh", "ping", "python", "nic", "addr", "gpu", "disk")
# s the run waits for the probe at most: --post-mortem-timeout's default. It returns as soon as
# every host answered (well under 1 s on a quiet 3-host lab); the budget is for a loaded
# controller or a big fleet, where a fixed 2 s found nothing (the probe alone took longer).
POST_MORTEM_LIMIT = 30.0
TCP_TIMEOUT = 0.5  # s per mesh connection: the training network answers in ms when it works


def culprits(report: CheckReport) -> list[str]:
    """The hosts the probe found sick, in words (``node3: data link down (no peer reaches it
    on the training network)``); empty when everything answered."""
    out: list[str] = []
    hosts = list(report.hosts)
    # a host in (nearly) every failed pair is the one whose link is down, not its peers
    pairs: Counter[str] = Counter()
    for m in report.mesh_failures:
        pairs[m.src] += 1
        pairs[m.dst] += 1
    for host, n in pairs.most_common():
        if len(hosts) > 1 and n >= 2 * (len(hosts) - 1) - 1:
            out.append(f"{host}: data link down (no peer reaches it on the training network)")
    blamed = {line.split(":", 1)[0] for line in out}
    for host, check, why in report.failures:
        if check in _CAUSES and host not in blamed:
            out.append(f"{host}: {check}: {why}")
            blamed.add(host)
    if not out and report.mesh_failures:
        out += [f"training network: {m}" for m in report.mesh_failures[:3]]
    return out


def likely_causes(
    fleet: FanOut,
    spec: JobSpec,
    *,
    skip: Iterable[str] = (),
    limit: float = POST_MORTEM_LIMIT,
) -> list[str]:
    """Probe every host but those in ``skip`` (lost: known unreachable) once more, uncached,
    for at most ``limit`` seconds, and return the likely causes. Never raises and never makes
    the run wait longer: a post-mortem that fails or runs late says so instead of hiding the
    job's own failure (a probe still running is left to finish in the background)."""
    from fleetctl.phases.check.preflight import CheckOptions, check_fleet
    from fleetctl.ssh.fanout import FanOut

    skip = set(skip)
    nodes = [n for n in fleet.nodes if n.name not in skip]
    if not nodes:
        return []
    opts = CheckOptions.within(
        limit,
        rdzv_port=spec.rdzv_port,
        backend=spec.backend,
        tcp_timeout=min(TCP_TIMEOUT, limit / 2),
    )
    shared = {n.name for n in fleet.connected}
    settings = dataclasses.replace(
        fleet.settings, connect_timeout=min(fleet.settings.connect_timeout, limit)
    )
    sub = FanOut(nodes, settings, fanout=fleet.fanout)
    for node in nodes:
        if node.name not in shared:
            continue
        with contextlib.suppress(Exception):
            conn = fleet.connection(node)
            if conn.alive():
                sub.adopt(node, conn)
            else:  # a node that went away must be dialled afresh
                fleet.drop(node)
                shared.discard(node.name)
    box: dict[str, Any] = {}

    def probe() -> None:
        try:
            box["causes"] = culprits(check_fleet(sub, opts))
        except Exception as e:  # the job's own failure stays the story
            box["causes"] = [f"post-mortem probe failed: {type(e).__name__}: {e}"]

    t = threading.Thread(target=probe, daemon=True, name="post-mortem")
    t.start()
    t.join(limit)
    if t.is_alive():
        return [f"post-mortem probe: no answer from every host within {limit:g}s"]
    for node in sub.connected:  # connections it opened afresh serve the later phases
        if node.name not in shared:
            with contextlib.suppress(Exception):
                fleet.adopt(node, sub.connection(node))
    return list(box.get("causes", []))
