"""``fleetctl run``, the whole job: connect → check → push → plan → launch → watch → teardown →
collect → summary data.

Everything a user should see arrives through ``on_event`` (``JobEvent``); this module never
prints. Teardown runs in ``finally`` — after the first failure, on Ctrl-C (a second Ctrl-C skips
the grace period), after an error and after success (then it only verifies nothing is left) —
and logs are collected every time. ``run_job`` returns a ``JobResult`` whose ``exit_code`` is 0
(every node succeeded), 3 (a node failed or was lost) or 130 (interrupted); errors before the
launch (inventory, check, push, plan) are raised as ``FleetctlError``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.api.runspec import Hosts, Retry, Supervision
from fleetctl.errors import FleetctlError, LaunchError
from fleetctl.job.records.result import JobEvent, JobPhase, JobResult
from fleetctl.job.records.runfolder import DEFAULT_RUNS_DIR
from fleetctl.job.records.state import JobStatus
from fleetctl.job.run.context import JobContext, on_event
from fleetctl.job.run.finish import finish
from fleetctl.job.run.prepare import prepare
from fleetctl.phases.collect import CollectOptions
from fleetctl.phases.launch import NodeRun, node_spec, start_node
from fleetctl.phases.push.request import PushRequest
from fleetctl.phases.reattach import reattach_stream
from fleetctl.phases.watch import DEFAULT_HEARTBEAT, Event, Watch

if TYPE_CHECKING:
    from fleetctl.job.monitor.metrics import JobObserver
    from fleetctl.job.run.checkpoints import CheckpointRelay
    from fleetctl.job.run.rolejob import RolePlanner
    from fleetctl.node import Node
    from fleetctl.phases.check.preflight import CheckOptions
    from fleetctl.phases.frames import Frame
    from fleetctl.phases.push import PushOptions
    from fleetctl.plan.collective import CollectiveOptions
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.plan.roles import CompletionPolicy
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection, HealthWatch, SSHSettings

REATTACH_TRY = 1.0  # s for one try at a new connection to a silent node (TCP, banner, auth)


@dataclass
class RunOptions:
    """How ``fleetctl run`` behaves around the job (the job itself is the ``JobSpec``)."""

    runs_dir: str | Path = DEFAULT_RUNS_DIR
    # which hosts and how they are checked first: --no-check, --nodes N (the rest are spares),
    # busy GPUs, the probe's time (RunSpec's group, read where each is applied)
    hosts: Hosts = field(default_factory=Hosts)
    # how the job is watched and stopped: limits, grace, dead-man switch, slow-node watch,
    # post-mortem (RunSpec's group, read where each is applied)
    supervision: Supervision = field(default_factory=Supervision)
    heartbeat: float = DEFAULT_HEARTBEAT
    # what is pushed (code, env) and which key-like files go on purpose (the relay's too)
    push: PushRequest = field(default_factory=PushRequest)
    settings: SSHSettings | None = None
    attempt: int = 1
    check_options: CheckOptions | None = None  # None = derived from the spec
    push_options: PushOptions | None = None
    recheck: bool = False  # never a cached check verdict (a retry after a node fault)
    elastic: bool = False  # --elastic: a lost node's place goes to a spare, the job runs on
    spares: tuple[Node, ...] = ()  # --elastic: the hosts that may take a lost node's place
    collective: CollectiveOptions | None = None  # --collective: benchmark after the check
    left_out: dict[str, str] | None = None  # --nodes N: hosts this attempt left out, and why
    detach: bool = False  # leave the job to the node supervisors (no dead-man switch)
    planner: RolePlanner | None = None  # role jobs; None: make_plan
    completion: CompletionPolicy | None = None  # None: the first failure ends the job
    inventory: str | None = None  # recorded in connect.json so other commands can reconnect
    limit: str | None = None
    collect: CollectOptions | None = None  # cap and excludes for the logs (None: defaults)
    # retries: how long one waits for a lost host, what it relays, how an elastic job shrinks
    # (RunSpec's group, read where each is applied)
    retry: Retry = field(default_factory=Retry)
    # a retry: the last attempt's checkpoints, copied first (--resume: an earlier job's)
    relay: CheckpointRelay | None = None
    # after the check and push, before plan and launch: (nodes, settings) -> None; what it
    # raises stops the run before anything started (`run --before`, fleetctl.api)
    before_launch: Callable[[Sequence[Node], SSHSettings | None], None] | None = None
    observer: JobObserver | None = None  # --metrics-addr: what the run's metrics are made of


# ----------------------------------------------------------------------------------- the job


def run_job(
    spec: JobSpec,
    nodes: Sequence[Node],
    options: RunOptions | None = None,
    *,
    on_event: Callable[[JobEvent], None] | None = None,
    fleet: FanOut | None = None,
) -> JobResult:
    """Run ``spec`` on ``nodes`` (rank order). Returns the result; raises only before launch.

    A ``fleet`` given by the caller is reused and left open; otherwise one is made and closed.
    """
    from fleetctl.ssh.fanout import FanOut

    options = options or RunOptions()
    job = JobContext(spec, nodes, options, on_event or (lambda e: None))
    own = fleet is None
    fleet = fleet or FanOut(nodes, options.settings)
    interrupted = False
    try:
        job.save()
        prepare(job, fleet)
        _launch_and_watch(job, fleet)
    except KeyboardInterrupt:
        interrupted = True
        job.state.status = JobStatus.INTERRUPTED
        job.sync()
        job.emit("notice", "interrupted: stopping the job on every node (Ctrl-C again: no grace)")
    except FleetctlError as e:
        job.state.status = JobStatus.ERROR
        job.sync()
        job.result.errors.append(e.one_line())
        raise
    finally:
        job.release_held()
        try:
            finish(job, fleet, interrupted)
        except Exception as e:  # attached to the result, never replacing the original error
            job.result.errors.append(f"teardown/collect failed: {type(e).__name__}: {e}")
            job.save()
        finally:
            if own:
                fleet.close()
    return job.result


def _reattacher(fleet: FanOut) -> Callable[[NodeRun, float], list[Frame]]:
    """How the watcher reaches a silent node again: a new connection (the old transport may
    be dead), tried again and again until the deadline (``time.monotonic()``), each try short
    (a link coming back answers the next try at once, not after the kernel's SYN back-off);
    it replaces the old one."""

    def dial(node: Node, deadline: float) -> Connection:
        from fleetctl.transport.connection import connect

        while True:
            one = max(0.3, min(REATTACH_TRY, deadline - time.monotonic()))
            try:
                return connect(node, dataclasses.replace(fleet.settings, connect_timeout=one))
            except FleetctlError:
                if time.monotonic() + 0.1 >= deadline:
                    raise
                time.sleep(0.1)

    def reattach(run: NodeRun, deadline: float) -> list[Frame]:
        conn = dial(run.node, deadline)
        try:
            # a node that answered the handshake gets a moment to answer from its supervisor
            frames = reattach_stream(run, conn, timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            conn.close()
            raise
        conn.use_settings(fleet.settings)  # from here on it is the node's connection, as dialled
        run.conn = conn
        # the old connection closes, its stream with it: the supervisor sees EOF and runs on
        fleet.adopt(run.node, conn)
        return frames

    return reattach


def _progress_judge(nodes: dict[int, str], roles: dict[int, str] | None, sup: Any) -> Any:
    """The progress-rate judge of an attached run, reading ``--progress-regex`` if given."""
    from fleetctl.job.diagnose.progress_rate import progress_judge
    from fleetctl.remote.kit.progress import compile_own

    own = compile_own(sup.progress_regex) if sup.progress_regex else None
    return progress_judge(nodes, roles, sup.slow_rounds, own)


def _launch_and_watch(job: JobContext, fleet: FanOut) -> None:
    """Start every node in parallel, stream events until all ended or the first failure."""
    plan, options, sup = job.plan, job.options, job.options.supervision
    assert plan is not None
    watch = job.watch = Watch(sup, heartbeat=options.heartbeat, reattach=_reattacher(fleet))
    by_name = {n.name: n for n in job.nodes}
    pace = None
    if sup.on_slow != "off" and len(plan.nodes) > 1:  # the node the others wait for
        from fleetctl.job.diagnose.pace import judge_for

        pace = {}  # the sampler's defaults (fleetctl.remote.kit.pace); detached: the monitor's
        if not options.detach:
            nodes = {np.node_rank: np.host for np in plan.nodes}
            job.pace = judge_for(nodes, job.roles, sup.slow_rounds)  # role jobs: by role
            job.sample_stacks = _stack_sampler(job, fleet)
            # nodes that progress independently: their rates (docs/health.md)
            job.progress_judge = _progress_judge(nodes, job.roles, sup)
        elif sup.progress_regex:  # the supervisors count the markers for the monitor
            pace["progress_regex"] = sup.progress_regex
    job.state.launch()
    job.sync()
    job.result.started = time.time()
    say = f"launching {plan.launcher} on {len(plan.nodes)} node(s), job {plan.job_id}"
    job.emit("phase", say, phase=JobPhase.RUN)
    job.save()

    def start_one(np: Any) -> None:
        node = by_name[np.host]
        try:
            conn: Connection = fleet.connection(node)
            spec = node_spec(
                np,
                conn,
                job_id=plan.job_id,
                deadman=sup.deadman,
                grace=sup.grace,
                heartbeat=options.heartbeat,
                detach=options.detach,
                path_prepend=job.path_prepend.get(np.host, []),
                collect=(options.collect or CollectOptions()).wire(),
                pace=pace,
            )
            run: NodeRun = start_node(
                node, conn, spec, python=node.python, held=job.take_held(np.host)
            )
        except BaseException as e:  # every node's outcome becomes an event, never lost
            reason = e.one_line() if isinstance(e, FleetctlError) else f"{type(e).__name__}: {e}"
            if isinstance(e, LaunchError) and reason.startswith(node.label + ": "):
                reason = reason[len(node.label) + 2 :]
            watch.events.put(Event("start_failed", np.node_rank, np.host, time.time(), reason))
            return
        if job.stopping:  # failed elsewhere meanwhile: stop at once, the watcher sees it end
            with contextlib.suppress(Exception):
                run.stream.send(b"t")
        note = "uploaded supervisor" if run.uploaded else ""
        if options.detach:  # the detached supervisor lives on alone: nothing to watch
            with contextlib.suppress(Exception):
                run.stream.close()
            watch.events.put(Event("started", np.node_rank, np.host, run.started, "detached"))
            return
        watch.events.put(Event("started", np.node_rank, np.host, run.started, note))
        watch.attach(run)  # after "started": its lines and exit always come later

    def launch_all() -> None:
        # At most --fanout starts in flight (each an SSH exec and a supervisor handshake), so
        # a 1,000-node job does not open 1,000 threads and sessions at once.
        todo = collections.deque(plan.nodes)
        width = max(1, min(fleet.fanout, len(todo)))

        def worker() -> None:
            while True:
                try:
                    np = todo.popleft()
                except IndexError:
                    return
                start_one(np)

        threads = [
            threading.Thread(target=worker, daemon=True, name=f"launch-{i}") for i in range(width)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60.0 * math.ceil(len(plan.nodes) / width)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        job.release_held()
        job.launch_done.set()

    job.launched = {np.node_rank for np in plan.nodes}
    job.launch_thread = threading.Thread(target=launch_all, daemon=True, name="launch")
    job.launch_thread.start()
    health = _watch_health(job, watch)
    try:
        _watch_until_done(job, fleet, watch)
    finally:
        for h in health:
            h.stop()


def _stack_sampler(job: JobContext, fleet: FanOut) -> Callable[[], dict[int, dict[str, Any]]]:
    """Every rank's py-spy samples once a node is named slow (``context.slow_node``); the
    stack modules load then, not at every launch (most runs never name one)."""
    plan = job.plan
    assert plan is not None

    def sample() -> dict[int, dict[str, Any]]:
        from fleetctl.phases.stacks import SAMPLE_WINDOW, SAMPLES, sample_stacks

        return sample_stacks(
            fleet, plan, pythons=job.pythons, samples=SAMPLES, window=SAMPLE_WINDOW
        )

    return sample


def _watch_health(job: JobContext, watch: Watch) -> list[HealthWatch]:
    """Each transport's health source beside the connections, for its nodes of the plan: inside
    a Slurm allocation a node Slurm marks DOWN/NOT_RESPONDING is lost at once, in Slurm's words
    (``SrunConnection.watch_health``); SSH has none."""
    from fleetctl.transport.connection import transport

    assert job.plan is not None
    ranks = {np.host: np.node_rank for np in job.plan.nodes}
    by_transport: dict[type[Connection], list[str]] = {}
    for n in job.nodes:
        if n.name in ranks:
            by_transport.setdefault(transport(n), []).append(n.name)
    started = []
    for cls, names in by_transport.items():
        h = cls.watch_health(names, lambda name, why: watch.lose(ranks[name], why))
        if h is not None:
            started.append(h)
    return started


def _watch_until_done(job: JobContext, fleet: FanOut, watch: Watch) -> None:
    """Feed the watcher's events to the job until every node ended or the first failure."""
    pending = set(job.launched)
    started = job.progress = time.monotonic()
    options = job.options
    elastic = None
    if options.elastic:  # a lost node's place goes to a spare (fleetctl.job.run.elastic)
        from fleetctl.job.run.elastic import Membership

        elastic = Membership(job, fleet, watch)
    while pending:
        ev = watch.get(0.2)
        if ev is not None and ev.kind == "lost" and elastic is not None and elastic.lost(ev):
            if job.state.states[ev.rank].ended:  # --min-nodes: the job goes on without it
                pending.discard(ev.rank)
            continue
        if ev is not None and ev.kind == "lines" and elastic is not None:
            elastic.lines(ev)
        if ev is not None:
            on_event(job, ev)
            slow = ev.kind in ("pace", "stacks", "lines") and job.result.slow is not None
            if slow and job.state.gave_up:
                return  # --on-slow stop: the slow node is the first failure; tear down
        job.flush()
        why = limit_reached(job, started)
        if why is not None and job.state.give_up(why):
            job.sync()
            job.emit("failure", why)
            if why.startswith("stalled"):
                _dump_stacks(job, fleet)
            return
        if ev is None:
            continue
        if ev.kind in ("exit", "lost", "start_failed") or (options.detach and ev.kind == "started"):
            pending.discard(ev.rank)
            if job.state.first_failure is not None or job.state.verdict is not None:
                return


def limit_reached(job: JobContext, started: float, now: float | None = None) -> str | None:
    """Past ``--timeout``, or (once every node launched) a stall limit: why, else None
    (``monitor_decide.past_limit``, the detached job monitor's decision too). ``now``:
    ``time.monotonic()`` unless given (tests)."""
    from fleetctl.job.monitor.decide import past_limit

    return past_limit(
        job.options.supervision,
        time.monotonic() if now is None else now,
        started=started,
        progress=job.progress if job.begun is not None else None,
        launched=job.launch_done.is_set(),
        finishing=job.finishing,
    )


def _dump_stacks(job: JobContext, fleet: FanOut) -> None:
    """Every rank's stack before the teardown, folded so the odd rank out shows."""
    from fleetctl.job.diagnose.stacks import fold
    from fleetctl.phases.stacks import dump_stacks

    assert job.plan is not None
    job.emit("notice", "dumping the stack of every process of the job on every node")
    report = dump_stacks(fleet, job.plan, pythons=job.pythons, abort=True)
    job.result.stacks = [dataclasses.asdict(g) for g in fold(report.stacks())]
    job.result.stack_nodes = [n.to_dict() for n in report.nodes]
    for n in report.nodes:
        how = ", ".join(f"{k} {v}" for k, v in sorted(n.methods().items()))
        job.emit(
            "notice", f"stacks: {n.error or how or 'no Python process of the job'}", rank=n.rank
        )
