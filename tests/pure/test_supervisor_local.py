"""The node supervisor's lifecycle with real processes on this machine (LocalConnection).

Each test starts real jobs (``sh``/``python``), checks how they end and that nothing of the job
is left, by job id in /proc — the same rule teardown uses. Every job is stopped in a finalizer.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetctl import remote
from fleetctl.api.runspec import Hosts, Supervision
from fleetctl.job.records.result import JobResult
from fleetctl.job.run.job import RunOptions, run_job
from fleetctl.node import Node
from fleetctl.phases.frames import FrameReader, last_data
from fleetctl.phases.launch import NodeRun, exit_report_of, start_node, supervisor_path
from fleetctl.phases.push import PushRequest
from fleetctl.plan.rankplan import JobSpec
from fleetctl.remote.programs.supervisor import find_job_processes, stop_processes
from fleetctl.transport.connection import LocalConnection

#: Job ids are unique per test process: stopping finds a job's processes machine-wide by its
#: id, and a test run of another checkout on the same machine must never stop ours.
RUN_TOKEN = str(os.getpid())


def jid(name: str) -> str:
    return f"{name}-{RUN_TOKEN}"


def _kill_leftovers(job_id: str) -> None:
    stop_processes(job_id, None, None, None, 0.0)


class Jobs:
    """Start supervised jobs under a temp workdir; stops whatever is left at the end."""

    def __init__(self, root: Path, python: str = sys.executable) -> None:
        self.root = root
        self.node = Node.localhost(workdir=str(root / "w"), python=python)
        self.conn = LocalConnection(self.node)
        self.ids: list[str] = []

    def start(self, job_id: str, argv: list[str], **spec: object) -> NodeRun:
        self.ids.append(job_id)
        full = {
            "job_id": job_id,
            "node_rank": 0,
            "argv": argv,
            "env": {"MY_VAR": "a b"},
            "cwd": str(self.root),
            "run_dir": str(self.root / "w" / "runs" / job_id),
            "deadman": 10,
            "grace": 1,
            "heartbeat": 0.5,
        }
        full.update(spec)
        return start_node(self.node, self.conn, full, python=self.node.python)

    def close(self) -> None:
        for j in self.ids:
            _kill_leftovers(j)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    j = Jobs(tmp_path)
    try:
        yield j
    finally:
        j.close()


def drain(
    run: NodeRun,
    timeout: float = 20.0,
    heartbeat: bool = False,
    reports: list[dict | None] | None = None,
) -> list[tuple[str, str]]:
    """Every frame (kind, text) until the supervisor's stream ends. ``X`` frames keep only
    their exit code; the leftover scan that follows it goes to ``reports``."""
    frames: list[tuple[str, str]] = []

    def add(new: list) -> None:
        for f in new:
            if f.kind == "X":
                frames.append(("X", f.text.split(" ", 1)[0]))
                if reports is not None:
                    reports.append(exit_report_of(f))
                # after its exit the supervisor waits for `c` (collect) or EOF: say goodbye
                with contextlib.suppress(OSError, EOFError):
                    run.stream.close_stdin()
            else:
                frames.append((f.kind, f.text))

    add(run.pending)
    reader: FrameReader = run.reader
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if heartbeat:
            with contextlib.suppress(OSError):  # the supervisor may just have exited
                run.stream.send(b"h")
        data = run.stream.recv(0.3)
        if data is None:
            continue
        add(reader.feed(data) if data else reader.flush())
        if not data:
            return frames
    raise AssertionError(f"supervisor did not end within {timeout}s: {frames[-5:]}")


def wait_for(what: str, check: Callable[[], object], timeout: float = 10.0) -> None:
    """Poll ``check`` until it is true; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


def wait_running(job_id: str, count: int = 4) -> None:
    """The job's processes are up (``JOB_WITH_ESCAPEE``: ``sh``, the ``setsid``'d ``sleep``, the
    one in the background and the one in the foreground)."""
    wait_for(f"{count} processes of {job_id}", lambda: len(find_job_processes(job_id, 0)) >= count)


