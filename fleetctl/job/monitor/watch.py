"""The job monitor: a controller-side watcher that gives detached jobs first-failure teardown.

``fleetctl run --detach`` leaves the job to the node supervisors (no dead-man switch: the job
must outlive the terminal). Without a watcher a rank that dies leaves its peers hung in
collectives for hours. ``fleetctl run --detach`` therefore starts ``fleetctl monitor JOB`` as
its own process (own session, output in ``<run folder>/monitor.log``), which polls every node's
supervisor (one ``status`` command per node per poll over kept SSH connections) and:

* the first node that ends badly (non-zero exit, signal, supervisor gone, no record of the job)
  → the rest is stopped with the same teardown + verification as an attached run, every node's
  logs are collected, and job.json says **failed** with ``first_failure`` naming that node;
* a node unreachable for longer than its ``--lost-timeout`` → the same, the node counts as lost;
  shorter blips are written to events.log and tolerated;
* every node succeeded → teardown verifies nothing is left, logs are collected, job.json
  says **succeeded**;
* a lost node has no dead-man switch in a detached job: after the verdict the monitor keeps
  trying to reach it (``chase_lost`` seconds, default 30 min) and stops the job there, and
  brings its logs home, once it answers again;
* job.json no longer live (``fleetctl stop``/``collect`` from another terminal), or a node's
  supervisor stopped the job for ``fleetctl stop`` → the monitor leaves quietly.

Killed or SIGTERMed while watching, the monitor just exits (recorded in events.log) and leaves
the job running: it is detached by design; ``fleetctl monitor JOB`` attaches a new one.
Its identity is ``job.json``'s ``monitor`` entry: pid *and* /proc start time (and boot id,
host), so no other process is ever taken for it or signalled in its name.

The decision itself (:func:`decide`) is pure: node states in, verdict and event lines out.
Library code: raises ``FleetctlError`` subclasses, never prints.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError, RunFolderError, UsageError
from fleetctl.job.monitor.decide import (
    DEFAULT_LOST_TIMEOUT,
    DEFAULT_POLL,
    MONITOR_REASON,
    Decision,
    WatchState,
    decide,
    limit_reached,
)
from fleetctl.job.monitor.handle import JobHandle
from fleetctl.job.monitor.process import monitor_alive
from fleetctl.job.records.controller import identity
from fleetctl.job.records.runfolder import iso

if TYPE_CHECKING:
    from fleetctl.api.runspec import Observe, Supervision
    from fleetctl.job.monitor.exposition import MetricsEndpoint
    from fleetctl.job.monitor.hooks import Hooks
    from fleetctl.job.monitor.metrics import JobMetrics
    from fleetctl.job.monitor.supervisors import NodeReport
    from fleetctl.job.records.jobrecord import JobRecord
    from fleetctl.job.records.report import ReportWriter
    from fleetctl.plan.roles import CompletionPolicy
    from fleetctl.transport.connection import SSHSettings

# job.json's monitor entry: the key of the monitor's --lost-timeout (the run's limits and
# grace under their RunSpec keywords: Supervision.monitored)
LOST_KEY = "lost_timeout"
DEFAULT_CHASE_LOST = 1800.0  # s to keep trying to stop the job on a lost node
# A detached job has no dead-man switch: say who stops it on a node that cannot be reached.
LOST_NOTE = "lost: cannot be reached; the monitor keeps trying to stop the job there"

# --------------------------------------------------------------------------- the watcher


@dataclass
class MonitorResult:
    """How a monitor run ended. ``outcome``: failed / succeeded (it ended the job), gone (the
    job ended elsewhere), interrupted (signalled: job left running), deadline."""

    job_id: str
    outcome: str
    decision: Decision | None = None
    verified: bool | None = None  # teardown verified every node (when it tore down)
    final: bool = False  # this monitor wrote the job's final record


def _policy(job: JobRecord) -> CompletionPolicy | None:
    """The role job's completion policy as ``fleetctl run`` recorded it (None: plain job)."""
    data = job.completion
    if not isinstance(data, dict) or not data.get("roles"):
        return None
    from fleetctl.plan.roles import CompletionPolicy

    return CompletionPolicy(
        roles=tuple(str(r) for r in data["roles"]),
        min_failed=dict(data.get("min_failed") or {}),
        min_succeeded=dict(data.get("min_succeeded") or {}),
    )


