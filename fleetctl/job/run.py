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

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import CheckError, FleetctlError, LaunchError, RunFolderError
from fleetctl.job.result import JobEvent, JobResult, NodeOutcome
from fleetctl.job.runfolder import DEFAULT_RUNS_DIR, RunFolder
from fleetctl.job.state import JobState, JobStatus, NodeState, exit_state
from fleetctl.job.supervisors import EXTERNAL_STOP_REASON
from fleetctl.phases.launch import NodeRun, node_spec, start_node
from fleetctl.phases.watch import DEFAULT_HEARTBEAT, DEFAULT_LOST_TIMEOUT, Event, Watch

if TYPE_CHECKING:
    from fleetctl.job.rolejob import RolePlanner
    from fleetctl.node import Node
    from fleetctl.phases.check import CheckOptions
    from fleetctl.phases.push import PushOptions
    from fleetctl.plan.rankplan import JobSpec, Plan
    from fleetctl.plan.roles import CompletionPolicy
    from fleetctl.ssh.connection import Connection, SSHSettings, Stream
    from fleetctl.ssh.fleet import Fleet

DEFAULT_GRACE = 5.0
DEFAULT_DEADMAN = 10.0


@dataclass
class RunOptions:
    """How ``fleetctl run`` behaves around the job (the job itself is the ``JobSpec``)."""

    runs_dir: str | Path = DEFAULT_RUNS_DIR
    check: bool = True
    grace: float = DEFAULT_GRACE
    lost_timeout: float = DEFAULT_LOST_TIMEOUT
    deadman: float = DEFAULT_DEADMAN
    heartbeat: float = DEFAULT_HEARTBEAT
    code: str | Path | None = None  # local folder to push (None: nothing pushed)
    env_archive: str | Path | None = None  # conda-pack archive to push
    settings: SSHSettings | None = None
    attempt: int = 1
    check_options: CheckOptions | None = None  # None = derived from the spec
    push_options: PushOptions | None = None
    detach: bool = False  # leave the job to the node supervisors (no dead-man switch)
    planner: RolePlanner | None = None  # role jobs; None: make_plan
    completion: CompletionPolicy | None = None  # None: the first failure ends the job
    timeout: float | None = None  # s of wall clock from launch, then the job is stopped
    stall_timeout: float | None = None  # s with no output line from any node, then stopped
    inventory: str | None = None  # recorded in connect.json so other commands can reconnect
    limit: str | None = None


# ----------------------------------------------------------------------------------- the job


class _Job:
    """State shared by the phases of one run (kept off the public API)."""

    def __init__(
        self,
        spec: JobSpec,
        nodes: Sequence[Node],
        options: RunOptions,
        emit: Callable[[JobEvent], None],
    ) -> None:
        self.spec, self.nodes, self.options = spec, list(nodes), options
        self._emit_cb = emit
        self.folder = RunFolder.create(options.runs_dir, spec.job_id)
        with contextlib.suppress(OSError):  # how `fleetctl status/logs/stop JOB` reconnect
            from fleetctl.job.records import nodes_as_reached, write_connect

            write_connect(
                self.folder.path,
                nodes_as_reached(nodes, options.settings),
                inventory=options.inventory,
                limit=options.limit,
            )
        self.result = JobResult(
            job_id=spec.job_id,
            folder=self.folder.path,
            launcher=spec.launcher,
            attempt=options.attempt,
            detached=options.detach,
        )
        self.result.nodes = [
            NodeOutcome(i, n.name, n.address, n.train_addr) for i, n in enumerate(nodes)
        ]
        self.plan: Plan | None = None
        self.watch: Watch | None = None
        self.launch_thread: threading.Thread | None = None
        self.launch_done = threading.Event()
        self.launched: set[int] = set()  # ranks whose start was attempted
        self.pythons: dict[str, str] = {n.name: n.python for n in nodes}
        self.path_prepend: dict[str, list[str]] = {}
        self.state = JobState(len(self.nodes), options.completion)
        self.progress = time.monotonic()  # last output line or start on any node

    @property
    def stopping(self) -> bool:
        return self.state.stopping

    def sync(self) -> None:
        """The state machine's verdict into the result (what job.json and the CLI show)."""
        r, st = self.result, self.state
        r.status, r.first_failure, r.failure_time = st.status, st.first_failure, st.failure_time
        r.verdict = st.verdict

    def emit(
        self,
        kind: str,
        text: str = "",
        *,
        rank: int | None = None,
        code: int | None = None,
        log: bool = True,
        ts: float | None = None,
        lines: tuple[str, ...] = (),
    ) -> None:
        host = self.result.nodes[rank].host if rank is not None else None
        ev = JobEvent(kind, text, rank, host, code, ts or time.time(), lines)
        if log and kind not in ("line", "lines"):
            where = f"[{rank} {host}] " if rank is not None else ""
            with contextlib.suppress(OSError):
                self.folder.event(f"{kind} {where}{text}".rstrip(), ev.time)
        self._emit_cb(ev)

    def save(self) -> None:
        with contextlib.suppress(OSError, RunFolderError), self.folder.locked():
            self.folder.write_job(self.result.to_dict())