def wait_gone(job_id: str, timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    left = find_job_processes(job_id, None)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = find_job_processes(job_id, None)
    return left


def test_a_job_runs_in_its_run_folder_with_its_env_and_reports_its_exit(jobs: Jobs) -> None:
    args = ["two words", 'it\'s "quoted"', "a;b", "$HOME", ""]
    script = (
        "import os,sys,json; print(json.dumps(sys.argv[1:])); "
        "print(os.environ['FLEET_JOB_ID'], os.environ['FLEET_NODE_RANK'], os.environ['MY_VAR']); "
        "print(open('hostfile').read().strip()); print(os.getpgid(0) == os.getpid()); "
        "sys.stdout.write('no newline'); sys.exit(7)"
    )
    run = jobs.start(
        jid("t-exit"),
        [sys.executable, "-c", script, *args],
        files={"hostfile": "10.0.0.1 slots=2\n"},
        cwd=str(jobs.root / "w" / "runs" / jid("t-exit")),
    )
    frames = drain(run, heartbeat=True)
    lines = [t for k, t in frames if k == "L"]
    assert lines == [
        json.dumps(args),
        f"{jid('t-exit')} 0 a b",
        "10.0.0.1 slots=2",
        "True",
        "no newline",
    ]
    assert frames[-1] == ("X", "7")
    run_dir = jobs.root / "w" / "runs" / jid("t-exit")
    assert oct(run_dir.stat().st_mode & 0o777) == "0o700"
    assert (run_dir / "console.log").read_text().splitlines() == lines
    state = json.loads((run_dir / "supervisor.json").read_text())
    assert (
        state["job_id"] == jid("t-exit") and state["exit_code"] == 7 and state["state"] == "exited"
    )
    assert state["pgid"] == state["pid"] and state["end_time"] >= state["start_time"]
    assert run.uploaded  # first start on this workdir installed the supervisor


def test_after_its_exit_the_supervisor_sends_the_run_folder_on_the_same_channel(
    jobs: Jobs, tmp_path: Path
) -> None:
    """Collecting needs no second remote command: ``c`` after ``X`` brings the folder home."""
    from fleetctl.phases.collect import collect_from_supervisor
    from fleetctl.phases.watch import Watch

    run = jobs.start(
        jid("t-inband"),
        ["sh", "-c", "echo one; mkdir -p log; echo w0 > log/workerlog.0"],
        cwd=str(jobs.root / "w" / "runs" / jid("t-inband")),
    )
    watch = Watch(heartbeat=0.2)
    watch.attach(run)
    assert watch.wait_ended(20.0) == []
    events = []
    while not watch.events.empty():
        events.append(watch.events.get_nowait())
    [exit_ev] = [e for e in events if e.kind == "exit"]
    report = exit_ev.report or {}
    assert exit_ev.code == 0 and report == {
        "found": [],
        "killed": [],
        "remaining": [],
        "ended_at": report.get("ended_at"),
        "stop_asked": False,  # it ended on its own: nobody had asked it to stop
    }
    assert isinstance(report["ended_at"], float) and abs(report["ended_at"] - exit_ev.time) < 5
    watch.close(keep={0})  # its stream stays open for the collector
    dest = tmp_path / "home" / "0-local"
    got = collect_from_supervisor(run.node, run.stream, dest=dest, rank=0, timeout=20.0)
    assert got is not None and got.error is None
    assert (dest / "console.log").read_text() == "one\n"
    assert (dest / "log" / "workerlog.0").read_text() == "w0\n"
    assert json.loads((dest / "supervisor.json").read_text())["exit_code"] == 0
    assert run.stream.exit_code(10.0) == 0  # and then the supervisor is gone


def test_a_supervisor_whose_controller_says_nothing_after_the_exit_leaves_on_eof(
    jobs: Jobs,
) -> None:
    run = jobs.start(jid("t-eof-after"), ["true"])
    frames = drain(run, heartbeat=True)  # closes stdin once X arrived
    assert frames[-1] == ("X", "0")
    assert run.stream.exit_code(10.0) == 0


def test_the_supervisor_is_uploaded_once_per_content_hash(jobs: Jobs) -> None:
    first = jobs.start(jid("t-up1"), ["true"])
    drain(first, heartbeat=True)
    second = jobs.start(jid("t-up2"), ["true"])
    drain(second, heartbeat=True)
    assert first.uploaded and not second.uploaded
    assert (
        Path(supervisor_path(str(jobs.root / "w"))) / remote.node_file("supervisor.py")
    ).is_file()


def test_a_job_killed_by_a_signal_reports_minus_the_signal(jobs: Jobs) -> None:
    run = jobs.start(jid("t-sig"), ["sh", "-c", "kill -TERM $$"])
    assert drain(run, heartbeat=True)[-1] == ("X", "-15")


JOB_WITH_ESCAPEE = "setsid sleep 300 & sleep 300 & trap '' TERM; echo up; sleep 300; wait"


def test_no_heartbeat_triggers_the_dead_man_switch_and_kills_escapees(jobs: Jobs) -> None:
    run = jobs.start(jid("t-deadman"), ["sh", "-c", JOB_WITH_ESCAPEE], deadman=2, grace=0.5)
    wait_running(jid("t-deadman"))
    t0 = time.monotonic()
    reports: list[dict | None] = []
    frames = drain(run, heartbeat=False, reports=reports)
    took = time.monotonic() - t0
    assert any(k == "E" and "dead-man" in t for k, t in frames), frames
    assert frames[-1] == ("X", "-9")  # it ignored SIGTERM, so SIGKILL after the grace
    assert took < 10
    assert wait_gone(jid("t-deadman")) == []
    # the exit carries the supervisor's own sweep: the escapees it found and killed, none left
    [report] = reports
    assert report is not None and report["remaining"] == []
    assert len(report["found"]) >= 3 and report["killed"]


def test_the_controller_closing_the_connection_stops_the_job(jobs: Jobs) -> None:
    run = jobs.start(jid("t-eof"), ["sh", "-c", JOB_WITH_ESCAPEE], grace=0.5)
    wait_running(jid("t-eof"))
    run.stream.close_stdin()
    frames = drain(run)
    assert any(k == "E" and "connection closed" in t for k, t in frames), frames
    assert wait_gone(jid("t-eof")) == []


def test_a_kill_byte_stops_the_job_without_grace(jobs: Jobs) -> None:
    run = jobs.start(jid("t-kill"), ["sh", "-c", JOB_WITH_ESCAPEE], grace=30)
    wait_running(jid("t-kill"))
    sent = time.time()
    run.stream.send(b"k")
    reports: list[dict | None] = []
    frames = drain(run, timeout=60, heartbeat=True, reports=reports)
    # when the job ended by the supervisor's own clock (this machine's), not when its exit
    # report arrived: the after-exit scan of /proc and the frames are what load stretches
    [report] = reports
    assert frames[-1] == ("X", "-9") and report is not None, (frames, reports)
    assert report["ended_at"] - sent < 10, report  # the 30 s grace was not waited for
    assert wait_gone(jid("t-kill")) == []


def test_stop_mode_stops_one_job_and_never_touches_another(jobs: Jobs) -> None:
    a = jobs.start(jid("t-stop-a"), ["sh", "-c", JOB_WITH_ESCAPEE])
    b = jobs.start(jid("t-stop-b"), ["sh", "-c", JOB_WITH_ESCAPEE])
    wait_running(jid("t-stop-a"))
    wait_running(jid("t-stop-b"))
    b_before = find_job_processes(jid("t-stop-b"), 0)
    sup = supervisor_path(str(jobs.root / "w"))
    res = jobs.conn.run(
        [
            sys.executable,
            sup,
            "stop",
            "--job-id",
            jid("t-stop-a"),
            "--run-dir",
            str(jobs.root / "w" / "runs" / jid("t-stop-a")),
            "--rank",
            "0",
            "--grace",
            "0.5",
        ],
        timeout=30,
    )
    out = last_data(res.stdout)
    assert out["remaining"] == [] and len(out["found"]) >= 3
    assert find_job_processes(jid("t-stop-a"), None) == []
    assert find_job_processes(jid("t-stop-b"), 0) == b_before  # same processes, all alive
    assert drain(a, heartbeat=True)[-1][0] == "X"
    b.stream.send(b"k")
    drain(b, heartbeat=True)
    assert wait_gone(jid("t-stop-b")) == []


def test_a_job_that_cannot_start_is_reported_not_hung(jobs: Jobs) -> None:
    from fleetctl.errors import LaunchError

    with pytest.raises(LaunchError, match="cannot start job"):
        jobs.start(jid("t-nostart"), ["/nonexistent/launcher"])


def test_run_job_locally_records_a_failure_and_collects_logs(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "fail.py").write_text(
        "import os, sys\nprint('rank', os.environ['RANK'], 'args', sys.argv[1:])\nsys.exit(4)\n"
    )
    node = Node.localhost(workdir=str(tmp_path / "w"))
    spec = JobSpec(script="fail.py", job_id=jid("t-local-run"), args=("a b", ";"), launcher="plain")
    events = []
    result = run_job(
        spec,
        [node],
        RunOptions(
            runs_dir=tmp_path / "runs",
            hosts=Hosts(check=False),
            push=PushRequest(code),
            supervision=Supervision(grace=1),
            before_launch=lambda nodes, settings: None,  # `run --before`'s phase
        ),
        on_event=events.append,
    )
    assert result.exit_code == 3 and result.status == "failed"
    assert result.first_failure == 0 and result.nodes[0].exit_code == 4
    folder = tmp_path / "runs" / jid("t-local-run")
    job = json.loads((folder / "job.json").read_text())
    assert job["status"] == "failed" and job["first_failure"]["exit_code"] == 4
    assert json.loads((folder / "plan.json").read_text())["job_id"] == jid("t-local-run")
    console = (folder / f"0-{node.name}" / "console.log").read_text()
    assert console == f"rank 0 args {['a b', ';']!r}\n"
    assert (folder / f"0-{node.name}" / "supervisor.json").is_file()
    assert oct(folder.stat().st_mode & 0o777) == "0o700"
    assert any(e.kind == "lines" and e.lines[0].startswith("rank 0") for e in events)
    assert result.teardown is not None and result.teardown.verified
    # every phase event says its stable name (the metrics' label), the post-mortem's too
    said = [(e.text.split(" ")[0], e.phase) for e in events if e.kind == "phase"]
    assert said == [
        *(("connecting", "connect"), ("pushing", "push"), ("before", "before")),
        *(("launching", "run"), ("checking", "post_mortem"), ("collecting", "collect")),
    ]
    assert "exit" in (folder / "events.log").read_text()


def test_a_detached_job_outlives_the_channel_and_status_and_stop_find_it(jobs: Jobs) -> None:
    run = jobs.start(jid("t-detach"), ["sh", "-c", "echo started; sleep 300"], detach=True)
    frames = drain(run)  # the channel ends at once: the supervisor double-forked
    assert [k for k, _ in frames] == ["Q"]
    run_dir = str(jobs.root / "w" / "runs" / jid("t-detach"))
    sup = supervisor_path(str(jobs.root / "w"))
    wait_for("the detached job's output", lambda: Path(run_dir, "console.log").is_file())
    wait_running(jid("t-detach"), count=1)
    status = last_data(
        jobs.conn.run([sys.executable, sup, "status", "--run-dir", run_dir], timeout=30).stdout
    )
    assert status["state"] == "running" and status["supervisor_alive"] and status["processes"]
    assert status["deadman"] is None  # no dead-man switch for detached jobs
    res = jobs.conn.run(
        [
            sys.executable,
            sup,
            "stop",
            "--job-id",
            jid("t-detach"),
            "--run-dir",
            run_dir,
            "--grace",
            "1",
        ],
        timeout=30,
    )
    assert last_data(res.stdout)["remaining"] == []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = json.loads(Path(run_dir, "supervisor.json").read_text())
        if state["state"] != "running":
            break
        time.sleep(0.1)
    assert state["state"] == "exited" and state["signal"] == 15
    assert Path(run_dir, "console.log").read_text() == "started\n"


def test_an_nccl_flight_recorder_dump_is_collected_and_listed(tmp_path: Path) -> None:
    """A fake job writing where torch's watchdog would (TORCH_FR_DUMP_TEMP_FILE + rank)."""
    from fleetctl.cli.render_summary import run_summary_lines

    code = tmp_path / "code"
    code.mkdir()
    (code / "timeout.py").write_text(
        "import os, sys\n"
        "with open(os.environ['TORCH_FR_DUMP_TEMP_FILE'] + os.environ['RANK'], 'wb') as f:\n"
        "    f.write(b'trace')\n"
        "sys.exit(6)\n"
    )
    node = Node.localhost(workdir=str(tmp_path / "w"))
    spec = JobSpec(script="timeout.py", job_id=jid("t-nccl"), launcher="plain", backend="nccl")
    result = run_job(
        spec,
        [node],
        RunOptions(
            runs_dir=tmp_path / "runs",
            hosts=Hosts(check=False),
            push=PushRequest(code),
            supervision=Supervision(grace=1),
        ),
    )
    assert result.exit_code == 3
    trace = tmp_path / "runs" / jid("t-nccl") / f"0-{node.name}" / "nccl_trace_rank_0"
    assert trace.read_bytes() == b"trace"
    assert result.nccl_traces() == [str(trace)]
    assert f"NCCL flight-recorder dump: {trace}" in run_summary_lines(result)
    assert result.to_dict()["nccl_traces"] == [str(trace)]


def test_the_log_on_disk_keeps_the_bytes_the_terminal_gets_them_escaped(tmp_path: Path) -> None:
    import io

    from fleetctl.cli.render import LiveLog

    code = tmp_path / "code"
    code.mkdir()
    (code / "osc.py").write_text("print('hi \\x1b]0;title\\x07 \\x1b[32mgreen\\x1b[0m')\n")
    node = Node.localhost(workdir=str(tmp_path / "w"))
    out = io.StringIO()
    live = LiveLog(colour=False, out=out, err=io.StringIO())
    spec = JobSpec(script="osc.py", job_id=jid("t-osc"), launcher="plain")
    result = run_job(
        spec,
        [node],
        RunOptions(runs_dir=tmp_path / "runs", hosts=Hosts(check=False), push=PushRequest(code)),
        on_event=live,
    )
    assert result.exit_code == 0
    console = (tmp_path / "runs" / jid("t-osc") / f"0-{node.name}" / "console.log").read_bytes()
    assert b"hi \x1b]0;title\x07 \x1b[32mgreen\x1b[0m\n" in console
    assert f"[0 {node.name}] hi \\x1b]0;title\\x07 \x1b[32mgreen\x1b[0m\n" in out.getvalue()


LONG_LINES = """\
import sys
out = sys.stdout.buffer
out.write(b"before\\n")
out.write(b"x" * (20 << 20) + b"\\n")           # 20 MB in one line
out.write(("é" * 100_000).encode() + b"\\n")   # 200 kB of two-byte characters
out.write(b"after\\n")
out.write(b"y" * 70_000)                         # no newline at the end
out.flush()
"""


def test_a_20_mb_line_arrives_as_one_line_and_stays_byte_exact_in_console_log(
    jobs: Jobs, tmp_path: Path
) -> None:
    from fleetctl.phases.frames import MAX_VIEW_LINE
    from fleetctl.phases.watch import Watch

    run_dir = jobs.root / "w" / "runs" / jid("t-long")
    run = jobs.start(jid("t-long"), [sys.executable, "-c", LONG_LINES], cwd=str(run_dir))
    watch = Watch(heartbeat=0.2)
    watch.attach(run)
    assert watch.wait_ended(60.0) == []
    lines: list[str] = []
    while not watch.events.empty():
        ev = watch.events.get_nowait()
        if ev.kind == "lines":
            lines.extend(ev.lines)
    watch.close()
    assert len(lines) == 5, [line[:40] for line in lines]
    before, long, wide, after, tail = lines
    assert (before, after) == ("before", "after")
    marker = f" … [line cut at {MAX_VIEW_LINE} of {20 << 20} bytes; whole in console.log]"
    assert long == "x" * MAX_VIEW_LINE + marker  # one line, cut for the live view only
    assert wide == "é" * 100_000  # whole: no replacement characters at piece boundaries
    assert tail == "y" * 70_000
    expected = (
        b"before\n"
        + b"x" * (20 << 20)
        + b"\n"
        + ("é" * 100_000).encode()
        + b"\nafter\n"
        + b"y" * 70_000
    )
    assert (run_dir / "console.log").read_bytes() == expected  # byte-exact, no newline added


def _local_nodes_run(
    tmp_path: Path, n: int, script: str, job_id: str, *, fanout: int
) -> tuple[JobResult, Path]:
    """``script`` (ok.py) on ``n`` local nodes, the fan-out ``fanout`` wide: its result and run
    folder."""
    from fleetctl.ssh.fanout import FanOut

    code = tmp_path / "code"
    code.mkdir()
    (code / "ok.py").write_text(script)
    nodes = [Node.localhost(name=f"l{i}", workdir=str(tmp_path / f"w{i}")) for i in range(n)]
    spec = JobSpec(script="ok.py", job_id=jid(job_id), launcher="plain")
    options = RunOptions(
        runs_dir=tmp_path / "runs",
        hosts=Hosts(check=False),
        push=PushRequest(code),
        supervision=Supervision(grace=1),
    )
    with FanOut(nodes, options.settings, fanout=fanout) as fleet:
        return run_job(spec, nodes, options, fleet=fleet), tmp_path / "runs" / jid(job_id)


def test_routine_starts_and_ends_wait_for_the_throttled_write_and_the_end_writes_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """job.json is rewritten whole: a node's routine start or exit is written with the next
    throttled save (SAVE_EVERY), not at once — with the throttle never due, six nodes' starts
    and exits make no write of their own, and the job's end writes every one of them."""
    from fleetctl.job.records.runfolder import RunFolder
    from fleetctl.job.run import context

    writes: list[str] = []
    real = RunFolder.write_job
    monkeypatch.setattr(context, "SAVE_EVERY", 3600.0)
    monkeypatch.setattr(RunFolder, "write_job", lambda f, j: (writes.append(j.status), real(f, j)))
    result, folder = _local_nodes_run(tmp_path, 6, "print('ok')\n", "t-throttle-1", fanout=6)
    assert result.exit_code == 0, result.to_dict()
    # created, launched (running), ended: none of the 12 node events wrote on its own
    assert writes == ["starting", "running", "succeeded"], writes
    job = json.loads((folder / "job.json").read_text())
    assert [(n["state"], n["exit_code"]) for n in job["nodes"]] == [("succeeded", 0)] * 6


def test_more_nodes_than_the_fanout_all_start_and_job_json_books_every_phase(
    tmp_path: Path,
) -> None:
    """Launch and collect run at most ``fanout`` nodes at once: three nodes through one worker
    still all run; job.json's ``phases`` name each phase with the controller's CPU so far."""
    script = "import os\nprint('rank', os.environ['RANK'], flush=True)\n"
    result, folder = _local_nodes_run(tmp_path, 3, script, "t-fanout-1", fanout=1)
    assert result.exit_code == 0, result.to_dict()
    assert [n.exit_code for n in result.nodes] == [0, 0, 0]
    for i in range(3):
        assert (folder / f"{i}-l{i}" / "console.log").read_text() == f"rank {i}\n"
    phases = json.loads((folder / "job.json").read_text())["phases"]
    assert [p["phase"].split(" ")[0] for p in phases] == [
        "connecting",
        "pushing",
        "launching",
        "collecting",
        "done:",
    ]
    assert phases[-1]["phase"] == "done: succeeded"
    cpu = [p["cpu"] for p in phases]
    assert cpu == sorted(cpu) and cpu[-1] > 0
