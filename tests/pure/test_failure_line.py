"""The live FAILED FIRST line does not flip: held from the first failure until a loss is
declared, every node ended, or the lost-node timeout passed, it names the node the summary
names — once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from fleetctl.api.runspec import Supervision
from fleetctl.job.run.context import JobContext, on_event
from fleetctl.job.run.job import RunOptions
from fleetctl.node import Node
from fleetctl.phases.watch import Event
from fleetctl.plan.rankplan import JobSpec

STOPPED = {"ended_at": 10.6, "stop_asked": True, "found": [], "killed": []}


def _job(tmp_path: Path, lost_timeout: float = 60.0) -> tuple[JobContext, list[Any]]:
    events: list[Any] = []
    nodes = [Node(name=f"node{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)]
    opts = RunOptions(runs_dir=tmp_path, supervision=Supervision(lost_timeout=lost_timeout))
    job = JobContext(JobSpec(script="t.py", job_id="j1"), nodes, opts, events.append)
    job.state.launch()
    for rank in range(3):
        on_event(job, Event("started", rank, f"node{rank + 1}", 1.0))
    return job, events


def _peer_fails(job: JobContext) -> None:
    """node1's gloo collective broke (exit 1, before any stop)."""
    report = {"ended_at": 10.3, "stop_asked": False, "found": [], "killed": []}
    on_event(job, Event("exit", 0, "node1", 10.4, code=1, report=report))


def _lines(events: list[Any]) -> list[tuple[int, str]]:
    return [(e.rank, e.text) for e in events if e.kind == "failure"]


def test_held_until_the_loss_then_one_line_for_the_lost_node(tmp_path: Path) -> None:
    job, events = _job(tmp_path)
    _peer_fails(job)
    assert job.result.first_failure == 0 and _lines(events) == []  # held: node3 is silent
    on_event(job, Event("lost", 2, "node3", 15.0, "no heartbeat for 5.0s", heard=10.0))
    on_event(job, Event("exit", 1, "node2", 15.1, code=-15, report=STOPPED))
    assert job.result.first_failure == 2
    assert [r for r, _ in _lines(events)] == [2]


def test_held_until_every_node_ended(tmp_path: Path) -> None:
    job, events = _job(tmp_path)
    _peer_fails(job)
    on_event(job, Event("exit", 1, "node2", 10.7, code=-15, report=STOPPED))
    assert _lines(events) == []
    on_event(job, Event("exit", 2, "node3", 10.8, code=-15, report=STOPPED))
    assert _lines(events) == [(0, "exit code 1")]


def test_held_no_longer_than_the_lost_node_timeout(tmp_path: Path) -> None:
    said = threading.Event()
    job, events = _job(tmp_path, lost_timeout=1.0)  # the least --lost-timeout
    job._emit_cb = lambda ev: (events.append(ev), ev.kind == "failure" and said.set())
    t0 = time.monotonic()
    _peer_fails(job)  # the others never report: the timer says the line
    assert said.wait(10.0), "the held line was never said"
    assert time.monotonic() - t0 >= 0.99
    assert _lines(events) == [(0, "exit code 1")]
    job.failure_line(now=True)  # finish's call: nothing new to say
    assert len(_lines(events)) == 1
