"""The job's rendezvous port, claimed on node 0 before launch.

Two runs planned at the same instant on the same hosts both saw port 29500 free in their
checks; one job's rank 0 then failed to bind it and that job's other ranks joined the other
job's rendezvous. So the port is not just probed but claimed for this job id on node 0
(``remote/port_probe.py``: an O_EXCL file per port in a host-local folder) before any node
starts; node 0's supervisor adopts the claim and frees it when the job ends. Without
``--master-port`` the first claimable port from 29500 on is taken (recorded in plan.json); with
it, a port another fleetctl job holds is refused, naming that job.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fleetctl import remote
from fleetctl.errors import LaunchError
from fleetctl.phases.frames import last_data

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.ssh.fleet import Fleet

PORT_SPAN = 64  # ports tried from the default when none was given
CLAIM_TIMEOUT = 20.0


def reserve_master_port(fleet: Fleet, node0: Node, spec: JobSpec) -> int:
    """Claim the rendezvous port on ``node0`` for ``spec.job_id``; the port, or LaunchError."""
    base = spec.master_port
    cands = [base] if spec.master_port_fixed else list(range(base, min(base + PORT_SPAN, 65536)))
    arg = json.dumps({"candidates": cands, "need": 1, "claim": {"job": spec.job_id}})
    conn = fleet.connection(node0)
    source = remote.source("port_probe.py").decode("utf-8")
    res = conn.run([conn.expand(node0.python), "-c", source, arg], timeout=CLAIM_TIMEOUT)
    try:
        data = last_data(res.stdout)
        free, busy = [int(p) for p in data["free"]], dict(data.get("busy") or {})
    except (ValueError, KeyError, TypeError) as e:
        tail = " ".join((res.stderr or res.stdout).split())[-200:]
        raise LaunchError(
            f"{node0.label}: could not claim the rendezvous port (exit {res.exit_code}): {tail}"
        ) from e
    if free:
        return free[0]
    if spec.master_port_fixed:
        why = busy.get(str(base), "not free")
        raise LaunchError(f"{node0.label}: master port {base} is {why}; pick another --master-port")
    raise LaunchError(
        f"{node0.label}: no free rendezvous port in {base}-{cands[-1]} "
        f"({len(busy)} in use or held by other fleetctl jobs)"
    )
