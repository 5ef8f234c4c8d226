"""After the watch: teardown (or verify nothing is left), the supervisors' last words, log
collection, job.json. Runs in ``run_job``'s ``finally``, on success, failure and Ctrl-C."""

from __future__ import annotations

import contextlib
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import RunFolderError
from fleetctl.job.monitor.supervisors import EXTERNAL_STOP_REASON
from fleetctl.job.records.result import JobPhase
from fleetctl.job.records.state import JobStatus, NodeState
from fleetctl.job.run.context import drain

if TYPE_CHECKING:
    from fleetctl.job.diagnose.proof import Ahead
    from fleetctl.job.run.context import JobContext
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Stream


def finish(job: JobContext, fleet: FanOut, interrupted: bool) -> None:
    """Teardown (verify), wait for the supervisors' last words, collect, write job.json."""
    watch, plan = job.watch, job.plan
    job.state.stopping = True
    if plan is None or watch is None:  # never launched: nothing runs anywhere
        if job.state.status.live:
            job.state.status = JobStatus.INTERRUPTED if interrupted else JobStatus.ERROR
            job.sync()
        job.close_spools(set(job.spools))
        job.result.ended = time.time()
        job.save()
        return
    if job.options.detach and job.result.status == JobStatus.RUNNING and not interrupted:
        job.launch_done.wait(35.0)
        drain(job)
        if all(n.state == NodeState.RUNNING for n in job.result.nodes):
            # Detached and running everywhere: the supervisors own the job now; `fleetctl
            # stop/collect JOB` end it and bring the logs home.
            watch.close()
            job.close_spools(set(job.spools))
            job.result.mark_phase("done: detached", time.time())
            job.save()
            job.emit("done", "detached", log=True)
            return
    ahead = _proof_ahead(job)  # the proof's programs import torch during the teardown
    try:
        hard = False
        try:
            try:
                _teardown(job, fleet, hard=False)
            except KeyboardInterrupt:
                hard = True
                job.emit("notice", "second Ctrl-C: killing without grace")
                _teardown(job, fleet, hard=True)
        except KeyboardInterrupt:
            job.result.errors.append("teardown interrupted a third time; not verified")
        # The supervisors report their job's end once it is stopped: record, then stop reading.
        try:
            watch.wait_ended(1.0 if hard else 5.0)
            drain(job)
        except KeyboardInterrupt:
            pass
        for rank in watch.running():
            node = job.result.nodes[rank]
            if node.state == NodeState.RUNNING:
                node.reason = "no exit report after teardown"
                node.state = job.state.end(rank, NodeState.LOST, time.time()).state
        # Supervisors that reported their exit wait on their channel to send the run folder.
        in_band = {r for r, ev in watch.ended.items() if ev.kind == "exit"}
        watch.close(keep=in_band)
        drain(job)
        for node in job.result.nodes:
            if node.state == NodeState.PENDING and node.rank not in watch.runs:
                node.state = job.state.end(node.rank, NodeState.START_FAILED, time.time()).state
        job.state.settle(interrupted=interrupted, external=EXTERNAL_STOP_REASON)
        job.sync()
        job.failure_line(now=True)  # the watch is over: a held first failure is settled
        if job.result.status == JobStatus.FAILED and job.result.first_failure is not None:
            _post_mortem(job, fleet)
        _proof(job, ahead)
        try:
            _collect(job, fleet, {watch.runs[r].node.name: watch.runs[r].stream for r in in_band})
        except KeyboardInterrupt as e:
            if not hasattr(e, "results"):  # CollectInterrupted recorded itself
                job.result.errors.append("log collection interrupted")
        finally:
            for r in in_band:  # collected or not, nothing more to say on these channels
                with contextlib.suppress(Exception):
                    watch.runs[r].stream.close()
            job.close_spools(set(job.spools))  # still open (collection failed): keep every copy
        job.result.ended = time.time()
        job.result.mark_phase(f"done: {job.result.status}", job.result.ended)
        job.save()
        job.emit("done", job.result.status, log=True)

    finally:
        if ahead is not None:
            ahead.close()


def _lost_hosts(job: JobContext) -> set[str]:
    return {n.host for n in job.result.nodes if n.state in (NodeState.LOST, NodeState.LEFT)}