def completion_record(policy: Any) -> dict[str, Any] | None:
    """A CompletionPolicy as job.json's ``completion`` (read back by the monitor)."""
    if policy is None:
        return None
    return {
        "roles": list(policy.roles),
        "min_failed": dict(policy.min_failed),
        "min_succeeded": dict(policy.min_succeeded),
    }


def _register(h: JobHandle, info: dict[str, Any]) -> None:
    """Record this process as the job's monitor, unless a live one is there (check and set
    under the folder lock, so two monitors never both watch)."""
    with h.folder.locked():
        job = h.folder.load_job()
        old = job.monitor
        if old is not None and monitor_alive(old) and old.get("pid") != info["pid"]:
            raise UsageError(
                f"job {h.job_id} is already watched by monitor pid {old.get('pid')} "
                f"(log: {old.get('log')})"
            )
        if not job.live:
            raise UsageError(f"job {h.job_id} already ended ({job.status}): nothing to watch")
        job.monitor = info
        h.folder.write_job(job)
        h.job = job


def _update_monitor(h: JobHandle, pid: int, **changes: Any) -> bool:
    """Change this monitor's entry in job.json (not if another monitor replaced it)."""
    with h.folder.locked():
        job = h.folder.load_job()
        info = job.monitor
        if info is None or info.get("pid") != pid:
            return False
        job.monitor = {**info, **changes}
        h.folder.write_job(job)
        h.job = job
    return True


def monitor_job(
    runs_dir: str | Path,
    job_id: str,
    settings: SSHSettings | None = None,
    *,
    poll: float = DEFAULT_POLL,
    lost_after: float = DEFAULT_LOST_TIMEOUT,
    sup: Supervision | None = None,
    stop_event: threading.Event | None = None,
    deadline: float | None = None,
    on_note: Callable[[str], None] | None = None,
    chase_lost: float = DEFAULT_CHASE_LOST,
    observe: Observe | None = None,
    report: ReportWriter | None = None,
) -> MonitorResult:
    """Watch a detached job until it ends, then end it like an attached run would.

    ``lost_after``: a node unreachable this long is lost (``--lost-timeout``); ``sup``: the
    run's limits and grace, enforced here as an attached run does (``past_limit``);
    ``observe``: the job's metrics while this monitor watches (docs/metrics.md; an address it
    cannot bind is an event, never a reason to leave the job unwatched) and its hooks, run
    once this monitor ended the job, after its ``report`` (report.html, as an attached run
    writes it, by the writer the API hands in; None: none).

    ``stop_event`` set (SIGTERM/SIGINT in the CLI) while watching: return at once, job left
    running. Once a verdict is reached the teardown and collection finish regardless (each
    bounded). ``deadline``: a ``time.monotonic()`` after which watching stops (None: as long
    as the job runs). Raises UsageError when another live monitor watches the job or it ended.
    """
    import dataclasses

    from fleetctl.api.runspec import Observe, Supervision
    from fleetctl.job.monitor.hooks import Hooks
    from fleetctl.transport.connection import SSHSettings

    sup = sup or Supervision()
    grace, hooks = sup.grace, Hooks.of(observe or Observe())

    stop_event = stop_event or threading.Event()
    note = on_note or (lambda text: None)
    me = identity()
    # A reconnect to a node that went away must not stall the polls of the others for long.
    settings = settings or SSHSettings()
    settings = dataclasses.replace(
        settings, connect_timeout=min(settings.connect_timeout, max(3.0, lost_after / 4))
    )
    with JobHandle(runs_dir, job_id, settings) as h:
        folder = h.folder
        info = {
            **me,
            "started": iso(time.time()),
            "poll": poll,
            LOST_KEY: lost_after,
            **sup.monitored(),
            "log": str(folder.monitor_log),
            "phase": "watching",
        }
        _register(h, info)
        pid = me["pid"]
        endpoint = _endpoint(h, observe or Observe(), note)
        metrics = endpoint.metrics if endpoint is not None else None

        def event(text: str) -> None:
            note(text)
            with contextlib.suppress(OSError):
                folder.event(f"monitor {text}")

        event(
            f"pid {pid} watching job {h.job_id} on {len(h.nodes)} node(s) "
            f"(poll {poll:g}s, lost after {lost_after:g}s unreachable)"
        )
        result = MonitorResult(h.job_id, "interrupted")
        try:
            decision, watch = _watch(
                h,
                stop_event,
                deadline,
                poll,
                lost_after,
                event,
                result,
                sup,
                metrics,
            )
            if decision is None or decision.action == "external":
                if decision is not None:
                    result.outcome = "gone"
                    event(f"{decision.describe()}; leaving it to that")
                return result
            ranks = {np.node_rank: np.host for np in h.plan.nodes}
            lost = {ranks[r] for r in watch.unreachable_since if r in ranks}
            if metrics is not None:
                metrics.polled({}, phase="teardown", status="running", progress=None)
            _finish(h, decision, grace, event, result, pid, lost)
            if metrics is not None:
                metrics.polled({}, phase="done", status=result.outcome, progress=None)
            if report is not None and result.final:
                from fleetctl.job.records.report import write_run_report

                write_run_report(report, h.folder.path, h.job_id, lambda ev: event(ev.text))
            if hooks and result.final:
                _hooks(h, hooks, decision, result, note)
            if lost and result.final:
                until = time.monotonic() + chase_lost
                every = max(poll, min(lost_after / 4, 15.0))
                _chase_lost(h, lost, grace, stop_event, until, every, event, pid)
            return result
        except Exception as e:
            result.outcome = "error"
            event(f"pid {pid} failed: {type(e).__name__}: {e}; the job is left running")
            raise
        finally:
            if endpoint is not None:
                endpoint.stop()
            with contextlib.suppress(FleetctlError, OSError):
                _update_monitor(
                    h, pid, phase="exited", outcome=result.outcome, ended=iso(time.time())
                )
            if result.outcome == "interrupted":
                event(f"pid {pid} stopped by a signal: the job is left running (detached)")
            elif result.outcome == "deadline":
                event(f"pid {pid} reached its deadline: the job is left running (detached)")


