"""A stand-in for the one job a post-mortem proof reads (``fleetctl.job.diagnose.proof``): a lab
fleet's hosts with their data addresses and NICs as the training ones, for the bench and the lab
test that time and run the proof on its own, without a job around it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.lab import Lab


def lab_proof_job(lab: Lab, limit: float) -> Any:
    """What ``Ahead`` and ``prove`` read of a job on ``lab``: its plan's hosts (training on
    the data network), its nodes, the proof's limit, no culprit named yet."""
    from fleetctl.plan.inventory import load_inventory
    from fleetctl.transport.connection import SSHSettings

    nodes = load_inventory(lab.inventory_path).nodes
    by = {h.name: h for h in lab.hosts}
    plan = SimpleNamespace(
        nodes=[
            SimpleNamespace(
                host=x.name,
                train_addr=by[x.name].data_addr,
                nic=by[x.name].data_nic,
                python=x.python,
                container=None,
            )
            for x in nodes
        ]
    )
    return SimpleNamespace(
        plan=plan,
        nodes=list(nodes),
        options=SimpleNamespace(
            supervision=SimpleNamespace(post_mortem_timeout=limit),
            settings=SSHSettings(connect_timeout=10),
        ),
        result=SimpleNamespace(culprits=None),
    )
