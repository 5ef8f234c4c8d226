"""The job monitor's decisions (which node failed first, lost after a timeout, blips tolerated,
role min_failed), its process identity (pid + /proc start time), and its job.json records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.api.runspec import Supervision
from fleetctl.job.monitor.decide import MONITOR_REASON, WatchState, decide
from fleetctl.job.monitor.handle import JobHandle
from fleetctl.job.monitor.process import monitor_alive, monitor_status, stop_monitor
from fleetctl.job.monitor.supervisors import EXTERNAL_STOP_REASON, NodeReport
from fleetctl.job.monitor.watch import monitor_job
from fleetctl.job.records.controller import identity
from fleetctl.job.records.jobrecord import FailureRecord, JobRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.job.records.runs import write_connect
from fleetctl.node import Node
from fleetctl.phases.collect import NodeCollect
from fleetctl.phases.teardown import NodeStop, TeardownReport
from fleetctl.plan.roles import CompletionPolicy

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def running(rank: int) -> NodeReport:
    return NodeReport(rank, f"n{rank}", "running", processes=[100 + rank])


def exited(rank: int, code: int | None, end: float, sig: int | None = None) -> NodeReport:
    return NodeReport(rank, f"n{rank}", "exited", exit_code=code, signal=sig, end_time=end)


def unreachable(rank: int) -> NodeReport:
    return NodeReport(rank, f"n{rank}", "unreachable", error="no answer within 15s")


def test_the_node_that_ended_badly_first_is_the_first_failure() -> None:
    w = WatchState()
    d, _ = decide([running(0), running(1), running(2)], w, T0, lost_after=60)
    assert d is None
    # Between two polls rank 2 ended (exit 1) 0.4 s before rank 1 was killed by a signal.
    states = [running(0), exited(1, None, T0 + 2.4, sig=9), exited(2, 1, T0 + 2.0)]
    d, _ = decide(states, w, T0 + 3, lost_after=60)
    assert d is not None and d.action == "fail"
    assert (d.rank, d.host, d.state, d.exit_code, d.signal) == (2, "n2", "failed", 1, None)
    ff = d.first_failure()
    assert ff is not None and ff.rank == 2 and ff.time == "2026-01-01T00:00:02.000Z"
    d, _ = decide([running(0), exited(1, None, T0 + 2.4, sig=9)], WatchState(), T0 + 3,
                  lost_after=60)  # fmt: skip
    assert d is not None and (d.rank, d.signal, d.exit_code) == (1, 9, None)
    assert d.describe() == "node 1 (n1) failed first: signal 9"


def test_every_node_succeeding_ends_the_job_as_succeeded_and_each_is_reported_once() -> None:
    w = WatchState()
    d, notes = decide([exited(0, 0, T0), running(1)], w, T0 + 1, lost_after=60)
    assert d is None and notes == ["node 0 (n0) succeeded"]
    d, notes = decide([exited(0, 0, T0), exited(1, 0, T0 + 2)], w, T0 + 3, lost_after=60)
    assert d is not None and (d.action, d.status) == ("done", "succeeded")
    assert notes == ["node 1 (n1) succeeded"] and d.first_failure() is None


def test_short_blips_are_tolerated_and_a_long_silence_is_a_lost_node() -> None:
    w = WatchState()
    d, notes = decide([running(0), unreachable(1)], w, T0, lost_after=60)
    assert d is None and len(notes) == 1 and notes[0].startswith("node 1 (n1) did not answer")
    d, notes = decide([running(0), unreachable(1)], w, T0 + 59, lost_after=60)
    assert d is None and notes == []  # the same streak: said once
    d, notes = decide([running(0), running(1)], w, T0 + 59.5, lost_after=60)
    assert d is None and notes == ["node 1 (n1) answers again after 59.5s"]
    # A new streak starts from zero: 59 s of it is still a blip, 61 s is a lost node.
    assert decide([running(0), unreachable(1)], w, T0 + 100, lost_after=60)[0] is None
    assert decide([running(0), unreachable(1)], w, T0 + 159, lost_after=60)[0] is None
    d, _ = decide([running(0), unreachable(1)], w, T0 + 161, lost_after=60)
    assert d is not None and (d.action, d.rank, d.state, d.unreachable) == ("fail", 1, "lost", True)
    assert (
        d.time == T0 + 100 and d.reason is not None and d.reason.startswith("unreachable for 61s")
    )


def test_a_dead_supervisor_or_a_missing_record_is_a_lost_node() -> None:
    for state, why in (("lost", "its supervisor died"), ("absent", "no record of the job")):
        d, _ = decide([running(0), NodeReport(1, "n1", state)], WatchState(), T0, lost_after=60)
        assert d is not None and (d.rank, d.state, d.unreachable) == (1, "lost", False)
        assert d.reason is not None and d.reason.startswith(why)


def test_a_stop_from_another_terminal_is_left_to_it() -> None:
    stopped = NodeReport(1, "n1", "stopped", signal=15, stop_reason=EXTERNAL_STOP_REASON)
    d, _ = decide([running(0), stopped, exited(2, 1, T0)], WatchState(), T0, lost_after=60)
    assert d is not None and d.action == "external"
    # Stopped on the node for another reason (its supervisor got SIGTERM): a failure.
    other = NodeReport(1, "n1", "stopped", signal=15, stop_reason="supervisor got SIGTERM")
    d, _ = decide([running(0), other], WatchState(), T0, lost_after=60)
    assert d is not None and (d.action, d.rank, d.state) == ("fail", 1, "failed")
    assert d.reason == "stopped on the node: supervisor got SIGTERM"


def test_a_role_min_failed_tolerates_failures_until_it_is_reached() -> None:
    policy = CompletionPolicy(
        roles=("server", "worker", "worker", "worker"),
        min_failed={"server": 1, "worker": 2},
    )
    w = WatchState()
    states = [running(0), exited(1, 1, T0 + 1), running(2), running(3)]
    d, notes = decide(states, w, T0 + 2, lost_after=60, policy=policy)
    assert d is None and notes == [
        "node 1 (n1) ended badly (failed); tolerated by its role's min_failed"
    ]
    d, notes = decide(states, w, T0 + 4, lost_after=60, policy=policy)
    assert d is None and notes == []
    states[3] = exited(3, 2, T0 + 5)
    d, _ = decide(states, w, T0 + 6, lost_after=60, policy=policy)
    assert d is not None and (d.action, d.rank, d.exit_code) == ("fail", 3, 2)
    # min_failed null: failures never fail the job; it ends when every task ended.
    lax = CompletionPolicy(roles=("w", "w"), min_failed={"w": None})
    d, _ = decide([exited(0, 1, T0), exited(1, 0, T0)], WatchState(), T0, lost_after=60,
                  policy=lax)  # fmt: skip
    assert d is not None and (d.action, d.status) == ("done", "succeeded")


# ------------------------------------------------------------------------- process identity


def test_a_monitor_is_alive_only_while_pid_and_start_time_both_match() -> None:
    me = identity()
    assert monitor_alive(me)
    assert not monitor_alive({**me, "start_time": me["start_time"] + 1})  # a reused pid
    assert not monitor_alive({**me, "host": "elsewhere"})
    assert not monitor_alive({**me, "boot_id": "another-boot"})
    assert not monitor_alive({"pid": me["pid"]})  # a bare pid is never trusted
    assert not monitor_alive(None)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    info = identity(child.pid)
    child.wait(10)
    assert not monitor_alive(info)


def _detached_job(runs: Path, job_id: str, n: int = 3, **kw: object) -> RunFolder:
    folder = RunFolder.create(runs, job_id)
    nodes = [
        {"rank": r, "host": f"n{r}", "state": "running", "address": f"10.0.0.{r + 1}"}
        for r in range(n)
    ]
    job = {
        "job_id": job_id,
        "status": "running",
        "detached": True,
        "started": "2026-01-01T00:00:00.000Z",
        "ended": None,
        "first_failure": None,
        "nodes": nodes,
        **kw,
    }
    folder.write_job(JobRecord.from_dict(job))
    write_connect(folder.path, [Node(f"n{r}", f"10.0.0.{r + 1}") for r in range(n)])
    return folder


def test_stop_monitor_signals_only_the_verified_process_and_waits_for_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetctl.cli import main

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        # A failed job whose monitor still chases a lost node (status asks no node then).
        mon = {**identity(sleeper.pid), "phase": "chasing", "log": "/r/monitor.log"}
        folder = _detached_job(tmp_path, "j1", monitor=mon)
        job = folder.load_job()
        job.status = "failed"
        folder.write_job(job)
        assert monitor_status(folder.load_job())["alive"] is True  # type: ignore[index]
        with pytest.raises(SystemExit):
            main(["status", "--runs-dir", str(tmp_path), "j1"])
        out = capsys.readouterr().out
        assert f"  monitor: pid {sleeper.pid} chasing (log /r/monitor.log)" in out.splitlines()
        # A recorded start time that does not match: never signalled, whatever the pid.
        job = folder.load_job()
        assert job.monitor is not None
        job.monitor["start_time"] += 1
        folder.write_job(job)
        assert stop_monitor(folder, wait=1) is None and sleeper.poll() is None
        job.monitor["start_time"] -= 1
        folder.write_job(job)
        assert stop_monitor(folder, wait=10) == f"monitor pid {sleeper.pid} exited"
        assert sleeper.wait(5) == -15  # SIGTERM
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(5)


def test_a_second_monitor_is_refused_while_one_is_alive(tmp_path: Path) -> None:
    from fleetctl.cli import main

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _detached_job(tmp_path, "j2", monitor={**identity(sleeper.pid), "log": "/x/monitor.log"})
        with pytest.raises(Exception, match=f"already watched by monitor pid {sleeper.pid}"):
            monitor_job(tmp_path, "j2", deadline=0.0)
        with pytest.raises(SystemExit) as e:
            main(["monitor", "--runs-dir", str(tmp_path), "j2"])
        assert e.value.code == 2
    finally:
        sleeper.kill()
        sleeper.wait(5)
    ended = _detached_job(tmp_path, "j3")
    job = ended.load_job()
    job.status = "stopped"
    ended.write_job(job)
    with pytest.raises(Exception, match=r"already ended \(stopped\)"):
        monitor_job(tmp_path, "j3", deadline=0.0)


# ---------------------------------------------------------------------------- job.json


def _collected(folder: RunFolder, rank: int, sup: dict) -> NodeCollect:
    d = folder.node_folder(rank, f"n{rank}")
    d.mkdir()
    (d / "supervisor.json").write_text(json.dumps(sup))
    (d / "console.log").write_text(f"rank {rank}\n")
    return NodeCollect(f"n{rank}", rank, str(d))


def test_a_failure_found_by_the_monitor_makes_a_failed_job_with_stopped_peers(
    tmp_path: Path,
) -> None:
    folder = _detached_job(tmp_path, "j4")
    h = JobHandle(tmp_path, "j4")
    h.stop_time = T0 + 5.0
    why = f"{MONITOR_REASON}: node 1 (n1) failed first"
    results = [
        _collected(folder, 0, {"state": "stopped", "signal": 15, "end_time": T0 + 5.5,
                               "stop_reason": why}),
        _collected(folder, 1, {"state": "exited", "exit_code": 1, "end_time": T0 + 2.0}),
        # Exited by itself once its peer was gone (before the teardown began): failed too.
        _collected(folder, 2, {"state": "exited", "exit_code": 1, "end_time": T0 + 3.0}),
    ]  # fmt: skip
    ff = {"rank": 1, "host": "n1", "state": "failed", "exit_code": 1, "signal": None,
          "reason": None, "time": "2026-01-01T00:00:02.000Z", "found_by": "monitor"}  # fmt: skip
    report = TeardownReport([NodeStop(f"n{r}", r, found=[1]) for r in range(3)], grace=2.0)
    assert h.mark_ended("failed", report, results, failed_first=FailureRecord.from_dict(ff))
    job = folder.load_job()
    assert job.status == "failed" and job.teardown and job.teardown["verified"] is True
    assert job.first_failure and job.first_failure.rank == 1 and job.first_failure.after == 2.0
    assert job.first_failure.address == "10.0.0.2"
    assert job.first_failure.extra == {"found_by": "monitor"}
    assert [(n.state, n.exit_code) for n in job.nodes] == [
        ("stopped", None),
        ("failed", 1),
        ("failed", 1),
    ]
    assert job.nodes[0].reason == why
    # A second verdict (a stop racing with it) never rewrites the final record.
    assert h.mark_ended("succeeded", report, results) is False
    assert folder.load_job().status == "failed"


def test_a_lost_node_that_cannot_be_verified_stays_lost(tmp_path: Path) -> None:
    folder = _detached_job(tmp_path, "j5", n=2)
    h = JobHandle(tmp_path, "j5")
    h.stop_time = T0 + 70
    results = [
        _collected(folder, 0, {"state": "stopped", "signal": 15, "end_time": T0 + 71,
                               "stop_reason": MONITOR_REASON}),
        NodeCollect("n1", 1, str(folder.node_folder(1, "n1")), skipped="node lost: not reachable"),
    ]  # fmt: skip
    report = TeardownReport(
        [NodeStop("n0", 0, found=[3]), NodeStop("n1", 1, skipped="lost")], grace=1.0
    )
    ff = {"rank": 1, "host": "n1", "state": "lost", "reason": "unreachable for 61s",
          "time": "2026-01-01T00:00:09.000Z"}  # fmt: skip
    h.mark_ended("failed", report, results, failed_first=FailureRecord.from_dict(ff))
    job = folder.load_job()
    assert job.status == "failed" and job.teardown and job.teardown["verified"] is False
    assert [n.state for n in job.nodes] == ["stopped", "lost"]
    assert job.nodes[1].reason == "unreachable for 61s"
    assert job.first_failure and job.first_failure.state == "lost"


def test_collect_after_a_monitor_died_mid_teardown_still_says_failed(tmp_path: Path) -> None:
    """Peers stopped on the node + one failed node, finalised by a plain `collect`: the job
    failed (it used to read as "stopped", hiding the failure)."""
    folder = _detached_job(tmp_path, "j6", n=2)
    results = [
        _collected(folder, 0, {"state": "stopped", "signal": 15, "end_time": T0 + 5,
                               "stop_reason": MONITOR_REASON}),
        _collected(folder, 1, {"state": "exited", "exit_code": 1, "end_time": T0 + 2}),
    ]  # fmt: skip
    h = JobHandle(tmp_path, "j6")
    with folder.locked():
        h._finalise(results)
    job = folder.load_job()
    assert job.status == "failed" and job.first_failure and job.first_failure.rank == 1


def test_a_detached_job_times_out_by_its_start_and_stalls_by_its_progress_marks() -> None:
    from fleetctl.job.monitor.decide import limit_reached

    def at(marks: list[float | None], begun: bool = True) -> list[NodeReport]:
        return [
            NodeReport(r, f"n{r}", "running", processes=[1], progress=m, begun=begun)
            for r, m in enumerate(marks)
        ]

    w = WatchState()
    kw = {"started": T0, "sup": Supervision(stall_timeout=10.0)}
    assert limit_reached(at([5.0, 7.0]), w, T0 + 1, **kw) is None
    assert limit_reached(at([5.0, 9.0]), w, T0 + 8, **kw) is None  # node 1 moved at T0+8
    assert limit_reached(at([5.0, 9.0]), w, T0 + 17, **kw) is None
    d = limit_reached(at([5.0, 9.0]), w, T0 + 19, **kw)  # nothing moved for 11 s
    assert d is not None and d.action == "give_up" and d.first_failure() is None
    assert d.reason == "stalled: no progress on any node for 11 s"
    assert d.describe() == "the job stalled: no progress on any node for 11 s"
    # node clocks may be anywhere: only a change of the mark counts, never its value
    w2 = WatchState()
    assert limit_reached(at([1e12]), w2, T0, **kw) is None
    assert limit_reached(at([1e12]), w2, T0 + 5, **kw) is None
    d = limit_reached(at([None]), WatchState(), T0 + 31, started=T0, sup=Supervision(timeout=30))
    assert d is not None and d.reason == "timed out after 30 s" and d.status == "failed"


def test_a_detached_job_starting_up_is_not_stalled_until_its_start_up_limit() -> None:
    """Before any node says the job began (a rank's first line, a progress touch), only the
    start-up limit counts, from the launch; the launcher's own lines move the marks but do
    not start the stall clock, which starts at the first node's begin."""
    from fleetctl.job.monitor.decide import limit_reached

    def at(marks: list[float], begun: list[bool]) -> list[NodeReport]:
        return [
            NodeReport(r, f"n{r}", "running", processes=[1], progress=m, begun=b)
            for r, (m, b) in enumerate(zip(marks, begun, strict=True))
        ]

    kw = {"started": T0, "sup": Supervision(stall_timeout=10, startup_timeout=100)}
    w = WatchState()
    assert limit_reached(at([1.0, 1.0], [False, False]), w, T0 + 2, **kw) is None
    assert limit_reached(at([2.0, 1.0], [False, False]), w, T0 + 3, **kw) is None  # launcher
    assert limit_reached(at([2.0, 1.0], [False, False]), w, T0 + 60, **kw) is None  # loading
    assert limit_reached(at([2.0, 3.0], [False, True]), w, T0 + 62, **kw) is None  # began
    assert limit_reached(at([2.0, 3.0], [False, True]), w, T0 + 71, **kw) is None
    d = limit_reached(at([2.0, 3.0], [False, True]), w, T0 + 73, **kw)
    assert d is not None and d.reason == "stalled: no progress on any node for 11 s"
    # never began: stalled at start-up once the limit passed, said apart from a stall
    w = WatchState()
    assert limit_reached(at([1.0], [False]), w, T0 + 100, **kw) is None
    d = limit_reached(at([2.0], [False]), w, T0 + 101, **kw)
    assert d is not None and d.action == "give_up" and d.status == "failed"
    assert d.reason == "stalled at start-up: no progress on any node 101 s after the launch"

    # the default start-up limit: only with --stall-timeout, the longer of 1800 s and it
    def limit(startup: float | None, stall: float | None) -> float | None:
        return Supervision(startup_timeout=startup, stall_timeout=stall).startup_limit()

    assert (limit(None, None), limit(None, 6.0)) == (None, 1800.0)
    assert (limit(None, 3600.0), limit(20.0, 6.0)) == (3600.0, 20.0)
    no_stall = {"started": T0, "sup": Supervision()}
    assert limit_reached(at([1.0], [False]), WatchState(), T0 + 10**6, **no_stall) is None


ROLES = CompletionPolicy(roles=("w", "w"), min_failed={"w": None})


@pytest.mark.parametrize(
    ("said", "policy", "verdict"),
    [
        # all exited 0: finishing, so the stall limit is at least 300 s from that end
        ({"ranks": 2, "failed": 0, "at": 1.0}, None, (320, "stalled finishing: a node")),
        # a rank failed: the stall clock restarts, the limit stays --stall-timeout
        ({"ranks": 2, "failed": 1, "at": 1.0}, None, (30, "stalled: no progress")),
        ({"ranks": 2, "failed": 0, "at": 1.0}, ROLES, (30, "stalled: no progress")),
        # an older node sends nothing: silent since T0, as before
        (None, None, (19, "stalled: no progress")),
    ],
    ids=["ranks-ended", "a-rank-failed", "role-job", "older-node"],
)
def test_a_node_whose_ranks_all_ended_counts_as_its_end_for_the_stall_clock(
    said: dict[str, object] | None,
    policy: CompletionPolicy | None,
    verdict: tuple[int, str],
) -> None:
    """Every rank of node 0 ended (``status``'s ranks_ended; the ``A`` frame attached) at
    T0+19 while its launcher shuts down and node 1's is silent too: like a node's end, the stall
    clock restarts, and ranks that all exited 0 make a plain job ``finishing``."""
    from fleetctl.job.monitor.decide import limit_reached

    def at(ended: dict[str, object] | None) -> list[NodeReport]:
        return [
            NodeReport(0, "n0", "running", [1], progress=5.0, begun=True, ranks_ended=ended),
            NodeReport(1, "n1", "running", [1], progress=5.0, begun=True),
        ]

    kw = {"started": T0, "sup": Supervision(stall_timeout=10.0), "policy": policy}
    w = WatchState()
    assert limit_reached(at(None), w, T0, **kw) is None
    assert limit_reached(at(None), w, T0 + 9, **kw) is None
    polls = [(t, limit_reached(at(said), w, T0 + t, **kw)) for t in (19, 29, 30, 319, 320)]
    when, d = next((t, d) for t, d in polls if d is not None)
    assert (when, (d.reason or "").startswith(verdict[1])) == (verdict[0], True), d


@pytest.mark.parametrize(
    ("rank_pids", "codes", "expected", "said"),
    [
        ({"0": [10], "1": [11]}, {10: 0, 11: 0}, 2, {"ranks": 2, "failed": 0}),
        ({"0": [10], "1": [11]}, {10: 0}, 2, None),  # rank 1 still runs
        ({"0": [10]}, {10: 0}, 2, None),  # rank 1 not seen yet (FLEET_NPROC_PER_NODE=2)
        ({"0": [10, 12]}, {10: 1}, 1, None),  # restarted by its launcher: the new one runs
        ({"0": [10], "1": [11]}, {10: 3, 11: None}, 2, {"ranks": 2, "failed": 1}),  # None: reaped
    ],
    ids=["all-ended", "one-runs", "one-unseen", "restarted", "reaped-unread"],
)
def test_the_nodes_ranks_have_all_ended_once_the_newest_process_of_each_did(
    rank_pids: dict[str, list[int]],
    codes: dict[int, int | None],
    expected: int,
    said: dict[str, int] | None,
) -> None:
    """What the supervisor's ``A`` frame says (``remote/kit/ranks.all_ended``)."""
    from fleetctl.remote.kit.ranks import all_ended

    exits = {pid: {"code": code} for pid, code in codes.items()}
    assert all_ended(rank_pids, exits, expected) == said