def _watch(
    h: JobHandle,
    stop_event: threading.Event,
    deadline: float | None,
    poll: float,
    lost_after: float,
    event: Callable[[str], None],
    result: MonitorResult,
    sup: Supervision,
    metrics: JobMetrics | None = None,
) -> tuple[Decision | None, WatchState]:
    """Poll until a verdict; None when interrupted, past the deadline or the job ended.
    ``sup``: the job's limits."""
    from fleetctl.job.monitor.slowwatch import MonitorPace
    from fleetctl.job.monitor.supervisors import ensure_supervisor, node_states
    from fleetctl.job.records.runs import _parse_iso

    policy = _policy(h.job)
    started = _parse_iso(h.job.started)
    watch = WatchState()
    pace = MonitorPace(h, sup, event)  # the slow-node watch (docs/health.md)
    by_name = {n.name: n for n in h.nodes}
    # One answer may take this long; a longer silence is ``lost_after``'s business.
    timeout = max(3.0, min(15.0, lost_after / 4))
    with contextlib.suppress(FleetctlError):
        ensure_supervisor(h.fleet, h.nodes)  # once; polls then are one command per node
    while True:
        if stop_event.is_set():
            return None, watch
        if deadline is not None and time.monotonic() > deadline:
            result.outcome = "deadline"
            return None, watch
        try:
            job = h.folder.load_job()
        except RunFolderError:
            job = h.job  # mid-rewrite elsewhere: atomic replace makes that rare; next poll
        if not job.live:
            result.outcome = "gone"
            event(f"job {h.job_id} is {job.status} now (ended elsewhere); leaving")
            return None, watch
        # Reconnect nodes that stopped answering (a broken transport is not reused).
        down = [by_name[np.host] for np in h.plan.nodes if np.node_rank in watch.unreachable_since]
        for node in down:
            h.fleet.drop(node)
        if down:
            h.fleet.connect(down)
        states = node_states(h.fleet, h.plan, h.nodes, ensure=False, timeout=timeout)
        if stop_event.is_set():
            return None, watch
        decision, notes = decide(states, watch, time.time(), lost_after=lost_after, policy=policy)
        for text in notes:
            event(text)
        if metrics is not None:
            _polled(metrics, states, watch)
        if decision is None:
            decision = limit_reached(
                states, watch, time.time(), started=started, sup=sup, policy=policy
            )
        if decision is None:
            decision = pace.poll(states)
        if decision is not None:
            return decision, watch
        stop_event.wait(poll)


