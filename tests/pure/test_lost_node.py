"""A lost node, fast and blamed right (issue 28): the watcher reaches a silent node anew from
half the lost-node timeout and declares it lost at the timeout, with the time it was last
heard from; ranks our stop ended are never a first failure; a lost node without rank ends keeps
the blame over the peers that failed after it went silent, so the retry rule for lost hosts
matches; the post-mortem never waits on a lost host and is bounded."""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from pathlib import Path
from typing import Any

from fleetctl.api.runspec import Supervision
from fleetctl.job.records.state import NodeState


class _Pipe:
    """A supervisor channel as a pipe: selectable; heartbeats go nowhere."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def fileno(self) -> int:
        return self.r

    def recv(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.r], [], [], timeout)
        return os.read(self.r, 65536) if ready else None

    def send(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        for fd in (self.r, self.w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _node_run(stream: Any, rank: int = 0) -> Any:
    from fleetctl.node import Node
    from fleetctl.phases.launch import FrameReader, NodeRun

    return NodeRun(
        node=Node(f"n{rank}", "10.0.0.1"),
        rank=rank,
        conn=None,  # type: ignore[arg-type]
        stream=stream,
        reader=FrameReader(),
        python="python3",
        sup_path="s.py",
        run_dir="/r",
    )


def _events_until(watch: Any, kind: str, timeout: float = 10.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while not out or out[-1].kind != kind:
        ev = watch.get(max(0.01, deadline - time.monotonic()))
        assert ev is not None, f"no {kind} event: {out}"
        out.append(ev)
    return out


def test_a_silent_node_is_reached_anew_before_the_timeout_and_lost_at_it() -> None:
    """The new connection is tried from half the timeout on, with the timeout (counted from
    the last bytes) as its deadline; when it fails the node is lost then, and the event says
    when the node was last heard from."""
    from fleetctl.phases.watch import Watch

    calls: list[tuple[float, float]] = []

    def reattach(run: Any, deadline: float) -> list:
        calls.append((time.monotonic(), deadline))
        raise OSError("timed out connecting")

    pipe = _Pipe()
    watch = Watch(Supervision(lost_timeout=2.0), heartbeat=0.05, reattach=reattach)
    try:
        watch.attach(_node_run(pipe))
        os.write(pipe.w, b"L last words\n")
        said_at, said_wall = time.monotonic(), time.time()
        events = _events_until(watch, "lost")
    finally:
        watch.close()
        pipe.close()
    [(called, deadline)] = calls
    assert said_at + 1.0 <= called < said_at + 2.0  # from half the timeout, before its end
    assert abs(deadline - (said_at + 2.0)) < 0.3  # lost at the timeout, not a timeout later
    notice = next(e for e in events if e.kind == "notice")
    assert notice.text.endswith("reaching the node over a new connection")
    lost = events[-1]
    assert lost.text.startswith("no heartbeat for ") and "a new connection failed too" in lost.text
    assert lost.heard is not None and abs(lost.heard - said_wall) < 0.3


def test_a_blip_shorter_than_the_timeout_costs_nothing() -> None:
    """The node answers the new connection before the timeout: read on, never lost."""
    from fleetctl.phases.watch import Watch

    old, new = _Pipe(), _Pipe()

    def reattach(run: Any, deadline: float) -> list:
        run.stream = new
        return []

    watch = Watch(Supervision(lost_timeout=2.0), heartbeat=0.05, reattach=reattach)
    try:
        watch.attach(_node_run(old))
        os.write(old.w, b"L before\n")
        _events_until(watch, "lines")
        back = _events_until(watch, "notice")  # reaching it...
        back = _events_until(watch, "notice")  # ...and back
        assert back[-1].text.startswith("back over a new connection")
        os.write(new.w, b"L after\nX 0\n")
        events = _events_until(watch, "exit")
    finally:
        watch.close()
        old.close()
        new.close()
    assert [x for e in events if e.kind == "lines" for x in e.lines] == ["after"]
    assert not any(e.kind == "lost" for e in events) and events[-1].code == 0


def test_every_ranks_end_said_again_over_a_new_connection_counts_once() -> None:
    """A node's ``reattach`` says ``A`` again (its first may have gone down with the old
    channel): one ``ranks_ended`` event, whichever channel brought it first."""
    from fleetctl.phases.frames import Frame
    from fleetctl.phases.watch import Watch
    from fleetctl.remote.kit.framing import line

    ended = json.dumps({"ranks": 2, "failed": 0}).encode()
    old, new = _Pipe(), _Pipe()

    def reattach(run: Any, deadline: float) -> list:
        run.stream = new
        return [Frame("A", ended)]

    watch = Watch(Supervision(lost_timeout=2.0), heartbeat=0.05, reattach=reattach)
    try:
        watch.attach(_node_run(old))
        os.write(old.w, line("L", b"before") + line("A", ended))
        events = _events_until(watch, "ranks_ended")
        events += _events_until(watch, "notice")  # reaching it...
        events += _events_until(watch, "notice")  # ...and back, saying A again
        os.write(new.w, line("A", ended) + line("X", b"0"))
        events += _events_until(watch, "exit")
    finally:
        watch.close()
        old.close()
        new.close()
    said = [e.report for e in events if e.kind == "ranks_ended"]
    assert said == [{"ranks": 2, "failed": 0}], events


def test_a_node_that_cannot_be_reached_anew_is_lost_only_at_the_timeout() -> None:
    from fleetctl.phases.watch import Watch

    pipe = _Pipe()
    watch = Watch(Supervision(lost_timeout=1.0), heartbeat=0.05)  # no reattach
    try:
        watch.attach(_node_run(pipe))
        os.write(pipe.w, b"H\n")
        t0 = time.monotonic()
        events = _events_until(watch, "lost")
    finally:
        watch.close()
        pipe.close()
    assert time.monotonic() - t0 >= 1.0
    assert not any(e.kind == "notice" for e in events)


def _torchrun_result(tmp_path: Path, exits: dict[int, list[dict]]) -> Any:
    """A finished 3-node torchrun job whose node 2 was lost; node folders with the node
    supervisors' ``rank_exits.json`` for the nodes that were collected."""
    from fleetctl.job.run.context import JobContext
    from fleetctl.job.run.job import RunOptions
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec

    nodes = [Node(name=f"node{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)]
    events: list[Any] = []
    job = JobContext(
        JobSpec(script="t.py", job_id="j1"), nodes, RunOptions(runs_dir=tmp_path), events.append
    )
    job.result.plan = type("P", (), {"launcher": "torchrun", "procs": 1})()
    for rank, entries in exits.items():
        d = tmp_path / f"{rank}-node{rank + 1}"
        d.mkdir()
        (d / "rank_exits.json").write_text(json.dumps({"exits": entries}))
        job.result.nodes[rank].folder = str(d)
    return job, events


def _lost_then(job: Any, peer_state: NodeState, peer_end: float) -> None:
    st = job.state
    st.launch()
    for r in range(3):
        st.start(r)
    st.end(2, NodeState.LOST, 10.0)  # last heard at 10.0
    st.end(0, peer_state, peer_end)
    st.end(1, NodeState.STOPPED, 15.2)
    job.sync()
    for r in range(3):
        job.result.nodes[r].state = st.states[r]
    job.result.nodes[2].reason = "no heartbeat for 5.0s"
    job.result.nodes[0].exit_code = 1


def test_ranks_our_stop_ended_are_never_a_first_failure(tmp_path: Path) -> None:
    """Links cut: node 2 is lost, the others are stopped; torchrun turns our SIGTERM into
    exit code 1 on rank 0. Those rank ends came after the stop reached their node."""
    from fleetctl.job.diagnose.ranks import failed_ranks
    from fleetctl.job.run.finish import _blame_first_rank

    exits = {
        0: [{"local": 0, "pid": 7, "code": 1, "at": 15.1, "after_stop": True}],
        1: [{"local": 0, "pid": 8, "code": -15, "at": 15.1, "after_stop": True}],
    }
    job, events = _torchrun_result(tmp_path, exits)
    _lost_then(job, NodeState.STOPPED, 15.2)
    job.result.failed_ranks = failed_ranks(job.result, []) or None
    assert job.result.failed_ranks is None
    _blame_first_rank(job)
    assert job.result.first_failure == 2 and job.result.failed_node.state == NodeState.LOST
    assert not any(e.kind in ("failure", "notice") for e in events)


def test_a_peer_that_failed_after_the_lost_node_went_silent_is_its_victim(
    tmp_path: Path,
) -> None:
    """Host crashed mid-DDP: a peer's gloo collective broke at once (exit 1, before any stop),
    but node 2 was silent since before: node 2 stays the first failure, its loss is what the
    retry rule sees, and with a spare the retry runs."""
    from fleetctl.job.diagnose.ranks import failed_ranks
    from fleetctl.job.run.finish import _blame_first_rank
    from fleetctl.job.run.retry import Failure, RetryPolicy
    from fleetctl.job.run.spares import faulty_hosts

    job, events = _torchrun_result(tmp_path, {0: [{"local": 0, "pid": 7, "code": 1, "at": 10.1}]})
    _lost_then(job, NodeState.FAILED, 10.3)
    job.result.failed_ranks = failed_ranks(job.result, []) or None
    assert job.result.failed_ranks[0]["rank"] == 0  # the only rank end anyone saw
    _blame_first_rank(job)
    ff = job.result.failed_node
    assert (ff.rank, ff.state) == (2, NodeState.LOST)
    assert job.result.failed_ranks is None  # rank 0 is not the lost node's rank
    assert not any(e.kind == "failure" for e in events)
    decision = RetryPolicy.build(max_retries=1).decide(Failure.from_node(ff), 1)
    assert decision.retry and decision.reason == "retry on lost (default)"
    assert "node3" in faulty_hosts(job.result)  # the spare takes its place


def test_a_peer_that_failed_before_the_silence_takes_the_blame_and_the_live_line(
    tmp_path: Path,
) -> None:
    from fleetctl.job.diagnose.ranks import failed_ranks
    from fleetctl.job.run.finish import _blame_first_rank

    job, events = _torchrun_result(tmp_path, {0: [{"local": 0, "pid": 7, "code": 1, "at": 9.5}]})
    _lost_then(job, NodeState.FAILED, 10.3)
    job.result.failed_ranks = failed_ranks(job.result, []) or None
    _blame_first_rank(job)
    assert job.result.first_failure == 0
    [live] = [e for e in events if e.kind == "failure"]
    assert live.rank == 0 and live.text == "exit code 1"
    [note] = [e.text for e in events if e.kind == "notice"]
    assert "before node 2 (node3) was last heard from" in note


def test_the_post_mortem_skips_lost_hosts_and_never_waits_longer_than_its_limit(
    monkeypatch: Any,
) -> None:
    import fleetctl.phases.check.preflight as check
    from fleetctl.job.diagnose.culprit import likely_causes
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.ssh.fanout import FanOut

    probed: list[list[str]] = []
    release = threading.Event()

    def slow_check(fleet: Any, options: Any) -> Any:
        probed.append([n.name for n in fleet.nodes])
        assert options.probe_timeout <= 0.5 and options.recheck
        release.wait(10)
        raise RuntimeError("too late")

    monkeypatch.setattr(check, "check_fleet", slow_check)
    fleet = FanOut([Node(name=f"node{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)])
    t0 = time.monotonic()
    try:
        said = likely_causes(fleet, JobSpec(script="t.py", job_id="j1"), skip={"node3"}, limit=0.5)
    finally:
        release.set()
    assert time.monotonic() - t0 < 2.0
    assert probed == [["node1", "node2"]]
    assert said == ["post-mortem probe: no answer from every host within 0.5s"]
    assert (
        likely_causes(fleet, JobSpec(script="t.py", job_id="j1"), skip={"node1", "node2", "node3"})
        == []
    )
