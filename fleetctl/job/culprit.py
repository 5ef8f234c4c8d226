"""After a failure: a quick fresh check of every host, to name the likely cause next to the
node that exited first.

When a data link is cut, the node blamed first is whichever rank noticed first (its collective
timed out), not the host whose link is down. A post-mortem probe — the same check as preflight,
uncached, with short timeouts — sees the fleet as it is now: a host that no peer can reach on
the training network, a host that stopped answering SSH, a full disk, a lost GPU.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.phases.check import CheckReport
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.ssh.fleet import Fleet

# cells a finished job's own processes cannot explain away (ports are the job's business)
_CAUSES = ("ssh", "ping", "python", "nic", "addr", "gpu", "disk")


def culprits(report: CheckReport) -> list[str]:
    """The hosts the probe found sick, in words (``node3: data link down (no peer reaches it
    on the training network)``); empty when everything answered."""
    out: list[str] = []
    hosts = list(report.hosts)
    # a host in (nearly) every failed pair is the one whose link is down, not its peers
    pairs = Counter()
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


def post_mortem(fleet: Fleet, spec: JobSpec, timeout: float = 10.0) -> list[str]:
    """Probe every host once more (uncached) and return the likely causes; never raises: a
    post-mortem that fails says so instead of hiding the job's own failure."""
    from fleetctl.phases.check import CheckOptions, check_fleet

    opts = CheckOptions(
        master_port=spec.master_port,
        check_master_port=False,  # the job's own port may linger in TIME_WAIT
        backend=spec.backend,
        probe_timeout=timeout,
        cache_ttl=0,
        recheck=True,
    )
    for node in fleet.connected:  # a node that went away must be dialled afresh
        with contextlib.suppress(Exception):
            if not fleet.connection(node).alive():
                fleet.drop(node)
    try:
        return culprits(check_fleet(fleet, opts))
    except Exception as e:  # the job's own failure stays the story
        return [f"post-mortem probe failed: {type(e).__name__}: {e}"]
