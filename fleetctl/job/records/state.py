"""The job state machine, written once: node and job states, transitions, the first failure,
the completion policy's say, and the final verdict.

The attached run (``fleetctl.job.run.job``), the detached job monitor
(``fleetctl.job.monitor.watch``) and the lifecycle commands that finalise a job from the nodes'
records (``fleetctl.job.monitor.handle``) all feed what they learn — a node started, exited, was
lost, could not start — into a :class:`JobState` and read the job's fate back from it, so "who
failed first" and "how did the job end" mean the same thing whichever process watched the job. Pure:
no I/O, no clocks (times are passed in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.plan.roles import CompletionPolicy


class _Str(str, Enum):
    """A state that is also its JSON string (``"running"``), so records stay plain JSON."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class NodeState(_Str):
    """One node's part of the job."""

    PENDING = "pending"  # planned, not started (yet)
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # exit code 0
    FAILED = "failed"  # non-zero exit or a signal, on its own
    STOPPED = "stopped"  # ended by our teardown (a peer failed, stop, Ctrl-C)
    LOST = "lost"  # stopped answering; its dead-man switch or the monitor stops it
    START_FAILED = "start_failed"  # the job could not start there
    LEFT = "left"  # lost, and the job went on without it (run --elastic --min-nodes)

    @property
    def ended(self) -> bool:
        return self not in (NodeState.PENDING, NodeState.RUNNING)

    @property
    def bad(self) -> bool:
        """An end that fails the job (unless the completion policy tolerates it)."""
        return self in BAD


BAD = frozenset({NodeState.FAILED, NodeState.LOST, NodeState.START_FAILED})
# A failed node's reason when the node itself stopped the job (its supervisor's reason follows,
# as the monitor says it): "supervisor got SIGTERM" is a shutdown or reboot there, not our stop.
NODE_STOPPED = "stopped on the node: "
NODE_STOP = NODE_STOPPED + "supervisor got SIG"


class JobStatus(_Str):
    """The whole job, as job.json's ``status`` says."""

    STARTING = "starting"  # connect, check, push, plan
    RUNNING = "running"
    DETACHED = "detached"  # shown for a live detached job (job.json keeps ``running``)
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # `fleetctl stop` ended it
    INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM of the attached run
    ERROR = "error"  # never launched: check, push or plan failed

    @property
    def live(self) -> bool:
        return self in LIVE


LIVE = frozenset({JobStatus.STARTING, JobStatus.RUNNING, JobStatus.DETACHED})
LIVE_STATES = frozenset(s.value for s in LIVE)  # for records read back as plain strings
#: what an attempt that ran ends as (``queued``/``cancelled``: a submitter's, never ran)
ENDED_STATES = frozenset(s.value for s in JobStatus if s not in LIVE)


def node_state(text: object) -> NodeState:
    """A recorded node state (unknown → pending: it proves nothing ended)."""
    try:
        return NodeState(str(text))
    except ValueError:
        return NodeState.PENDING


def job_status(text: object) -> JobStatus | None:
    try:
        return JobStatus(str(text))
    except ValueError:
        return None


def exit_state(code: int, *, stopping: bool) -> NodeState:
    """The state an exit code (``-signal`` for a signal) gives a node: once the job is being
    stopped, a non-zero end is our own teardown's doing, not a failure."""
    if code == 0:
        return NodeState.SUCCEEDED
    return NodeState.STOPPED if stopping else NodeState.FAILED


@dataclass(frozen=True)
class Transition:
    """What one node's end did to the job."""

    state: NodeState
    first_failure: bool = False  # this node failed first: the job fails, stop the rest
    tolerated: bool = False  # a bad end the completion policy's min_failed allows
    completed: str | None = None  # the completion policy ended the job early: why


