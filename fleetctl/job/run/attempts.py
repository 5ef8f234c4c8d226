"""The attempt loop behind ``--max-retries``: run the job again after a retryable failure.

Attempt 1 is the job itself (``fleet-runs/<job>/``, job id ``<job>``); attempt k >= 2 runs as
job id ``<job>.<k>`` in ``fleet-runs/<job>.<k>/`` — its own node run folders, its own
``FLEET_JOB_ID``, so a straggler of one attempt can never be mistaken for the next one.
``fleet-runs/<job>/attempts.json`` lists every attempt, how it ended and why it was (not)
retried; ``fleetctl runs`` folds attempts into their job. Which failures are retried, and the
backoff, is ``fleetctl.job.run.retry`` (pure).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError
from fleetctl.job.records.attempts import Attempt, AttemptsRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.job.records.state import JobStatus

if TYPE_CHECKING:
    from fleetctl.job.records.result import JobEvent, JobResult
    from fleetctl.job.run.job import RunOptions
    from fleetctl.job.run.retry import Decision, RetryPolicy
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.ssh.fanout import FanOut


def read_attempts(folder: Path) -> list[Attempt]:
    """Every attempt of the job whose first run folder is ``folder`` (its attempts.json), in
    order; RunFolderError (one line, naming the file and the key) when the file is missing,
    unreadable or malformed."""
    return list(RunFolder(folder).read_record(AttemptsRecord).attempts)


@dataclass
class AttemptsResult:
    results: list[JobResult] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def final(self) -> JobResult:
        return self.results[-1]


def attempt_job_id(base: str, attempt: int) -> str:
    return base if attempt == 1 else f"{base}.{attempt}"


def run_attempts(
    spec: JobSpec,
    nodes: Sequence[Node],
    options: RunOptions,
    policy: RetryPolicy,
    *,
    on_event: Callable[[JobEvent], None] | None = None,
    on_result: Callable[[JobResult], None] | None = None,
    fleet: FanOut | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> AttemptsResult:
    """``run_job`` up to ``policy.tries`` times, retrying only classified failures.

    ``on_result`` sees every attempt's result (the CLI prints its summary). Errors before a
    launch (check, push, plan) propagate as usual; Ctrl-C is never retried.
    """
    from fleetctl.job.records.result import JobEvent
    from fleetctl.job.run.job import run_job
    from fleetctl.job.run.retry import Failure
    from fleetctl.ssh.fanout import FanOut

    emit = on_event or (lambda e: None)
    rng = rng or random.Random()
    own = fleet is None
    fleet = fleet or FanOut(nodes, options.settings)
    out = AttemptsResult()
    base = spec.job_id
    base_folder = Path(options.runs_dir) / base
    want = options.hosts.nodes
    spares = want is not None and want < len(nodes)
    ruled_out: dict[str, str] = {}  # --nodes N: hosts no attempt may use again, and why
    chosen, left_out = list(nodes), None
    try:
        for k in range(1, policy.tries + 1):
            aspec = dataclasses.replace(spec, job_id=attempt_job_id(base, k), work_id=base)
            # After a failure nothing the last attempt learnt is trusted: fresh check verdicts.
            aopts = dataclasses.replace(options, attempt=k, recheck=options.recheck or k > 1)
            if k > 1:
                emit(JobEvent("phase", f"attempt {k} of {policy.tries}: job {aspec.job_id}"))
                dropped = _reconnect(fleet, out.results[-1])
                for name in dropped:
                    emit(JobEvent("notice", f"{name}: reconnecting (new SSH connection)"))
                if not spares:  # with spares a lost host is ruled out: nothing to wait for
                    lost = [x for x in nodes if x.name in dropped]
                    _await_lost(fleet, lost, options.retry.reboot_timeout, emit)
                aopts = _with_relay(aopts, nodes, out.results)
            try:
                if spares:
                    assert want is not None
                    chosen, left_out = _choose(nodes, want, ruled_out, aspec, aopts, emit)
                    aopts = dataclasses.replace(aopts, left_out=dict(left_out))
                    if options.elastic:  # the hosts a lost node's place may go to, in order
                        free = [x for x in nodes if x not in chosen and x.name not in left_out]
                        aopts = dataclasses.replace(aopts, spares=tuple(free))
                    with FanOut(chosen, options.settings) as afleet:
                        result = run_job(aspec, chosen, aopts, on_event=on_event, fleet=afleet)
                else:
                    result = run_job(aspec, nodes, aopts, on_event=on_event, fleet=fleet)
            except FleetctlError as e:  # before launch (check, push, plan): recorded, then raised
                folder = Path(options.runs_dir) / aspec.job_id
                att = Attempt(
                    attempt=k,
                    job_id=aspec.job_id,
                    folder=str(folder),
                    status=JobStatus.ERROR,
                    ended_by=e.one_line(),
                )
                att.checkpoints = _relayed(aopts)
                if spares:
                    att.left_out = left_out
                if k > 1 and k < policy.tries:  # a node still coming back: try again
                    att.decision, att.retried = "retry: preflight failed after a node fault", True
                    att.backoff = policy.delay(k, rng.random())
                    out.attempts.append(att)
                    _write_attempts(base_folder, out.attempts)
                    emit(
                        JobEvent(
                            "notice",
                            f"attempt {k} could not start ({e.one_line()}); "
                            f"next attempt in {att.backoff:.1f}s",
                        )
                    )
                    sleep(att.backoff)
                    continue
                att.decision = "not retried: " + (
                    "the job could not start" if k == 1 else "retries used up"
                )
                out.attempts.append(att)
                _write_attempts(base_folder, out.attempts)
                raise
            out.results.append(result)
            if on_result is not None:
                on_result(result)
            ff = result.failed_node
            att = Attempt(
                attempt=k,
                job_id=aspec.job_id,
                folder=str(result.folder),
                status=result.status,
                ended_by=None if ff is None else f"node {ff.rank} ({ff.host}): {ff.how()}",
                decision=None,
                checkpoints=_relayed(aopts),
                membership=result.membership,
            )
            from fleetctl.job.run.spares import faulty_hosts, remember_faulty

            faulty = faulty_hosts(result)
            remember_faulty(result, faulty)
            if spares:
                att.nodes, att.left_out = [x.name for x in chosen], left_out
                ruled_out.update(faulty)
            out.attempts.append(att)
            decision: Decision | None = None
            if result.status == JobStatus.FAILED and ff is not None:
                failure = Failure.from_node(ff, result.log_tail(ff.rank, 50))
                decision = policy.decide(failure, k)
            elif result.status == JobStatus.INTERRUPTED:
                decision = policy.decide(Failure("interrupted"), k)
            if decision is not None:
                att.decision = ("retry: " if decision.retry else "not retried: ") + decision.reason
                att.retried = decision.retry
                if decision.retry:
                    att.backoff = policy.delay(k, rng.random())
            _write_attempts(base_folder, out.attempts)
            if decision is None or not decision.retry:
                if decision is not None and policy.tries > 1:
                    emit(JobEvent("notice", f"attempt {k} {result.status}; {att.decision}"))
                break
            emit(
                JobEvent(
                    "notice",
                    f"attempt {k} failed ({att.ended_by}); {att.decision}; "
                    f"next attempt in {att.backoff:.1f}s",
                )
            )
            sleep(att.backoff or 0.0)
    finally:
        if own:
            fleet.close()
    if out.results:
        out.final.attempts = [a.to_dict() for a in out.attempts]
    return out


def _choose(
    pool: Sequence[Node],
    want: int,
    ruled_out: dict[str, str],
    spec: JobSpec,
    options: RunOptions,
    emit: Callable[[JobEvent], None],
) -> tuple[list[Node], dict[str, str]]:
    from fleetctl.job.records.result import JobEvent
    from fleetctl.job.run.spares import choose_nodes

    emit(JobEvent("phase", f"choosing {want} of {len(pool)} host(s) (--nodes)"))
    chosen, left_out = choose_nodes(pool, want, ruled_out, spec, options)
    for host, why in left_out.items():
        emit(JobEvent("notice", f"{host}: left out: {why}"))
    spare = [x.name for x in pool if x not in chosen and x.name not in left_out]
    names = ", ".join(x.name for x in chosen)
    emit(
        JobEvent(
            "notice", f"running on {names}" + (f"; spares: {', '.join(spare)}" if spare else "")
        )
    )
    return chosen, left_out


def _with_relay(
    options: RunOptions, pool: Sequence[Node], results: Sequence[JobResult]
) -> RunOptions:
    """A retry's options with the relay of the last attempt's checkpoints (rank 0's work
    folder, or ``--checkpoint-dir``) to every node before launch."""
    from fleetctl.job.run.checkpoints import CheckpointRelay, relay_source

    source = relay_source(pool, results)
    if source is None:
        return options
    relay = CheckpointRelay(source, dir=options.retry.checkpoint_folder())
    return dataclasses.replace(options, relay=relay)


def _relayed(options: RunOptions) -> dict[str, Any] | None:
    relay = options.relay
    return relay.report.to_dict() if relay is not None and relay.report is not None else None


def _reconnect(fleet: FanOut, last: JobResult | None) -> list[str]:
    """Drop the connections a retry must not reuse: nodes the last attempt lost or could not
    start on, and any whose transport died (a rebooted node). Returns their names."""
    from fleetctl.job.records.state import NodeState

    bad = {
        n.host
        for n in (last.nodes if last is not None else [])
        if n.state in (NodeState.LOST, NodeState.LEFT, NodeState.START_FAILED)
    }
    for node in fleet.connected:
        if not fleet.connection(node).alive():
            bad.add(node.name)
    for name in sorted(bad):
        fleet.drop(name)
    return sorted(bad)


def _await_lost(
    fleet: FanOut, lost: Sequence[Node], timeout: float, emit: Callable[[JobEvent], None]
) -> None:
    """Wait (``--reboot-timeout``) for the dropped hosts to answer SSH again, each new
    connection becoming the fleet's: a rebooting host is not spent as a failed retry."""
    if not lost or timeout <= 0:
        return
    from fleetctl.job.records.result import JobEvent
    from fleetctl.job.run.comeback import await_hosts
    from fleetctl.transport.connection import connect

    settings = fleet.settings

    def dial(node: Node, seconds: float) -> None:
        conn = connect(node, dataclasses.replace(settings, connect_timeout=seconds))
        try:  # a host still booting answers the handshake long before it runs a command
            conn.run(["true"], timeout=seconds, check=True)
        except BaseException:
            conn.close()
            raise
        conn.use_settings(settings)  # from here on it is the node's connection, as dialled
        fleet.adopt(node, conn)

    await_hosts(lost, timeout, dial, say=lambda m: emit(JobEvent("notice", m)))


def _write_attempts(folder: Path, attempts: Sequence[Attempt]) -> None:
    with contextlib.suppress(OSError):
        RunFolder(folder).write_record(AttemptsRecord(attempts=list(attempts)))