# a supervisor's answer → the node's state in the metrics (unreachable: as it was)
_POLLED = {"running": "running", "stopped": "stopped", "lost": "lost", "absent": "lost"}


def _endpoint(
    h: JobHandle, observe: Observe, note: Callable[[str], None]
) -> MetricsEndpoint | None:
    """The job's metrics, served while this monitor watches (None: not asked, or refused)."""
    from fleetctl.job.monitor.exposition import endpoint_for
    from fleetctl.job.monitor.metrics import JobMetrics

    def metrics() -> JobMetrics:
        made = JobMetrics()
        made.attempt(h.job_id, 1, [np.host for np in h.plan.nodes], 0)
        return made

    try:
        endpoint = endpoint_for(observe, metrics)
        return None if endpoint is None else endpoint.start()
    except UsageError as e:  # the job is watched all the same
        note(f"no metrics: {e.one_line()}")
        with contextlib.suppress(OSError):
            h.folder.event(f"monitor no metrics: {e.one_line()}")
        return None


def _polled(metrics: JobMetrics, states: list[NodeReport], watch: WatchState) -> None:
    seen: dict[int, str] = {}
    for r in states:
        if r.state == "exited":
            seen[r.rank] = "succeeded" if r.exit_code == 0 and r.signal is None else "failed"
        elif r.state in _POLLED:
            seen[r.rank] = _POLLED[r.state]
    metrics.polled(seen, phase="run", status="running", progress=watch.last_progress)


def _hooks(
    h: JobHandle,
    hooks: Hooks,
    decision: Decision,
    result: MonitorResult,
    note: Callable[[str], None],
) -> None:
    """``--on-failure``/``--on-end`` once this monitor ended the job (fleetctl.job.monitor.hooks:
    each hook's end is a line of events.log, and of monitor.log through ``note``)."""
    from fleetctl.job.monitor.hooks import run_hooks

    culprit = None
    if decision.action == "fail" and decision.rank is not None:
        how = decision.describe().split(": ", 1)[-1]
        culprit = (str(decision.host), decision.rank, how)
    reason = decision.reason if decision.action == "give_up" else decision.describe()
    run_hooks(
        hooks,
        h.job_id,
        result.outcome,
        h.folder.path,
        reason=reason,
        culprit=culprit,
        on_event=lambda ev: note(ev.text),
    )


def _finish(
    h: JobHandle,
    decision: Decision,
    grace: float,
    event: Callable[[str], None],
    result: MonitorResult,
    pid: int,
    lost: set[str],
) -> None:
    """Tear the job down everywhere (verified), collect every node's logs, write job.json.
    ``lost``: nodes not answering now (not waited on; chased afterwards)."""
    from fleetctl.job.monitor.supervisors import request_stop
    from fleetctl.phases.collect import collect
    from fleetctl.phases.teardown import teardown

    with h.folder.locked():  # still ours to end? `fleetctl stop` may have been faster
        job = h.folder.load_job()
        if not job.live:
            result.outcome = "gone"
            event(f"job {h.job_id} is {job.status} now (ended elsewhere); leaving")
            return
        info = job.monitor
        if info is not None and info.get("pid") == pid:
            job.monitor = {**info, "phase": "finishing", "verdict": decision.describe()}
            h.folder.write_job(job)
    result.decision = decision
    extra: dict[str, Any] = {"verdict": decision.reason} if decision.action == "give_up" else {}
    if decision.action == "fail":
        event(f"{decision.describe()}; stopping the job on every node (grace {grace:g}s)")
        with contextlib.suppress(FleetctlError):  # best effort: says why on each node
            request_stop(
                h.fleet,
                h.plan,
                h.nodes,
                reason=f"{MONITOR_REASON}: node {decision.rank} ({decision.host}) failed first",
                skip=lost,
            )
    elif decision.action == "give_up":
        event(f"{decision.describe()}; stopping the job on every node (grace {grace:g}s)")
        if str(decision.reason).startswith("stalled"):
            extra.update(_dump_stacks(h, event))
        with contextlib.suppress(FleetctlError):
            request_stop(
                h.fleet, h.plan, h.nodes, reason=f"{MONITOR_REASON}: {decision.reason}", skip=lost
            )
    else:
        event(f"{decision.describe()}; verifying nothing is left, collecting logs")
    h.stop_time = time.time()
    report = teardown(
        h.fleet,
        h.plan,
        grace=grace,
        pythons=h.pythons(),
        lost=lost,
        lost_note=LOST_NOTE,
    )
    for n in report.nodes:
        if n.remaining or n.error:
            event(f"node {n.rank} ({n.host}) teardown: {n.error or f'LEFT {n.remaining}'}")
    event(
        "teardown "
        + ("verified: nothing of the job left on any node" if report.verified else "NOT verified")
        + f" ({report.seconds:.1f}s)"
    )
    results = collect(
        h.fleet, h.plan, h.folder.path, pythons=h.pythons(), skip=lost, options=h.collect_options()
    )
    for c in results:
        if c.error:
            event(f"node {c.rank} ({c.host}) logs not collected: {c.error}")
    status = "failed" if decision.action == "fail" else str(decision.status)
    result.outcome = status
    result.verified = report.verified
    result.final = h.mark_ended(
        status,
        report,
        results,
        failed_first=decision.first_failure(),
        extra=extra,
        tore_down=decision.action in ("fail", "give_up"),
    )
    event(
        f"job {h.job_id} {status}; logs in {h.folder.path}"
        if result.final
        else f"job {h.job_id} ended elsewhere meanwhile ({h.job.status}); its record stands"
    )


