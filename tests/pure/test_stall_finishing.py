"""A job whose work is over is never stalled: once a node of a plain job succeeded, its peers'
silence is their shut-down (torchrun's exit barrier, teardown, interpreter exit print
nothing), not a hang — the attached run and a detached job's monitor alike. A node's end
restarts the stall clock; a genuine hang after it is still bounded (DEFAULT_FINISH)."""

from __future__ import annotations

from pathlib import Path

from fleetctl.api.runspec import Supervision
from fleetctl.job.monitor.decide import DEFAULT_FINISH, WatchState, limit_reached
from fleetctl.job.monitor.supervisors import NodeReport
from fleetctl.job.run.context import JobContext, on_event
from fleetctl.job.run.job import RunOptions
from fleetctl.job.run.job import limit_reached as attached_limit
from fleetctl.node import Node
from fleetctl.phases.watch import Event
from fleetctl.plan.rankplan import JobSpec
from fleetctl.plan.roles import CompletionPolicy

T0 = 1_000_000.0
ENDED_0 = {"ended_at": 20.0, "stop_asked": False, "found": [], "killed": []}


def _attached(tmp_path: Path, policy: CompletionPolicy | None = None) -> JobContext:
    """3 nodes, --stall-timeout 4, every rank's last line said; node 3 then exits 0."""
    nodes = [Node(name=f"node{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)]
    sup = Supervision(stall_timeout=4.0)
    opts = RunOptions(runs_dir=tmp_path, supervision=sup, completion=policy)
    job = JobContext(JobSpec(script="t.py", job_id="j1"), nodes, opts, lambda e: None)
    job.state.launch()
    job.launch_done.set()
    for rank in range(3):
        on_event(job, Event("started", rank, f"node{rank + 1}", 1.0))
        on_event(job, Event("progress", rank, f"node{rank + 1}", 2.0))
        on_event(job, Event("lines", rank, f"node{rank + 1}", 19.0, lines=["slow start done"]))
    on_event(job, Event("exit", 2, "node3", 20.0, code=0, report=ENDED_0))
    return job


def test_an_attached_job_whose_node_succeeded_is_not_stalled_by_its_peers_shut_down(
    tmp_path: Path,
) -> None:
    """The failure seen under load: every rank printed its last line, node3 exited 0, and
    nodes 1-2 (their launchers in shut-down) said nothing more for over 4 s."""
    job = _attached(tmp_path)
    assert attached_limit(job, job.progress - 30, now=job.progress + 10) is None
    assert attached_limit(job, job.progress - 30, now=job.progress + DEFAULT_FINISH - 1) is None
    why = attached_limit(job, job.progress - 30, now=job.progress + DEFAULT_FINISH + 1)
    assert why == "stalled finishing: a node succeeded, the others silent for 301 s"


def test_in_a_role_job_a_node_that_succeeded_restarts_the_clock_and_nothing_more(
    tmp_path: Path,
) -> None:
    """A role's node may end 0 while another role trains on: its end is progress, but the
    stall limit stays the stall limit."""
    policy = CompletionPolicy(roles=("train", "train", "prep"))  # node3: prep
    job = _attached(tmp_path, policy)
    assert attached_limit(job, job.progress - 30, now=job.progress + 3) is None
    why = attached_limit(job, job.progress - 30, now=job.progress + 5)
    assert why == "stalled: no progress on any node for 5 s"


def _reports(exited: bool) -> list[NodeReport]:
    last = NodeReport(2, "n2", "exited", exit_code=0, end_time=5.0, progress=4.0, begun=True)
    if not exited:
        last = NodeReport(2, "n2", "running", processes=[1], progress=4.0, begun=True)
    return [
        NodeReport(0, "n0", "running", processes=[1], progress=4.0, begun=True),
        NodeReport(1, "n1", "running", processes=[1], progress=4.0, begun=True),
        last,
    ]


def test_a_detached_job_whose_node_succeeded_is_not_stalled_by_its_peers_shut_down() -> None:
    kw = {"started": T0, "sup": Supervision(stall_timeout=4.0)}
    w = WatchState()
    assert limit_reached(_reports(False), w, T0 + 1, **kw) is None  # the last lines
    assert limit_reached(_reports(True), w, T0 + 3, **kw) is None  # node 2 ended 0
    assert limit_reached(_reports(True), w, T0 + 60, **kw) is None  # the others shut down
    d = limit_reached(_reports(True), w, T0 + 3 + DEFAULT_FINISH + 1, **kw)
    assert d is not None and d.action == "give_up"
    assert d.reason == "stalled finishing: a node succeeded, the others silent for 301 s"
    # without the end, the same silence is a stall, as before
    w = WatchState()
    assert limit_reached(_reports(False), w, T0 + 1, **kw) is None
    d = limit_reached(_reports(False), w, T0 + 6, **kw)
    assert d is not None and d.reason == "stalled: no progress on any node for 5 s"