def run_job(
    spec: JobSpec,
    nodes: Sequence[Node],
    options: RunOptions | None = None,
    *,
    on_event: Callable[[JobEvent], None] | None = None,
    fleet: Fleet | None = None,
) -> JobResult:
    """Run ``spec`` on ``nodes`` (rank order). Returns the result; raises only before launch.

    A ``fleet`` given by the caller is reused and left open; otherwise one is made and closed.
    """
    from fleetctl.ssh.fleet import Fleet

    options = options or RunOptions()
    job = _Job(spec, nodes, options, on_event or (lambda e: None))
    own = fleet is None
    fleet = fleet or Fleet(nodes, options.settings)
    interrupted = False
    try:
        job.save()
        _prepare(job, fleet)
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
        try:
            _finish(job, fleet, interrupted)
        except Exception as e:  # attached to the result, never replacing the original error
            job.result.errors.append(f"teardown/collect failed: {type(e).__name__}: {e}")
            job.save()
        finally:
            if own:
                fleet.close()
    return job.result


def _prepare(job: _Job, fleet: Fleet) -> None:
    """Connect, check, push and plan; writes plan.json. Raises on anything that blocks launch."""
    import dataclasses

    from fleetctl.plan.rankplan import NodeFacts, make_plan

    spec, options = job.spec, job.options
    job.emit("phase", f"connecting to {len(job.nodes)} node(s)")
    facts: dict[str, NodeFacts] = {}
    known_present: frozenset[str] = frozenset()  # nodes the check saw the code snapshot on
    if options.check:
        from fleetctl.phases.check import CheckOptions, check_fleet

        copts = options.check_options or CheckOptions(
            master_port=spec.master_port,
            backend=spec.backend,
            uniform_gpus=spec.launcher != "plain" and spec.nproc_per_node == "auto",
        )
        if options.check_options is None and options.code is not None:
            from fleetctl.phases import codesync

            # the probe also looks for this snapshot, so a no-op push needs no round trip
            snap = codesync.snapshot(options.code)
            copts = dataclasses.replace(copts, code_dir=f"code/{snap.digest}")
        job.emit("phase", "checking nodes")
        report = check_fleet(fleet, copts)
        if not report.ok:
            from fleetctl.results import FleetResult

            problems = "; ".join(f"{h}: {c}: {why}" for h, c, why in report.failures[:5])
            mesh = "; ".join(str(m) for m in report.mesh_failures[:3])
            raise CheckError(
                f"preflight failed ({report.summary()}): {problems or mesh}",
                FleetResult(dict(report.hosts)),
            )
        facts = dict(report.facts)
        if not report.cached:  # a cached report may be minutes old: ask again
            known_present = frozenset(h for h, ok in report.code_present.items() if ok)
        for w in report.warnings:
            job.emit("warning", w)
    else:
        res = fleet.connect()
        if res.failed:
            from fleetctl.errors import FleetError

            first = next(iter(res.failed.values()))
            raise FleetError(
                f"cannot connect to {len(res.failed)} node(s): {first}", res
            ) from first
    code_digest = None
    if options.code is not None or options.env_archive is not None:
        from fleetctl.phases import push as push_mod

        job.emit("phase", "pushing code" + (" and env" if options.env_archive else ""))
        popts = options.push_options or push_mod.PushOptions(
            require_nccl=spec.backend == "nccl",
            train_addrs={k: f.train_addr for k, f in facts.items() if f.train_addr},
            known_present=known_present,
        )
        report = push_mod.push(
            fleet, code=options.code, env_archive=options.env_archive, options=popts
        )
        code_digest = report.code_digest
        for n in job.nodes:
            prefix = push_mod.env_path_prefix(report, n.name)
            if prefix:
                job.path_prepend[n.name] = [prefix]
                f = facts.get(n.name) or NodeFacts()
                facts[n.name] = dataclasses.replace(f, python=prefix + "/python")
    if options.planner is not None:  # role jobs: ports probed, roles laid out
        job.plan, layout = options.planner.plan(job.nodes, spec, facts or None, code_digest, fleet)
        job.folder.write_roles(layout.to_dict())
    else:
        job.plan = make_plan(job.nodes, spec, facts or None, code_digest=code_digest)
    job.result.plan = job.plan
    for np in job.plan.nodes:
        job.result.nodes[np.node_rank].train_addr = np.train_addr
    job.folder.write_plan(job.plan.to_dict())


