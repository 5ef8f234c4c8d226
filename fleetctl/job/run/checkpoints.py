"""A retry's checkpoints: the attempt loop names the node of rank 0 of the last attempt that
ran (:func:`relay_source`); before launch, after push and plan, :func:`relay_before_launch`
copies what the job wrote into its work folder there to every node of this attempt
(``fleetctl.phases.push.relay``). What happened is kept on the :class:`CheckpointRelay` for
attempts.json and said as a notice. ``run --resume JOB`` makes the first attempt's relay from
an earlier job's folder (``fleetctl.job.run.resume``): then every node gets a copy, the source's
too (its new work folder is another), and job.json's ``resumed_from`` says what came."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetctl.errors import NodePushError, PushError
from fleetctl.job.records.result import JobPhase
from fleetctl.phases.push.relay import (
    CHECKPOINT_MAX,
    RelayReport,
    RelaySource,
    RelayTarget,
    relay_checkpoints,
)
from fleetctl.results import FleetResult

if TYPE_CHECKING:
    from fleetctl.job.records.result import JobResult
    from fleetctl.job.run.context import JobContext
    from fleetctl.node import Node
    from fleetctl.ssh.fanout import FanOut


@dataclass
class CheckpointRelay:
    """One attempt's relay: where from, which folder, and (once done) what happened."""

    source: RelaySource
    dir: str | None = None  # --checkpoint-dir (None: the job's work folder)
    max_bytes: int = CHECKPOINT_MAX
    report: RelayReport | None = None
    resume: str | None = None  # run --resume: the earlier job (None: this job's last attempt)
    since: float | None = None  # run --resume: that job's start (its code snapshot may be gone)


def relay_source(pool: Sequence[Node], results: Sequence[JobResult]) -> RelaySource | None:
    """The node of rank 0 of the last attempt that got as far as a plan, and its folders."""
    for r in reversed(results):
        if r.plan is None or not r.plan.nodes:
            continue
        np = r.plan.nodes[0]
        node = next((n for n in pool if n.name == np.host), None)
        if node is None:
            return None
        work = getattr(np, "work_dir", "") or np.cwd  # cwd may be the script's folder in it
        return RelaySource(node, work, np.code_dir, np.train_addr or None, r.attempt, np.cwd)
    return None


def relay_before_launch(job: JobContext, fleet: FanOut, shared: Sequence[Sequence[str]]) -> None:
    """Copy the last attempt's checkpoints into this attempt's work folders (see module doc).
    Raises ``PushError`` when a node could not take them."""
    relay = job.options.relay
    plan = job.plan
    if relay is None or plan is None:
        return
    src = relay.source
    of = f"job {relay.resume}" if relay.resume else f"attempt {src.attempt}"
    job.emit(
        "phase", f"relaying checkpoints from {src.node.name} (rank 0 of {of})", phase=JobPhase.RELAY
    )
    by_name = {n.name: n for n in job.nodes}
    targets = [
        RelayTarget(by_name[np.host], getattr(np, "work_dir", "") or np.cwd, np.code_dir, np.cwd)
        for np in plan.nodes
    ]
    report = relay.report = RelayReport(src.node.name, src.attempt, relay.dir, job=relay.resume)
    try:
        relay_checkpoints(
            fleet,
            src,
            targets,
            folder=relay.dir,
            shared_groups=shared,
            policy=job.options.push,
            max_bytes=relay.max_bytes,
            report=report,
            same_folder=relay.resume is None,
            since=relay.since,
        )
    finally:
        if relay.resume is not None:  # job.json: what this job continues
            job.result.resumed_from = report.to_dict()
            job.save()
    if relay.resume is not None and report.skipped:  # asked for: never a silent fresh start
        why = NodePushError(src.node.name, report.skipped, stage="relay")
        raise PushError(
            f"--resume {relay.resume}: {report.summary()}", FleetResult({src.node.name: why})
        )
    job.emit("warning" if report.skipped or report.secrets else "notice", report.summary())