class JobState:
    """Node states in rank order plus the job's status, first failure and stop flag.

    ``end`` is the one transition that matters: it records a node's end, asks the completion
    policy (role jobs' ``min_failed``/``min_succeeded``) and names the first failure. The
    caller stops the other nodes when ``stopping`` turns true.
    """

    def __init__(
        self,
        n: int,
        policy: CompletionPolicy | None = None,
        states: Sequence[NodeState] | None = None,
    ) -> None:
        self.states: list[NodeState] = list(states) if states else [NodeState.PENDING] * n
        self.policy = policy
        self.status = JobStatus.STARTING
        self.first_failure: int | None = None
        self.failure_time: float | None = None
        self.verdict: str | None = None  # why the job ended early (policy, external stop)
        self.stopping = False
        self.gave_up = False  # the job failed as a whole (give_up): ends from here are ours
        self.tolerated: set[int] = set()

    def launch(self) -> None:
        self.status = JobStatus.RUNNING

    def start(self, rank: int) -> None:
        if self.states[rank] is NodeState.PENDING:
            self.states[rank] = NodeState.RUNNING

    def end(self, rank: int, state: NodeState, when: float | None = None) -> Transition:
        """Node ``rank`` ended in ``state`` at ``when``.

        Ends may be *reported* out of order (a node's report can wait on its own clean-up while
        a peer that failed because of it reports first): a bad end at an earlier ``when`` than
        the first failure so far becomes the first failure — the earliest bad end is the one to
        blame, as the monitor decides too.
        """
        if self.gave_up and state is NodeState.FAILED:
            # Our doing: the stop, or a stack dump's faulthandler abort (no py-spy on the node)
            # that the stalled job's ranks end with. The job's failure is its verdict.
            state = NodeState.STOPPED
        self.states[rank] = state
        bad = state.bad
        tolerated = False
        if bad and self.policy is not None and not self.policy.fails_job(rank, self.states):
            bad, tolerated = False, True
            self.tolerated.add(rank)
        completed = None
        if not bad and self.policy is not None and not self.stopping:
            v = self.policy.verdict(self.states)
            if v is not None and v.status == "succeeded" and v.role is not None:
                self.status, self.verdict, self.stopping = JobStatus.SUCCEEDED, v.reason, True
                completed = v.reason
        first = False
        if bad and self.gave_up:
            pass  # the job already failed as a whole: its verdict is the story
        elif bad and self.first_failure is None:
            self.first_failure, self.failure_time = rank, when
            self.status, self.stopping, first = JobStatus.FAILED, True, True
        elif (
            bad
            and when is not None
            and self.failure_time is not None
            and when < self.failure_time
            and self.verdict is None
        ):
            self.first_failure, self.failure_time, first = rank, when, True
        return Transition(state, first, tolerated, completed)

    def blame(self, rank: int, when: float | None = None) -> bool:
        """After the fact: the node supervisors' clocks show that node ``rank``'s rank process
        failed (at ``when``) before any other, though a peer's launcher ended first (launchers
        look at their ranks every 0.1-1 s) or our stop reached the node before its launcher
        ended. That node is the first failure, and failed (not stopped). False (nothing
        changes) unless the job failed on a node's end and ``rank`` is another node that failed
        or was stopped, whose failure the completion policy does not tolerate.

        A lost first failure has no rank ends to compare (its node could not say): it keeps
        the blame unless the rank failed before that node was last heard from (its
        ``failure_time``) — a peer failing after the node went silent is its victim."""
        if (
            self.first_failure is None
            or self.first_failure == rank
            or self.verdict is not None
            or self.states[rank] not in (NodeState.FAILED, NodeState.STOPPED)
        ):
            return False
        if self.states[self.first_failure] is NodeState.LOST and (
            when is None or self.failure_time is None or when >= self.failure_time
        ):
            return False
        states = list(self.states)
        states[rank] = NodeState.FAILED
        if self.policy is not None and not self.policy.fails_job(rank, states):
            return False
        self.first_failure, self.states = rank, states
        return True

    def give_up(self, reason: str) -> bool:
        """The job as a whole failed without a node failing first (``--timeout``, a stall):
        stop every node. False when the job is already ending for another reason."""
        if self.stopping or self.first_failure is not None:
            return False
        self.status, self.stopping, self.verdict = JobStatus.FAILED, True, reason
        self.gave_up = True
        return True

    def slow(self, rank: int, when: float) -> bool:
        """``--on-slow stop``: node ``rank`` slows the job (``fleetctl.job.diagnose.pace``); it is
        the first failure and every node is stopped (the ends that follow are ours, as after
        ``give_up``). False when the job is already ending."""
        if self.stopping or self.first_failure is not None:
            return False
        self.status, self.stopping = JobStatus.FAILED, True
        self.first_failure, self.failure_time, self.gave_up = rank, when, True
        return True

    def stop_requested(self, reason: str) -> None:
        """Someone else stops the job (`fleetctl stop`): not a failure."""
        if self.first_failure is None:
            self.stopping, self.verdict = True, reason

    @property
    def all_ended(self) -> bool:
        return all(s.ended for s in self.states)

    def outcome(self) -> JobStatus:
        """How the job ended once every node ended: the first failure, else the completion
        policy's verdict, else succeeded only if every node succeeded."""
        if self.first_failure is not None:
            return JobStatus.FAILED
        if self.policy is not None:
            v = self.policy.verdict(self.states)
            if v is not None:
                return JobStatus(v.status)
        done = [s for s in self.states if s is not NodeState.LEFT]
        if done and all(s is NodeState.SUCCEEDED for s in done):
            return JobStatus.SUCCEEDED
        if NodeState.STOPPED in self.states and not any(s.bad for s in self.states):
            return JobStatus.STOPPED
        return JobStatus.FAILED

    def settle(self, *, interrupted: bool = False, external: str | None = None) -> JobStatus:
        """The final status of an attached run after teardown (nodes all ended or given up)."""
        if self.status in (JobStatus.STARTING, JobStatus.RUNNING):
            self.status = self.outcome()
            if self.status is JobStatus.STOPPED:
                self.status = JobStatus.FAILED  # an attached run's nodes stop only on failure
        if interrupted or (
            external is not None and self.verdict == external and self.first_failure is None
        ):
            self.status = JobStatus.INTERRUPTED
        return self.status