def _launch_and_watch(job: _Job, fleet: Fleet) -> None:
    """Start every node in parallel, stream events until all ended or the first failure."""
    plan, options = job.plan, job.options
    assert plan is not None
    watch = job.watch = Watch(lost_timeout=options.lost_timeout, heartbeat=options.heartbeat)
    by_name = {n.name: n for n in job.nodes}
    job.state.launch()
    job.sync()
    job.result.started = time.time()
    job.emit("phase", f"launching {plan.launcher} on {len(plan.nodes)} node(s), job {plan.job_id}")
    job.save()

    def start_one(np: Any) -> None:
        node = by_name[np.host]
        try:
            conn: Connection = fleet.connection(node)
            spec = node_spec(
                np,
                conn,
                job_id=plan.job_id,
                deadman=options.deadman,
                grace=options.grace,
                heartbeat=options.heartbeat,
                detach=options.detach,
                path_prepend=job.path_prepend.get(np.host, []),
            )
            run: NodeRun = start_node(node, conn, spec, python=node.python)
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
        threads = [
            threading.Thread(
                target=start_one, args=(np,), daemon=True, name=f"launch-{np.node_rank}"
            )
            for np in plan.nodes
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
        job.launch_done.set()

    job.launched = {np.node_rank for np in plan.nodes}
    job.launch_thread = threading.Thread(target=launch_all, daemon=True, name="launch")
    job.launch_thread.start()
    pending = set(job.launched)
    job.progress = time.monotonic()
    deadline = None if options.timeout is None else job.progress + options.timeout
    while pending:
        ev = watch.get(0.2)
        if ev is not None:
            _on_event(job, ev)
        why = _limit_reached(job, deadline)
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


def _limit_reached(job: _Job, deadline: float | None) -> str | None:
    """``--timeout`` passed, or no rank made progress for ``--stall-timeout``: why, else None."""
    now, options = time.monotonic(), job.options
    if deadline is not None and now > deadline:
        return f"timed out after {options.timeout:g} s"
    stall = options.stall_timeout
    if stall is not None and now - job.progress > stall and job.launch_done.is_set():
        return f"stalled: no progress on any node for {now - job.progress:.0f} s"
    return None


def _dump_stacks(job: _Job, fleet: Fleet) -> None:
    """Every rank's stack before the teardown, folded so the odd rank out shows."""
    from fleetctl.job.stacks import fold
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


def _on_event(job: _Job, ev: Event) -> None:
    """Feed a watcher event to the job's state machine, record it in the result, pass it on."""
    node, state = job.result.nodes[ev.rank], job.state
    if ev.kind == "progress":
        job.progress = time.monotonic()
        return
    if ev.kind == "lines":
        job.progress = time.monotonic()
        node.tail.extend(ev.lines)
        job.emit("lines", rank=ev.rank, ts=ev.time, lines=ev.lines)
        return
    if ev.kind == "notice":
        if ev.text.endswith(EXTERNAL_STOP_REASON):
            state.stop_requested(EXTERNAL_STOP_REASON)  # `fleetctl stop` elsewhere: no failure
        job.sync()
        job.emit("notice", ev.text, rank=ev.rank, ts=ev.time)
        return
    if ev.kind == "started":
        job.progress = time.monotonic()
        state.start(ev.rank)
        node.state, node.start_time = state.states[ev.rank], ev.time
        job.emit("started", ev.text, rank=ev.rank, ts=ev.time)
        job.save()
        return
    node.end_time = ev.time
    if ev.kind == "exit":
        node.leftovers = ev.report
        code = ev.code if ev.code is not None else 255
        node.exit_code, node.signal = (code, None) if code >= 0 else (None, -code)
        # The node's own word beats our arrival order: had a stop reached it before its
        # launcher ended (our teardown's doing), and when did it end (its clock)?
        report = ev.report or {}
        stopped = report.get("stop_asked", state.stopping)
        when = report.get("ended_at") if isinstance(report.get("ended_at"), float) else ev.time
        change = state.end(ev.rank, exit_state(code, stopping=bool(stopped)), when)
        node.state = change.state
        job.emit("exit", node.how(), rank=ev.rank, code=code, ts=ev.time)
    elif ev.kind == "lost":
        node.reason = ev.text
        change = state.end(ev.rank, NodeState.LOST, ev.time)
        node.state = change.state
        job.emit("lost", ev.text, rank=ev.rank, ts=ev.time)
    else:  # start_failed
        node.reason = ev.text
        change = state.end(ev.rank, NodeState.START_FAILED, ev.time)
        node.state = change.state
        job.emit("exit", f"could not start: {ev.text}", rank=ev.rank, ts=ev.time)
    job.sync()
    if change.completed is not None:
        job.emit("notice", f"job complete: {change.completed}; stopping the other nodes")
    if change.first_failure:
        job.emit("failure", node.how(), rank=ev.rank, ts=ev.time)
    job.save()


def _finish(job: _Job, fleet: Fleet, interrupted: bool) -> None:
    """Teardown (verify), wait for the supervisors' last words, collect, write job.json."""
    watch, plan = job.watch, job.plan
    job.state.stopping = True
    if plan is None or watch is None:  # never launched: nothing runs anywhere
        if job.state.status.live:
            job.state.status = JobStatus.INTERRUPTED if interrupted else JobStatus.ERROR
            job.sync()
        job.result.ended = time.time()
        job.save()
        return
    if job.options.detach and job.result.status == JobStatus.RUNNING and not interrupted:
        job.launch_done.wait(35.0)
        _drain(job)
        if all(n.state == NodeState.RUNNING for n in job.result.nodes):
            # Detached and running everywhere: the supervisors own the job now; `fleetctl
            # stop/collect JOB` end it and bring the logs home.
            watch.close()
            job.save()
            job.emit("done", "detached", log=True)
            return
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
        _drain(job)
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
    _drain(job)
    for node in job.result.nodes:
        if node.state == NodeState.PENDING and node.rank not in watch.runs:
            node.state = job.state.end(node.rank, NodeState.START_FAILED, time.time()).state
    job.state.settle(interrupted=interrupted, external=EXTERNAL_STOP_REASON)
    job.sync()
    try:
        _collect(job, fleet, {watch.runs[r].node.name: watch.runs[r].stream for r in in_band})
    except KeyboardInterrupt:
        job.result.errors.append("log collection interrupted")
    finally:
        for r in in_band:  # collected or not, nothing more to say on these channels
            with contextlib.suppress(Exception):
                watch.runs[r].stream.close()
    job.result.ended = time.time()
    job.save()
    job.emit("done", job.result.status, log=True)


def _drain(job: _Job) -> None:
    assert job.watch is not None
    while True:
        ev = job.watch.get(0.0)
        if ev is None:
            return
        _on_event(job, ev)


def _lost_hosts(job: _Job) -> set[str]:
    return {n.host for n in job.result.nodes if n.state == NodeState.LOST}


def _teardown(job: _Job, fleet: Fleet, *, hard: bool) -> None:
    from fleetctl.phases.teardown import teardown

    assert job.watch is not None and job.plan is not None
    job.watch.stop_nodes(hard=hard)  # instant: over the supervisors' own channels
    # Starts still in flight must finish (or fail) so that teardown sees every started job.
    job.launch_done.wait(35.0)
    job.watch.stop_nodes(hard=hard)
    _drain(job)
    grace = 0.0 if hard else job.options.grace
    running = [n for n in job.result.nodes if n.state == NodeState.RUNNING]
    if running:
        job.emit(
            "teardown",
            f"stopping the job on {len(job.result.nodes)} node(s)"
            + (f" (grace {grace:g}s)" if grace else " (no grace)"),
        )
        # The supervisors got the stop over their channels: each reports its job's end with
        # its own scan for leftovers. Wait for those (bounded); only the nodes that do not
        # answer in time get a remote stop command.
        job.watch.wait_ended(grace + 3.0)
        _drain(job)
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


def _collect(job: _Job, fleet: Fleet, streams: dict[str, Stream] | None = None) -> None:
    from fleetctl.phases.collect import collect

    assert job.plan is not None
    lost = _lost_hosts(job)
    job.emit("phase", f"collecting logs into {job.folder.path}")
    results = collect(
        fleet, job.plan, job.folder.path, pythons=job.pythons, skip=lost, streams=streams
    )
    job.result.collected = results
    for c in results:
        node = job.result.nodes[c.rank]
        node.folder = c.folder
        node.collected = c.error is None and c.skipped is None
        if c.error:
            job.emit("warning", f"logs not collected: {c.error}", rank=c.rank)
        if c.refused:
            job.emit(
                "warning",
                f"refused unsafe names in the node's log archive: {', '.join(c.refused[:5])}",
                rank=c.rank,
            )
        if not node.collected:  # keep what streamed, so the folder always has the console
            with contextlib.suppress(OSError):
                job.folder.write_streamed_console(node.rank, node.host, node.tail)