def _dump_stacks(h: JobHandle, event: Callable[[str], None]) -> dict[str, Any]:
    """A stalled detached job: every rank's stack before the teardown, folded into job.json."""
    import dataclasses

    from fleetctl.job.diagnose.stacks import fold
    from fleetctl.phases.stacks import dump_stacks

    event("dumping the stack of every process of the job on every node")
    try:
        report = dump_stacks(h.fleet, h.plan, pythons=h.pythons(), abort=True)
    except FleetctlError as e:
        event(f"stack dump failed: {e.one_line()}")
        return {}
    groups = fold(report.stacks())
    for g in groups:
        who = (
            f"ranks {list(g.ranks)}" if g.ranks else f"launchers on nodes {list(g.launcher_nodes)}"
        )
        event(f"stacks: {who}: {g.frame}")
    return {
        "stacks": [dataclasses.asdict(g) for g in groups],
        "stack_nodes": [n.to_dict() for n in report.nodes],
    }


def _chase_lost(
    h: JobHandle,
    hosts: set[str],
    grace: float,
    stop_event: threading.Event,
    until: float,
    every: float,
    event: Callable[[str], None],
    pid: int,
) -> None:
    """Keep trying to reach lost nodes (bounded by ``until``) and stop the job there when one
    answers again: a detached job's supervisor has no dead-man switch, so nobody else would."""
    from fleetctl.phases.collect import collect
    from fleetctl.phases.teardown import teardown

    with contextlib.suppress(FleetctlError, OSError):
        _update_monitor(h, pid, phase="chasing", chasing=sorted(hosts))
    by_name = {n.name: n for n in h.nodes}
    everyone = {np.host for np in h.plan.nodes}
    pending = set(hosts)
    event(f"will stop the job on lost node(s) {', '.join(sorted(pending))} once they answer")
    while pending and not stop_event.wait(every) and time.monotonic() < until:
        for host in sorted(pending):
            node = by_name[host]
            h.fleet.drop(node)
            if h.fleet.connect([node]).failed:
                continue
            others = everyone - {host}
            report = teardown(
                h.fleet, h.plan, grace=grace, pythons=h.pythons(), lost=others, lost_note=LOST_NOTE
            )
            stop = next(n for n in report.nodes if n.host == host)
            if stop.error:
                continue  # answered the handshake, not the stop: try again
            results = collect(
                h.fleet,
                h.plan,
                h.folder.path,
                pythons=h.pythons(),
                skip=others,
                options=h.collect_options(),
            )
            h.record_late_stop(stop, [c for c in results if c.host == host])
            what = "verified: nothing left" if stop.clean else f"LEFT {stop.remaining}"
            event(f"lost node {stop.rank} ({host}) answers again; job stopped there, {what}")
            pending.discard(host)
    if pending:
        event(
            f"lost node(s) {', '.join(sorted(pending))} not reached; the job may still run "
            f"there: `fleetctl stop {h.job_id}` once they are back"
        )
