"""``--nodes N``: run on N healthy hosts of the selection, the rest are spares.

Before each attempt the hosts not yet ruled out are checked (uncached after a failure); hosts
that fail the check — or that the mesh shows cut off the training network — are left out with
the reason, and the first N healthy ones in inventory order run the attempt with a fresh rank
plan. After a node fault (lost, could not start, or named by the post-mortem) that host is
ruled out for the rest of the job and the next spare takes its place.

The health ledger (fleetctl.health.ledger) is honoured: a host it pins (sick twice) is left
out; a host it holds sick is checked last and used only when the healthy ones are too few.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fleetctl.errors import CheckError
from fleetctl.job.records.state import NodeState

if TYPE_CHECKING:
    from fleetctl.health.ledger import HostStatus
    from fleetctl.job.records.result import JobResult
    from fleetctl.job.run.job import RunOptions
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.ssh.fanout import FanOut


def choose_nodes(
    pool: Sequence[Node],
    n: int,
    ruled_out: Mapping[str, str],
    spec: JobSpec,
    options: RunOptions,
) -> tuple[list[Node], dict[str, str]]:
    """The first ``n`` healthy hosts of ``pool`` not ``ruled_out``, and every host left out
    with why (ruled-out ones included). CheckError when fewer than ``n`` are usable."""
    from fleetctl.job.diagnose.culprit import culprits
    from fleetctl.job.run.prepare import host_checks
    from fleetctl.phases.check.preflight import check_fleet
    from fleetctl.results import FleetResult
    from fleetctl.ssh.fanout import FanOut

    left_out = dict(ruled_out)
    held = _ledger()
    for name, st in held.items():
        if st.pinned and name in {x.name for x in pool}:
            left_out.setdefault(name, f"health ledger: {st.why()}")
    candidates = [x for x in pool if x.name not in left_out]
    # the healthy first, in inventory order: the ledger's sick hosts are the last resort
    candidates.sort(key=lambda x: x.name in held)
    report = None
    if len(candidates) >= n:
        with FanOut(candidates, options.settings) as fleet:
            report = check_fleet(fleet, host_checks(spec, options))
        names = {x.name for x in candidates}
        for line in culprits(report):
            host, _, why = line.partition(": ")
            if host in names and host not in left_out:
                left_out[host] = why
        for host, check, why in report.failures:
            left_out.setdefault(host, f"{check}: {why}")
    healthy = [x for x in candidates if x.name not in left_out]
    if len(healthy) < n:
        why = "; ".join(f"{h}: {w}" for h, w in left_out.items()) or "none"
        raise CheckError(
            f"--nodes {n}: only {len(healthy)} of {len(pool)} host(s) usable (left out: {why})",
            FleetResult(dict(report.hosts) if report is not None else {}),
        )
    for x in healthy[n:]:
        if x.name in held:
            left_out[x.name] = f"health ledger: {held[x.name].why()}"
    return healthy[:n], left_out


def _ledger() -> dict[str, HostStatus]:
    """The ledger's hosts that are out now; none when it cannot be read (the check says)."""
    from fleetctl.errors import HealthLedgerError
    from fleetctl.health.ledger import Ledger

    try:
        return Ledger().status()
    except HealthLedgerError:
        return {}


def faulty_hosts(result: JobResult) -> dict[str, str]:
    """Hosts an attempt showed unfit: lost, could not start, or named by the post-mortem."""
    out: dict[str, str] = {}
    for node in result.nodes:
        if node.state in (NodeState.LOST, NodeState.START_FAILED):
            out[node.host] = (
                f"{node.state} in attempt {result.attempt}: {node.reason or ''}".strip()
            )
    hosts = {node.host for node in result.nodes}
    for line in result.culprits or []:
        host, _, why = line.partition(": ")
        if host in hosts:
            out.setdefault(host, why)
    for host, why in result.proven().items():
        if host in hosts:
            out.setdefault(host, why)
    return out


def remember_proven(result: JobResult) -> None:
    """The hosts the post-mortem's proof named, into the health ledger (a run without
    retries or spares: ``run_attempts`` records them with every other faulty host)."""
    named = result.proven()
    if named:
        remember_faulty(result, {h: w for h, w in faulty_hosts(result).items() if h in named})


def remember_faulty(result: JobResult, faulty: Mapping[str, str]) -> None:
    """Record each host an attempt showed unfit in the health ledger (``lost``: lost or could
    not start; ``failure``: named by the post-mortem), so later runs leave it out too."""
    from fleetctl.errors import HealthLedgerError
    from fleetctl.health.ledger import Ledger

    lost = {n.host for n in result.nodes if n.state in (NodeState.LOST, NodeState.START_FAILED)}
    named = result.proven()
    proof = "\n".join(result.proof_lines())
    ledger = Ledger()
    for host, why in faulty.items():
        source = "lost" if host in lost else "collective" if host in named else "failure"
        evidence = f"{why}\npost-mortem proof:\n{proof}" if host in named and proof else why
        with contextlib.suppress(HealthLedgerError):  # the run's outcome matters more
            ledger.record(
                host,
                source=source,
                reason=why.split(":")[0],
                evidence=evidence,
                job_id=result.job_id,
            )


def check_spare(fleet: FanOut, spec: JobSpec, options: RunOptions) -> str | None:
    """A spare about to take a lost node's place (run --elastic), checked afresh on ``fleet``
    (it alone): the run's probe (reachable, its python, disk, GPUs and their health as the
    plan needs), with no cache (it was checked before the job, maybe hours ago), no mesh (its
    peers are training), no master port (node 0 keeps that) and no import of the launcher or
    the job's module (``import torch``: 10-15 s on a loaded lab host, 1 s without; the spare's
    agent imports it next, and one that cannot fails its start as before). None when it
    passes, else why in one line: a dead spare is skipped, not left to hang the rendezvous."""
    import dataclasses

    from fleetctl.job.run.prepare import check_options
    from fleetctl.phases.check import image as cc
    from fleetctl.phases.check.preflight import check_fleet

    in_image = [x.name for x in fleet.nodes if cc.image_of(x, spec.container.image)]
    opts = dataclasses.replace(
        check_options(spec, options, in_image),
        recheck=True,
        mesh=False,
        check_rdzv_port=False,
        collective=None,
        hold=0.0,
        launcher_module=None,
        script_module=None,
        torch_version=False,
    )
    report = check_fleet(fleet, opts)
    if report.ok:
        return None
    return "; ".join(f"{check}: {why}" for _, check, why in report.failures) or report.summary()
