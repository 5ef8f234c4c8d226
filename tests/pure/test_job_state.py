"""The job state machine (fleetctl.job.records.state): one golden table of node ends → the job's
fate, and the detached monitor's decision agreeing with it on the same ends."""

from __future__ import annotations

import pytest

from fleetctl.job.monitor.decide import WatchState, decide
from fleetctl.job.monitor.supervisors import NodeReport
from fleetctl.job.records.state import JobState, JobStatus, NodeState, exit_state
from fleetctl.plan.roles import CompletionPolicy

S, F, L, X = NodeState.SUCCEEDED, NodeState.FAILED, NodeState.LOST, NodeState.START_FAILED
PS = CompletionPolicy(roles=("ps", "worker", "worker"), min_failed={"worker": 2, "ps": 1})
WORKERS_DONE = CompletionPolicy(
    roles=("ps", "worker", "worker"), min_succeeded={"worker": 2}, min_failed={"ps": 1}
)

# (name, nodes, policy, ends in time order as (rank, state), first failure, final status)
GOLDEN = [
    ("all succeed", 3, None, [(0, S), (1, S), (2, S)], None, JobStatus.SUCCEEDED),
    ("first bad end fails the job", 3, None, [(0, S), (2, F), (1, F)], 2, JobStatus.FAILED),
    ("a lost node fails the job", 2, None, [(1, L), (0, F)], 1, JobStatus.FAILED),
    ("could not start fails the job", 2, None, [(0, X)], 0, JobStatus.FAILED),
    ("min_failed tolerates one worker", 3, PS, [(1, F), (0, S), (2, S)], None, JobStatus.SUCCEEDED),
    ("min_failed reached by the second", 3, PS, [(1, F), (2, L)], 2, JobStatus.FAILED),
    ("the ps role fails at once", 3, PS, [(0, F)], 0, JobStatus.FAILED),
]


@pytest.mark.parametrize(
    ("nodes", "policy", "ends", "first", "status"),
    [case[1:] for case in GOLDEN],
    ids=[case[0] for case in GOLDEN],
)
def test_node_ends_give_the_job_its_first_failure_and_status(
    nodes: int,
    policy: CompletionPolicy | None,
    ends: list[tuple[int, NodeState]],
    first: int | None,
    status: JobStatus,
) -> None:
    machine = JobState(nodes, policy)
    machine.launch()
    for rank in range(nodes):
        machine.start(rank)
    firsts = []
    for t, (rank, state) in enumerate(ends):
        if machine.end(
            rank,
            exit_state(0 if state is S else 1, stopping=machine.stopping)
            if state in (S, F)
            else state,
            float(t),
        ).first_failure:
            firsts.append(rank)
    assert firsts == ([] if first is None else [first])
    assert machine.first_failure == first
    for rank in range(nodes):  # whatever still runs is stopped by the teardown
        if not machine.states[rank].ended:
            machine.end(rank, NodeState.STOPPED)
    assert machine.settle() is status


def test_after_the_first_failure_the_others_end_as_stopped_not_failed() -> None:
    machine = JobState(3)
    machine.launch()
    assert machine.end(1, exit_state(1, stopping=machine.stopping)).first_failure
    assert exit_state(-15, stopping=machine.stopping) is NodeState.STOPPED
    assert exit_state(0, stopping=machine.stopping) is NodeState.SUCCEEDED


def test_min_succeeded_completes_a_role_job_early_and_stops_the_rest() -> None:
    machine = JobState(3, WORKERS_DONE)
    machine.launch()
    assert machine.end(1, S).completed is None
    change = machine.end(2, S)
    assert change.completed == "2 task(s) of role 'worker' succeeded"
    assert machine.stopping and machine.status is JobStatus.SUCCEEDED
    machine.end(0, NodeState.STOPPED)
    assert machine.settle() is JobStatus.SUCCEEDED


