"""The state one ``fleetctl run`` attempt shares between its phases, and the one place where a
watcher event becomes a state change (``on_event``): ``run``, ``prepare`` and ``finish`` all
feed it, so the state machine has a single entry."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, BinaryIO

from fleetctl.errors import RunFolderError
from fleetctl.job.monitor.decide import ranks_ended_cleanly
from fleetctl.job.monitor.supervisors import EXTERNAL_STOP_REASON
from fleetctl.job.records.result import EventKind, JobEvent, JobPhase, JobResult, NodeOutcome
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.job.records.state import NODE_STOPPED, JobState, NodeState, exit_state

if TYPE_CHECKING:
    from fleetctl.job.diagnose.pace import GroupJudges, SlowVerdict
    from fleetctl.job.diagnose.progress_rate import ProgressJudge
    from fleetctl.job.run.job import RunOptions
    from fleetctl.node import Node
    from fleetctl.phases.check.report import HeldProbe
    from fleetctl.phases.watch import Event, Watch
    from fleetctl.plan.rankplan import JobSpec, Plan


SAVE_EVERY = 0.5  # seconds between routine job.json writes while nodes start and end


class JobContext:
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
        self._saved_at, self._dirty = 0.0, False  # job.json: last write, a write pending
        self.write_connect()
        self.result = JobResult(
            job_id=spec.job_id,
            folder=self.folder.path,
            launcher=spec.launcher,
            attempt=options.attempt,
            detached=options.detach,
            left_out=options.left_out,
            # run --elastic: who left, who joined (fleetctl.job.run.elastic); `status` lists members
            membership=[] if options.elastic else None,
        )
        slurm_job = next(
            (n.vars["fleetctl_slurm_job"] for n in nodes if "fleetctl_slurm_job" in n.vars), None
        )
        if slurm_job is not None:  # run inside an allocation: `status`/`stop` find it by this
            self.result.slurm = {"job_id": str(slurm_job)}
            if self.folder.load_slurm() is not None:  # adopted from `run --slurm`: its record
                self.result.executor = "sbatch"
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
        # node -> its probe, held on its channel by the check for the launch (release_held)
        self.held: dict[str, HeldProbe] = {}
        self.state = JobState(len(self.nodes), options.completion)
        # the live FAILED FIRST line, held until the first failure is settled (failure_line)
        self._failure_lock = threading.Lock()
        self._failure_due: float | None = None  # monotonic; None: no line held
        self._failure_timer: threading.Timer | None = None
        self._failure_said: int | None = None  # the rank the last line named
        self.progress = time.monotonic()  # last output line or progress once the job began
        # when a node first said the job's own start-up is over (its supervisor's ``P``: a
        # rank's first line, or a progress touch); None: starting up (--startup-timeout)
        self.begun: float | None = None
        # a node of a plain job succeeded: its peers' silence is shut-down (past_limit)
        self.finishing = False
        self.spools: dict[int, BinaryIO | None] = {}  # rank -> its streamed lines on disk
        self.observer = options.observer  # metrics: told every event (fleetctl.job.monitor.metrics)
        if self.observer is not None:
            nproc = spec.procs if isinstance(spec.procs, int) else 0
            self.observer.attempt(spec.job_id, options.attempt, [n.name for n in nodes], nproc)
        self.pace: GroupJudges | None = None  # the slow-node judge, made at launch (--on-slow)
        # the progress-rate judge (nodes that progress independently), made with it
        self.progress_judge: ProgressJudge | None = None
        self.roles: dict[int, str] | None = None  # role jobs: node rank -> its role
        # every rank's py-spy samples by node rank (phases.stacks.sample_stacks), set at launch
        self.sample_stacks: Callable[[], dict[int, dict[str, Any]]] | None = None
        self.slow_pending: SlowVerdict | None = None  # named; its stack evidence on the way

    def take_held(self, host: str) -> HeldProbe | None:
        return self.held.pop(host, None)

    def release_held(self) -> None:
        """Let every held probe the launch did not use go (EOF: it exits)."""
        from fleetctl.phases.check.report import release_probes

        held, self.held = self.held, {}
        release_probes(held.values())

    def spool(self, rank: int, lines: Sequence[str]) -> None:
        """Append a node's streamed lines to its ``console.streamed.log`` as they arrive
        (bounded memory: nothing but the 200-line tail stays in RAM). A write error stops
        this node's copy and is recorded, never raised into the watch."""
        f = self.spools.get(rank)
        if f is None and rank not in self.spools:
            node = self.result.nodes[rank]
            try:
                f = self.folder.open_streamed_console(rank, node.host)
            except OSError as e:
                self.result.errors.append(f"{node.host}: cannot keep the streamed log: {e}")
            self.spools[rank] = f
        if f is None:
            return
        try:
            f.write(("\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
        except OSError as e:
            node = self.result.nodes[rank]
            self.result.errors.append(f"{node.host}: streamed log incomplete: {e}")
            with contextlib.suppress(OSError):
                f.close()
            self.spools[rank] = None

    def close_spools(self, keep: set[int]) -> None:
        """Close every streamed log; those not in ``keep`` are removed (the node's own
        console.log came home whole, so the copy would only double the disk use)."""
        for rank, f in self.spools.items():
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
            if rank not in keep:
                with contextlib.suppress(OSError):
                    self.folder.drop_streamed_console(rank, self.result.nodes[rank].host)
        self.spools = {r: None for r in self.spools}

    @property
    def stopping(self) -> bool:
        return self.state.stopping

    def write_connect(self) -> None:
        """connect.json: how `fleetctl status/logs/stop JOB` reach the job's nodes (again
        when a spare took a lost node's place, run --elastic)."""
        from fleetctl.job.records.runs import nodes_as_reached, write_connect

        options = self.options
        with contextlib.suppress(OSError):
            write_connect(
                self.folder.path,
                nodes_as_reached(self.nodes, options.settings),
                inventory=options.inventory,
                limit=options.limit,
                collect=options.collect.to_dict() if options.collect else None,
            )

    def sync(self) -> None:
        """The state machine's verdict into the result (what job.json and the CLI show)."""
        r, st = self.result, self.state
        r.status, r.first_failure, r.failure_time = st.status, st.first_failure, st.failure_time
        r.verdict = st.verdict

    def emit(
        self,
        kind: EventKind,
        text: str = "",
        *,
        rank: int | None = None,
        code: int | None = None,
        log: bool = True,
        ts: float | None = None,
        lines: tuple[str, ...] = (),
        phase: JobPhase | None = None,
    ) -> None:
        host = self.result.nodes[rank].host if rank is not None else None
        ev = JobEvent(kind, text, rank, host, code, ts or time.time(), lines, phase)
        if kind == "phase":
            self.result.mark_phase(text, ev.time)
        if log and kind not in ("line", "lines"):
            where = f"[{rank} {host}] " if rank is not None else ""
            with contextlib.suppress(OSError):
                self.folder.event(f"{kind} {where}{text}".rstrip(), ev.time)
        if self.observer is not None:
            self.observer.event(ev, self.result.nodes, self.state.status)
        self._emit_cb(ev)

    def failure_line(self, *, hold: bool = False, now: bool = False) -> None:
        """The live ``failure`` event (FAILED FIRST), once per first-failure rank. ``hold``: a
        first failure just came: its line waits until a loss is declared (``now``), every node
        ended, or ``lost_timeout`` passed (a timer says it then) — a peer whose collective
        broke first is otherwise named, then the node lost before it, and the summary says
        the second. Without ``hold``/``now`` it says a held line whose time has come."""
        with self._failure_lock:
            if hold and self._failure_due is None:
                wait = max(0.0, self.options.supervision.lost_timeout)
                self._failure_due = time.monotonic() + wait
                self._failure_timer = threading.Timer(wait, self.failure_line, kwargs={"now": True})
                self._failure_timer.daemon = True
                self._failure_timer.start()
            if self._failure_due is not None and not now:
                settled = all(n.state.ended for n in self.result.nodes)
                if not settled and time.monotonic() < self._failure_due:
                    return
            self._failure_due = None
            if self._failure_timer is not None:
                self._failure_timer.cancel()
                self._failure_timer = None
            node = self.result.failed_node
            if node is None or node.rank == self._failure_said:
                return
            self._failure_said = node.rank
            self.emit("failure", node.how(), rank=node.rank)

    def save(self, *, soon: bool = False) -> None:
        """Write job.json. ``soon``: a routine node start or exit, written at most every
        SAVE_EVERY seconds (``flush`` writes what is pending): one write per event made a
        128-node job rewrite its whole record 256 times."""
        if soon and time.monotonic() - self._saved_at < SAVE_EVERY:
            self._dirty = True
            return
        self._dirty, self._saved_at = False, time.monotonic()
        record = self.result.to_record()  # a value of the wrong type is a bug: never hidden
        with contextlib.suppress(OSError, RunFolderError), self.folder.locked():
            self.folder.write_job(record)

    def flush(self) -> None:
        """Write job.json if a throttled save is pending and its time has come."""
        if self._dirty and time.monotonic() - self._saved_at >= SAVE_EVERY:
            self.save()


def on_event(job: JobContext, ev: Event) -> None:
    """Feed a watcher event to the job's state machine, record it in the result, pass it on."""
    node, state = job.result.nodes[ev.rank], job.state
    if ev.kind == "progress":
        job.progress = time.monotonic()
        if job.begun is None:
            job.begun = job.progress
        if job.observer is not None:
            progress = JobEvent("progress", rank=ev.rank, host=node.host, time=ev.time)
            job.observer.event(progress, job.result.nodes, state.status)
        return
    if ev.kind == "lines":
        if job.begun is not None:  # before: a launcher's own lines, not the job's progress
            job.progress = time.monotonic()
        node.tail.extend(ev.lines)
        job.spool(ev.rank, ev.lines)
        job.emit("lines", rank=ev.rank, ts=ev.time, lines=ev.lines)
        if job.progress_judge is not None and job.result.slow is None:
            verdict = job.progress_judge.lines(ev.rank, ev.time, ev.lines)
            if verdict is not None:
                _judged(job, verdict, job.progress_judge, job.pace)
        return
    if ev.kind == "pace":
        if job.pace is not None and ev.report is not None:
            rounds = job.pace.count
            verdict = job.pace.add(ev.rank, ev.report)
            if job.observer is not None and job.pace.count != rounds:  # a round ended
                job.observer.slow_scores(job.pace.scores())
            if verdict is not None:
                _judged(job, verdict, job.pace, job.progress_judge)
        return
    if ev.kind == "ranks_ended":  # its launcher's shut-down is silent: a node's end, for the
        job.progress = time.monotonic()  # stall clock (as ``limit_reached`` for a detached job)
        job.begun = job.begun or job.progress
        if ranks_ended_cleanly(ev.report) and job.options.completion is None:
            job.finishing = True
        return
    if ev.kind == "stacks":  # the named node's py-spy evidence came back (slow_node)
        slow_evidence(job, ev.report or {})
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
        job.save(soon=True)
        return
    node.end_time = ev.time
    if job.progress_judge is not None:  # an ended node's silence is no slowness
        job.progress_judge.end(ev.rank)
    if ev.kind == "exit":
        node.leftovers = ev.report
        code = ev.code if ev.code is not None else 255
        node.exit_code, node.signal = (code, None) if code >= 0 else (None, -code)
        # The node's own word beats our arrival order: had a stop reached it before its
        # launcher ended (our teardown's doing), and when did it end (its clock)?
        report = ev.report or {}
        if isinstance(report.get("problem"), str):  # e.g. "disk full on <run dir>"
            node.problem = report["problem"]
            node.reason = node.reason or node.problem
        if isinstance(report.get("node_stop"), str):  # a shutdown or reboot there: its failure
            node.reason = node.reason or f"{NODE_STOPPED}{report['node_stop']}"
        stopped = report.get("stop_asked", state.stopping)
        when = report.get("ended_at") if isinstance(report.get("ended_at"), float) else ev.time
        change = state.end(ev.rank, exit_state(code, stopping=bool(stopped)), when)
        node.state = change.state
        job.progress = time.monotonic()  # an end moves the job: the stall clock restarts
        job.begun = job.begun or job.progress
        if change.state is NodeState.SUCCEEDED and job.options.completion is None:
            job.finishing = True  # its peers are shutting down (or finishing their part)
        job.emit("exit", node.how(), rank=ev.rank, code=code, ts=ev.time)
    elif ev.kind == "lost":
        node.reason = ev.text
        # it failed when it went silent, not when the timeout ran out: a peer that failed in
        # between (its collective broke) is its victim, not the first failure
        node.end_time = ev.heard if ev.heard is not None else ev.time
        change = state.end(ev.rank, NodeState.LOST, node.end_time)
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
    job.failure_line(hold=change.first_failure, now=ev.kind == "lost")
    # a routine end waits for the next throttled write; a first failure or a completed job
    # is written at once (Transition.first_failure is a bool: `is None` made every end routine
    # write, 64 whole-record writes for a 64-node job's exits)
    job.save(soon=not change.first_failure and change.completed is None)


def drain(job: JobContext) -> None:
    assert job.watch is not None
    while True:
        ev = job.watch.get(0.0)
        if ev is None:
            return
        on_event(job, ev)


def _judged(job: JobContext, verdict: SlowVerdict, judge: Any, other: Any) -> None:
    """A verdict of one of the two judges (the pace judge's, the progress-rate judge's): it
    lands unless a node was named already, or the other judge suspects another node in its
    window — then nobody is named and both judge on (docs/health.md: they never
    contradict each other)."""
    if job.result.slow is not None:
        return
    if other is not None and other.suspects() - {verdict.rank}:
        judge.withdraw()
        return
    slow_node(job, verdict)


def slow_node(job: JobContext, verdict: SlowVerdict) -> None:
    """The one place a slow-node verdict lands: into the result (job.json, the summary, the
    health ledger's input) and a live warning at once; then every rank is sampled with py-spy
    in the background (never holding up the watch) and :func:`slow_evidence` adds the shares.
    With ``--on-slow stop`` the job ends once they are in (or failed): the node named its
    first failure and culprit, so a retry with spares leaves it out."""
    verdict = verdict.at_launch(job.result.started, time.time())  # ``seconds``: launch to here
    job.result.slow = verdict.to_dict()
    job.emit("warning", verdict.line(), rank=verdict.rank)
    _remember_slow(job, verdict)
    sample, watch = job.sample_stacks, job.watch
    if sample is None or watch is None or verdict.progress is not None:
        # a node named by its progress: its peers wait for nobody, so py-spy's "where the
        # peers wait" has nothing to say; its figures are the evidence
        _stop_for_slow(job, verdict)
        return
    job.slow_pending = verdict

    def run() -> None:
        from fleetctl.errors import one_line
        from fleetctl.phases.watch import Event

        try:
            replies: dict[str, Any] = {"replies": sample()}
        except Exception as e:  # the verdict stands without its stacks
            replies = {"error": one_line(e)}
        watch.events.put(Event("stacks", verdict.rank, verdict.host, time.time(), report=replies))

    threading.Thread(target=run, daemon=True, name="slow-stacks").start()
    job.save()


def slow_evidence(job: JobContext, report: dict[str, Any]) -> None:
    """py-spy's samples of every rank (``report``: ``replies`` by node rank, or ``error``)
    into the pending verdict: its ``why`` and ``line`` in the result, a live notice; then the
    stop it waited for, if any."""
    from fleetctl.job.diagnose.slowstacks import from_replies

    verdict, job.slow_pending = job.slow_pending, None
    if verdict is None:
        return
    stacks = from_replies(verdict.rank, {n.rank: n.host for n in job.result.nodes}, report)
    verdict = verdict.with_stacks(stacks)
    job.result.slow = verdict.to_dict()
    said = stacks.phrase()
    job.emit("notice", f"py-spy: {said or stacks.note}", rank=verdict.rank)
    _stop_for_slow(job, verdict)


def _stop_for_slow(job: JobContext, verdict: SlowVerdict) -> None:
    if job.options.supervision.on_slow == "stop" and job.state.slow(verdict.rank, time.time()):
        node = job.result.nodes[verdict.rank]
        node.reason = f"slow: {verdict.why}"
        job.result.culprits = [*(job.result.culprits or []), f"{node.host}: slow: {verdict.why}"]
        job.sync()
        job.emit("failure", f"{verdict.line()}; stopping the job", rank=verdict.rank)
        job._failure_said = verdict.rank  # the FAILED FIRST line is said
    job.save()


def _remember_slow(job: JobContext, verdict: SlowVerdict) -> None:
    """The slow node into the health ledger (``job.monitor.slowwatch.remember_slow``)."""
    from fleetctl.job.monitor.slowwatch import remember_slow

    host = job.result.nodes[verdict.rank].host
    trouble = remember_slow(host, job.result.job_id, verdict.line())
    if trouble is not None:
        job.emit("warning", trouble)
