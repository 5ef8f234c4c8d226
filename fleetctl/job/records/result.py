"""What one run of a job produced: its events as the CLI sees them, every node's outcome, and
the job's result (also job.json's shape)."""

from __future__ import annotations

import collections
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fleetctl.job.records.runfolder import iso
from fleetctl.job.records.state import NODE_STOP, JobStatus, NodeState, _Str, node_state

if TYPE_CHECKING:
    from fleetctl.job.records.jobrecord import JobRecord
    from fleetctl.phases.collect import NodeCollect
    from fleetctl.phases.teardown import TeardownReport
    from fleetctl.plan.rankplan import Plan

TAIL_LINES = 200  # per node, kept in memory for the summary when logs cannot be collected

# What a JobEvent says (its ``kind``; the same word starts its line in events.log)
EventKind = Literal[
    "phase", "line", "lines", "notice", "exit", "lost", "failure", "teardown", "collect",
    "warning", "done", "started", "progress",
]  # fmt: skip


class JobPhase(_Str):
    """A ``phase`` event's stable name, whatever its text says (``checking nodes``, ``checking
    images``: both ``check``): the metrics' ``fleetctl_job_phase`` label (docs/metrics.md) and
    what a library user switches on. A phase event without one (an attempt's start, choosing
    hosts for ``--nodes``) leaves the job in the phase it was in."""

    CONNECT = "connect"
    CHECK = "check"
    PUSH = "push"
    BEFORE = "before"  # run --before / the API's before_launch hook
    RELAY = "relay"  # run --resume: the earlier job's checkpoints
    RUN = "run"  # launched: the job runs
    POST_MORTEM = "post_mortem"  # every host checked, the proof's collective, after a failure
    COLLECT = "collect"


@dataclass(frozen=True)
class JobEvent:
    """What the CLI shows. ``kind``: an :data:`EventKind`. ``rank``/``host`` name the node for
    node events; ``lines`` holds a node's output lines that arrived together (kind ``lines``);
    ``phase``: a phase event's :class:`JobPhase` (None for other kinds, and for a phase event
    that does not change the job's phase)."""

    kind: EventKind
    text: str = ""
    rank: int | None = None
    host: str | None = None
    code: int | None = None
    time: float = field(default_factory=time.time)
    lines: tuple[str, ...] = ()
    phase: JobPhase | None = None


@dataclass
class NodeOutcome:
    """One node's part of the result (also its entry in job.json)."""

    rank: int
    host: str
    address: str
    train_addr: str | None = None
    state: NodeState = NodeState.PENDING
    exit_code: int | None = None
    signal: int | None = None
    start_time: float | None = None
    end_time: float | None = None
    reason: str | None = None
    folder: str | None = None
    collected: bool = False
    leftovers: dict[str, Any] | None = None  # the supervisor's after-exit scan (exit report)
    problem: str | None = None  # what the node itself reported: "disk full on <run dir>"
    tail: collections.deque[str] = field(
        default_factory=lambda: collections.deque(maxlen=TAIL_LINES), repr=False
    )

    @property
    def ended_badly(self) -> bool:
        return self.state.bad

    def __post_init__(self) -> None:
        self.state = node_state(self.state)  # records built from plain strings

    def how(self) -> str:
        """``exit code 1``, ``signal 9 (SIGKILL)``, ``lost (…)``, ``could not start (…)``."""
        if self.state in (NodeState.LOST, NodeState.LEFT):
            return f"{self.state} ({self.reason})" if self.reason else str(self.state)
        if self.state == NodeState.START_FAILED:
            return f"could not start ({self.reason})" if self.reason else "could not start"
        also = f"; {self.problem}" if self.problem else ""
        if self.reason and self.reason.startswith(NODE_STOP):  # a shutdown or reboot there
            also = f", {self.reason}{also}"
        if self.signal is not None:
            return f"signal {self.signal} ({_signame(self.signal)}){also}"
        if self.exit_code is not None:
            return f"exit code {self.exit_code}{also}"
        return f"{self.state}{also}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "address": self.address,
            "train_addr": self.train_addr,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "start_time": iso(self.start_time),
            "end_time": iso(self.end_time),
            "reason": self.reason,
            "problem": self.problem,
            "folder": self.folder,
            "collected": self.collected,
        }