def test_interrupt_and_an_external_stop_end_as_interrupted_unless_a_node_failed_first() -> None:
    reason = "stopped by `fleetctl stop`"
    machine = JobState(2)
    machine.launch()
    machine.stop_requested(reason)
    machine.end(0, NodeState.STOPPED)
    machine.end(1, NodeState.STOPPED)
    assert machine.settle(external=reason) is JobStatus.INTERRUPTED
    failed = JobState(2)
    failed.launch()
    failed.end(0, F)
    failed.stop_requested(reason)
    assert failed.settle(external=reason) is JobStatus.FAILED
    assert JobState(1).settle(interrupted=True) is JobStatus.INTERRUPTED


def _report(rank: int, state: NodeState, t: float) -> NodeReport:
    if state is S:
        return NodeReport(rank, f"n{rank}", "exited", exit_code=0, end_time=t)
    if state is F:
        return NodeReport(rank, f"n{rank}", "exited", exit_code=1, end_time=t)
    return NodeReport(rank, f"n{rank}", "lost", end_time=t)


@pytest.mark.parametrize(
    ("nodes", "policy", "ends", "first", "status"),
    [case[1:] for case in GOLDEN if all(s in (S, F, L) for _, s in case[3])],
    ids=[case[0] for case in GOLDEN if all(s in (S, F, L) for _, s in case[3])],
)
def test_the_detached_monitor_decides_as_the_attached_run_does(
    nodes: int,
    policy: CompletionPolicy | None,
    ends: list[tuple[int, NodeState]],
    first: int | None,
    status: JobStatus,
) -> None:
    """All ends seen in one poll (the monitor's worst case): same first failure, same status."""
    times = {rank: 100.0 + t for t, (rank, _) in enumerate(ends)}
    states = {rank: s for rank, s in ends}
    reports = [
        _report(r, states[r], times[r])
        if r in states
        else NodeReport(r, f"n{r}", "running", processes=[1])
        for r in range(nodes)
    ]
    d, _ = decide(reports, WatchState(), 200.0, lost_after=60, policy=policy)
    if first is not None:
        assert d is not None and d.action == "fail" and d.rank == first
    elif len(ends) == nodes:
        assert d is not None and d.action == "done" and d.status == str(status)
    else:
        assert d is None


def test_a_timeout_or_stall_fails_the_job_without_naming_a_node_and_only_once() -> None:
    machine = JobState(2)
    machine.launch()
    assert machine.give_up("timed out after 4 s")
    assert not machine.give_up("stalled")  # already stopping: the first reason stands
    machine.end(0, exit_state(-15, stopping=machine.stopping))
    machine.end(1, exit_state(-15, stopping=machine.stopping))
    assert machine.states == [NodeState.STOPPED, NodeState.STOPPED]
    assert machine.first_failure is None and machine.verdict == "timed out after 4 s"
    assert machine.settle() is JobStatus.FAILED
    failed = JobState(2)
    failed.end(1, F)
    assert not failed.give_up("timed out")  # a node failed first: that is the story


def test_a_rank_our_stack_dump_aborts_after_a_stall_is_not_the_first_failure() -> None:
    """Without py-spy on a node, the stalled job's ranks are dumped by faulthandler and end
    with SIGABRT before the stop reached their supervisor (seen on a shared home): our doing."""
    machine = JobState(3)
    machine.launch()
    assert machine.give_up("stalled: no progress on any node for 6 s")
    assert not machine.end(2, exit_state(-6, stopping=False), 10.0).first_failure
    machine.end(0, exit_state(1, stopping=True), 10.5)
    machine.end(1, NodeState.LOST, 11.0)  # a lost node is still told apart
    assert machine.states == [NodeState.STOPPED, NodeState.LOST, NodeState.STOPPED]
    assert machine.first_failure is None and machine.verdict.startswith("stalled")
    assert machine.settle() is JobStatus.FAILED


def test_a_bad_end_reported_late_but_ended_first_is_the_first_failure() -> None:
    """Node 2's report arrives first (its peer died under it), node 1's later — but node 1
    ended first, on its own (its supervisor had not been told to stop): node 1 is to blame."""
    machine = JobState(3)
    machine.launch()
    assert machine.end(2, exit_state(1, stopping=False), 10.5).first_failure
    assert machine.first_failure == 2 and machine.stopping
    late = machine.end(1, exit_state(1, stopping=False), 10.2)  # its node: no stop had come
    assert late.first_failure and machine.first_failure == 1 and machine.failure_time == 10.2
    assert machine.states == [NodeState.PENDING, NodeState.FAILED, NodeState.FAILED]
    # a node our teardown stopped never takes the blame, whatever its clock says
    assert not machine.end(0, exit_state(-15, stopping=True), 9.0).first_failure
    assert machine.first_failure == 1 and machine.settle() is JobStatus.FAILED