def _teardown(job: JobContext, fleet: FanOut, *, hard: bool) -> None:
    from fleetctl.phases.teardown import containers_wait, teardown

    assert job.watch is not None and job.plan is not None
    job.watch.stop_nodes(hard=hard)  # instant: over the supervisors' own channels
    # Starts still in flight must finish (or fail) so that teardown sees every started job.
    job.launch_done.wait(35.0)
    job.watch.stop_nodes(hard=hard)
    drain(job)
    grace = 0.0 if hard else job.options.supervision.grace
    running = [n for n in job.result.nodes if n.state == NodeState.RUNNING]
    if running:
        job.emit(
            "teardown",
            f"stopping the job on {len(job.result.nodes)} node(s)"
            + (f" (grace {grace:g}s)" if grace else " (no grace)"),
        )
        # The supervisors got the stop over their channels: each reports its job's end with
        # its own scan for leftovers. Wait for those (bounded); only the nodes that do not
        # answer in time get a remote stop command. --image: after its container's end,
        # bounded on the node (a hung runtime is cut and said in the report).
        job.watch.wait_ended(grace + 3.0 + containers_wait(job.plan, grace))
        drain(job)
    reported = {
        n.host: n.leftovers
        for n in job.result.nodes
        if n.leftovers is not None and n.state not in (NodeState.RUNNING, NodeState.LOST)
    }
    report = teardown(
        fleet,
        job.plan,
        grace=grace,
        pythons=job.pythons,
        lost=_lost_hosts(job),
        reported=reported,
    )
    job.result.teardown = report
    for stop in report.nodes:
        if stop.skipped:
            job.emit("warning", stop.skipped, rank=stop.rank)
        elif stop.error:
            job.result.errors.append(f"{stop.host}: teardown: {stop.error}")
            job.emit("warning", f"teardown could not verify: {stop.error}", rank=stop.rank)
        elif stop.remaining:
            pids = ", ".join(f"{p['pid']} ({p['cmd'][:60]})" for p in stop.remaining)
            job.result.errors.append(f"{stop.host}: processes left after SIGKILL: {pids}")
            job.emit(
                "warning",
                f"processes of the job still running after SIGKILL: {pids}",
                rank=stop.rank,
            )
    if report.verified:
        job.emit(
            "teardown",
            f"verified: no process of job {job.plan.job_id} left on any node "
            f"({report.seconds:.1f}s)",
        )


def _collect(job: JobContext, fleet: FanOut, streams: dict[str, Stream] | None = None) -> None:
    from fleetctl.phases.collect import (
        CollectInterrupted,
        check_console,
        collect,
        not_collected_line,
    )

    assert job.plan is not None and job.watch is not None
    lost = _lost_hosts(job)
    job.emit("phase", f"collecting logs into {job.folder.path}", phase=JobPhase.COLLECT)
    cut: CollectInterrupted | None = None
    try:
        results = collect(
            fleet,
            job.plan,
            job.folder.path,
            pythons=job.pythons,
            skip=lost,
            streams=streams,
            options=job.options.collect,
        )
    except CollectInterrupted as e:  # Ctrl-C: record what is (not) home, then say so
        cut, results = e, e.results
        job.result.errors.append(
            "log collection interrupted: partial copies are kept for "
            f"`fleetctl collect {job.plan.job_id}` to resume"
        )
    runs = job.watch.runs
    for c in results:  # a node whose job started must bring its console.log home whole
        if job.result.nodes[c.rank].start_time is not None:
            check_console(c, runs[c.rank].lines if c.rank in runs else None)
    job.result.collected = results
    for c in results:
        node = job.result.nodes[c.rank]
        node.folder = c.folder
        node.collected = c.error is None and c.skipped is None
        if c.error:
            job.emit("warning", f"logs not collected: {c.error}", rank=c.rank)
        elif c.not_collected:
            job.emit("warning", not_collected_line(c), rank=c.rank)
        if c.refused:
            job.emit(
                "warning",
                f"refused unsafe names in the node's log archive: {', '.join(c.refused[:5])}",
                rank=c.rank,
            )
    # What streamed is kept where the node's own console.log is not whole: not (all) collected,
    # or the node could not write it (disk full).
    job.close_spools({c.rank for c in results if c.incomplete or job.result.nodes[c.rank].problem})
    _rank_map(job)
    _redact(job)
    if cut is not None:
        raise cut