@dataclass
class JobResult:
    """What happened: status, every node's outcome, who failed first, teardown and collect."""

    job_id: str
    folder: Path
    status: JobStatus = JobStatus.STARTING
    nodes: list[NodeOutcome] = field(default_factory=list)
    first_failure: int | None = None  # rank
    failure_time: float | None = None
    started: float | None = None  # launch began
    ended: float | None = None
    teardown: TeardownReport | None = None
    collected: list[NodeCollect] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    launcher: str | None = None
    attempt: int = 1
    plan: Plan | None = None
    detached: bool = False
    verdict: str | None = None  # why a role job ended early (completion policy)
    # With retries, on the last attempt's result: every attempt and why it ended/was retried
    # (fleetctl.job.run.rolejob.Attempt.to_dict), so `run --json` tells the whole story.
    attempts: list[dict[str, Any]] | None = None
    # A stalled job: its ranks folded by innermost frame (fleetctl.job.diagnose.stacks.StackGroup as
    # dicts), and per node how its processes were dumped.
    stacks: list[dict[str, Any]] | None = None
    stack_nodes: list[dict[str, Any]] | None = None
    # The ranks the first failing node's launcher named (fleetctl.job.diagnose.ranks.failed_ranks).
    failed_ranks: list[dict[str, Any]] | None = None
    # What a fresh check of every host found after the failure (fleetctl.job.diagnose.culprit).
    culprits: list[str] | None = None
    # The node the others waited for, or that fell behind them, named during the run
    # (fleetctl.job.diagnose.pace.SlowVerdict as a dict: rank, host, busy, peers_wait,
    # compute_ratio, throttled, rounds, why, stacks, progress, line)
    slow: dict[str, Any] | None = None
    # The post-mortem's proof: a collective among the reachable hosts after a stall, a lost
    # node or a collective timeout (fleetctl.job.diagnose.proof.Proof as a dict: hosts, unreachable,
    # cut, finding, rounds, elapsed, lines)
    post_mortem: dict[str, Any] | None = None
    # --nodes N: the hosts of the selection this attempt did not run on, and why
    left_out: dict[str, str] | None = None
    # run --resume JOB: the earlier job whose checkpoints were relayed first, and how
    # (fleetctl.phases.push.relay.RelayReport.to_dict, with its "job")
    resumed_from: dict[str, Any] | None = None
    # run --elastic: who left and who joined, when and why (fleetctl.job.run.elastic)
    membership: list[dict[str, Any]] | None = None
    # Inside a Slurm allocation: {"job_id": …} of the allocation (fleetctl.slurm)
    slurm: dict[str, Any] | None = None
    executor: str | None = None  # "sbatch": a run inside an allocation `run --slurm` made
    # Where the controller's time went: each phase's start (wall clock) and this process's CPU
    # seconds so far, its own threads and its waited-for children (rsync, ssh) apart.
    phases: list[dict[str, Any]] = field(default_factory=list)

    def proven(self) -> dict[str, str]:
        """The hosts the post-mortem's proof named, and why in a few words (the ledger's)."""
        if not self.post_mortem:  # no proof ran: its module (and the bisection's) not imported
            return {}
        from fleetctl.job.diagnose.proof import named_hosts

        return named_hosts(self.post_mortem)

    def proof_lines(self) -> list[str]:
        """The post-mortem's proof as the summary says it: its finding, then its rounds."""
        return [str(line) for line in (self.post_mortem or {}).get("lines") or []]

    def mark_phase(self, name: str, ts: float) -> None:
        import resource

        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.phases.append(
            {
                "phase": name,
                "at": iso(ts),
                "cpu": round(own.ru_utime + own.ru_stime, 3),
                "child_cpu": round(kids.ru_utime + kids.ru_stime, 3),
            }
        )

    def __post_init__(self) -> None:
        self.status = JobStatus(self.status)

    @property
    def exit_code(self) -> int:
        if self.status == JobStatus.SUCCEEDED:
            # processes left after teardown are a remote failure, and so is a node where what
            # was left could not be checked (a hung container runtime)
            if self.teardown is not None and (self.teardown.leftovers or self.teardown.unchecked):
                return 3
            return 4 if self.logs_incomplete else 0
        if self.status == JobStatus.INTERRUPTED:
            return 130
        return 3 if self.status == JobStatus.FAILED else 1

    @property
    def logs_incomplete(self) -> list[str]:
        """Hosts whose logs should be home and are not (skipped, a failed or cut transfer).
        A node the job went on without (``left``, run --elastic --min-nodes) is not one: it
        was cut off, so its logs were never coming home; the succeeded job exits 0."""
        left = {n.rank for n in self.nodes if n.state == NodeState.LEFT}
        return [c.host for c in self.collected if c.incomplete and c.rank not in left]

    def node(self, rank: int) -> NodeOutcome:
        return self.nodes[rank]

    @property
    def failed_node(self) -> NodeOutcome | None:
        return None if self.first_failure is None else self.nodes[self.first_failure]

    @property
    def failed_after(self) -> float | None:
        """Seconds from launch to the first failure."""
        if self.failure_time is None or self.started is None:
            return None
        return max(0.0, self.failure_time - self.started)

    def nccl_traces(self) -> list[str]:
        """The NCCL flight-recorder dumps collected from the nodes (a collective timed out).
        Empty before collection: job.json is written on every state change, and looking into
        every node folder each time cost a large fleet N² directory scans."""
        from fleetctl.plan.flight_recorder import NCCL_TRACE_PREFIX

        if not self.collected:
            return []
        return sorted(
            str(p)
            for node in self.nodes
            if node.folder
            for p in Path(node.folder).glob(NCCL_TRACE_PREFIX + "*")
            if p.is_file()
        )

    def log_tail(self, rank: int, n: int = 20) -> list[str]:
        """Last ``n`` lines of a node's console: the collected console.log, else what streamed
        (also when the node could not write its console.log: a full disk)."""
        node = self.nodes[rank]
        if node.folder and not node.problem:
            path = Path(node.folder) / "console.log"
            with contextlib.suppress(OSError), path.open("rb") as f:
                f.seek(max(0, f.seek(0, 2) - 256 * 1024))  # the end is enough for a tail
                return f.read().decode("utf-8", errors="replace").splitlines()[-n:]
        return list(node.tail)[-n:]

    def to_record(self) -> JobRecord:
        """job.json's record of this result (its types checked as a file's would be)."""
        from fleetctl.job.records.jobrecord import job_record

        return job_record(self.to_dict(), str(self.folder / "job.json"))

    def to_dict(self) -> dict[str, Any]:
        ff = self.failed_node
        return (
            {
                "job_id": self.job_id,
                "status": self.status,
                "attempt": self.attempt,
                "detached": self.detached,
                "verdict": self.verdict,
                "launcher": self.launcher,
                "started": iso(self.started),
                "ended": iso(self.ended),
                "duration": None
                if self.started is None or self.ended is None
                else round(self.ended - self.started, 3),
                "first_failure": None
                if ff is None
                else {
                    "rank": ff.rank,
                    "host": ff.host,
                    "address": ff.train_addr or ff.address,
                    "state": ff.state,
                    "exit_code": ff.exit_code,
                    "signal": ff.signal,
                    "reason": ff.reason,
                    "time": iso(self.failure_time),
                    "after": None if self.failed_after is None else round(self.failed_after, 3),
                },
                "nodes": [n.to_dict() for n in self.nodes],
                "teardown": None if self.teardown is None else self.teardown.to_dict(),
                "collected": [c.to_dict() for c in self.collected],
                "errors": self.errors,
                "nccl_traces": self.nccl_traces(),
                "folder": str(self.folder),
                "phases": self.phases,
            }
            | ({} if self.attempts is None else {"attempts": self.attempts})
            | ({} if not self.failed_ranks else {"failed_ranks": self.failed_ranks})
            | ({} if self.culprits is None else {"culprits": self.culprits})
            | ({} if self.slow is None else {"slow": self.slow})
            | ({} if self.post_mortem is None else {"post_mortem": self.post_mortem})
            | ({} if self.left_out is None else {"left_out": self.left_out})
            | ({} if self.resumed_from is None else {"resumed_from": self.resumed_from})
            | ({} if self.membership is None else {"membership": self.membership})
            | ({} if self.slurm is None else {"slurm": self.slurm})
            | ({} if self.executor is None else {"executor": self.executor})
            | (
                {}
                if self.stacks is None
                else {"stacks": self.stacks, "stack_nodes": self.stack_nodes}
            )
        )


def _signame(sig: int) -> str:
    import signal

    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"SIG{sig}"