# A lost node's loss against a peer's failed rank (issue 28): node 2 was last heard at 10.0
# (its failure time); (name, how node 0 ended, when its launcher ended, when its rank failed
# by its node's clock, which node is the first failure after ``blame``).
LOST_BLAME = [
    # links cut: the peers hang in a collective until our stop ends them (their ranks ended
    # after the stop reached them: ranks.rank_exits drops those, so no time at all)
    ("cut link: peers stopped by us", NodeState.STOPPED, 15.0, None, 2),
    # host crashed: a peer's collective broke at once, its launcher ended first
    ("crash: a peer failed after the silence", F, 10.3, 10.1, 2),
    ("crash: the peer's rank failed at the very moment", F, 10.3, 10.0, 2),
    # a rank elsewhere had failed before node 2 went silent: that rank is the culprit
    ("a peer failed before the silence", F, 10.3, 9.5, 0),
]


@pytest.mark.parametrize(
    ("peer", "peer_end", "rank_failed", "first"),
    [case[1:] for case in LOST_BLAME],
    ids=[case[0] for case in LOST_BLAME],
)
def test_a_lost_node_keeps_the_blame_unless_a_rank_failed_before_it_went_silent(
    peer: NodeState, peer_end: float, rank_failed: float | None, first: int
) -> None:
    for lost_reported_first in (True, False):
        machine = JobState(3)
        machine.launch()
        for rank in range(3):
            machine.start(rank)
        firsts = []
        ends = [(2, L, 10.0), (0, peer, peer_end), (1, NodeState.STOPPED, 15.0)]
        if not lost_reported_first:  # the crash: the peer's exit arrives before the loss
            ends = [ends[1], ends[0], ends[2]]
        for rank, state, when in ends:
            if machine.end(rank, state, when).first_failure:
                firsts.append(rank)
        # whichever arrived first, the loss (silent since 10.0) ends up the first failure
        assert machine.first_failure == 2 and machine.failure_time == 10.0
        assert firsts[-1] == 2
        machine.blame(0, rank_failed)
        assert machine.first_failure == first
        assert machine.states[first] is (L if first == 2 else F)
        assert machine.settle() is JobStatus.FAILED


def test_the_loss_counts_from_when_the_node_was_last_heard_not_when_it_was_declared() -> None:
    """The attached run feeds the watcher's ``lost`` event through ``on_event``: the node's
    failure time and end time are when it was last heard from, and a peer's exit reported
    before the loss gives way to it. The live ``failure`` line waits for the loss (held while
    a node may still be lost): one line, naming the node the summary names."""
    import tempfile

    from fleetctl.job.run.context import JobContext, on_event
    from fleetctl.job.run.job import RunOptions
    from fleetctl.node import Node
    from fleetctl.phases.watch import Event
    from fleetctl.plan.rankplan import JobSpec

    events: list = []
    with tempfile.TemporaryDirectory() as tmp:
        nodes = [Node(name=f"node{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)]
        job = JobContext(
            JobSpec(script="t.py", job_id="j1"), nodes, RunOptions(runs_dir=tmp), events.append
        )
        job.state.launch()
        for rank in range(3):
            on_event(job, Event("started", rank, f"node{rank + 1}", 1.0))
        # node 1's collective broke when node 3 died; its exit arrives first
        report = {"ended_at": 10.3, "stop_asked": False, "found": [], "killed": []}
        on_event(job, Event("exit", 0, "node1", 10.4, code=1, report=report))
        assert job.result.first_failure == 0
        on_event(job, Event("lost", 2, "node3", 15.0, "no heartbeat for 5.0s", heard=10.0))
        assert job.result.first_failure == 2 and job.result.failure_time == 10.0
        assert job.result.nodes[2].end_time == 10.0
        live = [e.rank for e in events if e.kind == "failure"]
        assert live == [2]