def _blame_first_rank(job: JobContext) -> None:
    """The node whose rank failed first is the first failure, even when a peer's launcher ended
    first: launchers look at their ranks every 0.1-1 s, and under load the culprit's may end
    after its victim's, or after our stop reached it. The node supervisors' clocks decide."""
    from fleetctl.job.diagnose.ranks import rank_exits

    first = job.result.failed_ranks[0] if job.result.failed_ranks else None
    before = job.result.failed_node
    if first is None or before is None:
        return
    at = min((t for t, r, _c, _h in rank_exits(job.result) if r == first["rank"]), default=None)
    if not job.state.blame(int(first["node_rank"]), at):
        if before.state == NodeState.LOST and int(first["node_rank"]) != before.rank:
            job.result.failed_ranks = None  # a victim of the lost node, not its rank
        return
    job.sync()
    node = job.result.nodes[int(first["node_rank"])]
    code = first.get("exit_code")
    if node.signal == signal.SIGTERM and isinstance(code, int) and code:
        # its launcher ended by our stop: how the node failed is how its rank ended
        node.exit_code, node.signal = (code, None) if code > 0 else (None, -code)
    node.state = job.state.states[node.rank]
    if before.state == NodeState.LOST:
        why = f"node {before.rank} ({before.host}) was last heard from"
    else:
        why = f"any rank of node {before.rank} ({before.host}), whose launcher ended first"
    job.emit(
        "notice",
        f"rank {first['rank']} on node {node.rank} ({node.host}) failed before {why}: "
        f"node {node.rank} is the first failure",
    )
    job.failure_line(now=True)  # the live line names who the summary does


def _post_mortem(job: JobContext, fleet: FanOut) -> None:
    """Which host is sick now: a lost node or a cut link is rarely the rank that failed first."""
    from fleetctl.job.diagnose.culprit import likely_causes

    say = "checking every host after the failure (post-mortem)"
    job.emit("phase", say, phase=JobPhase.POST_MORTEM)
    limit = job.options.supervision.post_mortem_timeout  # the proof's, the same promise
    found = likely_causes(fleet, job.spec, skip=_lost_hosts(job), limit=limit)
    job.result.culprits = [*(job.result.culprits or []), *found]  # a slow node named first
    for line in found:
        job.emit("notice", f"likely cause: {line}")


def _proof_ahead(job: JobContext) -> Ahead | None:
    job.sync()
    if job.result.status != JobStatus.FAILED:  # proof.wanted's first answer, without its import
        return None  # (the proof, the bisection, the collective judge: ~0.03 s of CPU per run)
    from fleetctl.job.diagnose.proof import start

    try:
        return start(job)
    except Exception as e:  # never the run's outcome
        job.result.errors.append(f"post-mortem proof: {type(e).__name__}: {e}")
        return None


def _proof(job: JobContext, ahead: Ahead | None) -> None:
    """After a stall, a lost node or a collective timeout: a collective among the reachable
    hosts proves the culprit (``fleetctl.job.diagnose.proof``); bounded, and never the run's
    outcome."""
    if ahead is None:  # no proof wanted: its module stays unimported
        return
    from fleetctl.job.diagnose.proof import record

    try:
        record(job, ahead)
    except (Exception, KeyboardInterrupt) as e:
        job.result.errors.append(f"post-mortem proof: {type(e).__name__}: {e}")


def _redact(job: JobContext) -> None:
    """A launcher's environment dumps (paddle's) must not carry --env-var / fleetctl_env
    values home."""
    from fleetctl.plan.launchers import launcher_for

    plan = job.plan
    dumps = launcher_for(plan.launcher).env_dumps if plan is not None else ()
    if plan is None or not dumps:
        return
    keys = set(plan.user_env)
    for n in job.nodes:
        keys |= set(n.env)
    if not keys:
        return
    for node in job.result.nodes:
        if node.folder:
            try:
                job.folder.redact_env_dumps(Path(node.folder).name, keys, dumps)
            except OSError as e:
                job.result.errors.append(f"{node.host}: env dumps not redacted: {e}")


def _rank_map(job: JobContext) -> None:
    """ranks.json, and the ranks the failing node's launcher named (the summary shows them)."""
    from fleetctl.job.diagnose.ranks import failed_ranks, rank_map

    try:
        ranks = rank_map(job.result)
        if ranks:
            job.folder.write_ranks(ranks)
        job.result.failed_ranks = failed_ranks(job.result, ranks) or None
        _blame_first_rank(job)
    except (OSError, RunFolderError) as e:  # a map we cannot write is a note, not a loss
        job.result.errors.append(f"ranks.json: {e}")
