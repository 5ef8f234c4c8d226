"""The supervisor's one-shot modes: ``stop``, ``status``, ``mark-stop``, ``follow``,
``reattach``, ``clean``; each one remote command answering frames.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time

from .atomic import read_json, write_json
from .framing import frame
from .framing import line as framed
from .jobprocs import find_job_processes, stop_processes
from .procfs import cmdline, environ_entries, pid_alive, pids, proc_stat
from .records import RecordError, SupervisorState, read_state
from .wire import (
    CONSOLE_LOG,
    HEARTBEAT_FILE,
    PROGRESS_FILE,
    RANKS_ENDED,
    STATE_FILE,
    STOP_REQUEST,
)


def parse_opts(argv: list[str]) -> dict:
    opts: dict = {}
    i = 0
    while i < len(argv):
        key = argv[i]
        if not key.startswith("--") or i + 1 >= len(argv):
            raise SystemExit("usage: supervisor.py MODE --job-id J --run-dir D [--rank R]")
        opts[key[2:].replace("-", "_")] = argv[i + 1]
        i += 2
    return opts


def answer(kind: str, payload: object) -> None:
    """One frame of a one-shot mode on stdout: ``<kind> <json>``."""
    frame(kind, payload)


def state_at(run_dir: str) -> SupervisorState | None:
    """A run folder's supervisor.json; None when there is none, or when it is not a record (a
    file of the wrong shape is not trusted to say which processes are the job's)."""
    if not run_dir:
        return None
    try:
        return read_state(os.path.join(run_dir, STATE_FILE))
    except RecordError:
        return None


def cmd_stop(argv: list[str]) -> int:
    """Stop a job on this node (teardown, ``fleetctl stop``); answers ``D <json>`` with what
    was found, killed and remains."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    opts = parse_opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    state = state_at(run_dir) or SupervisorState()
    job_id = opts.get("job_id") or state.job_id
    if not job_id:
        answer("D", {"error": "no job id"})
        return 2
    if state.job_id not in (None, job_id):
        state = SupervisorState()  # a folder of another job: trust only the env tag
    rank = opts.get("rank", state.node_rank)
    sup_pid = state.supervisor_pid
    sup_alive = pid_alive(sup_pid, state.supervisor_start)
    result = stop_processes(
        job_id,
        int(rank) if rank is not None else None,
        state.pgid,
        state.leader_start,
        float(opts.get("grace", 5.0)),
        # a live subreaper supervisor: every descendant of it is the job's
        root=sup_pid if sup_alive and state.subreaper else None,
    )
    result["job_id"] = job_id
    result["supervisor_alive"] = pid_alive(state.supervisor_pid, state.supervisor_start)
    answer("D", result)
    return 0


def cmd_status(argv: list[str]) -> int:
    """State of a job on this node (for ``fleetctl status``): ``D <json>``."""
    opts = parse_opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    problem = None
    try:
        record = read_state(os.path.join(run_dir, STATE_FILE)) or SupervisorState()
    except RecordError as e:  # said, and the job's processes still found by their env tag
        record, problem = SupervisorState(), str(e)
    job_id = opts.get("job_id") or record.job_id
    live = []
    if job_id:
        live = find_job_processes(job_id, record.node_rank, record.pgid, record.leader_start)
    state = record.to_dict()
    state["problem"] = state["problem"] or problem
    state["processes"] = live
    state["supervisor_alive"] = pid_alive(record.supervisor_pid, record.supervisor_start)
    marks = []  # the job moved on: it printed, or touched FLEET_PROGRESS_FILE
    for name in ("console.log", PROGRESS_FILE):
        with contextlib.suppress(OSError):
            marks.append(os.stat(os.path.join(run_dir, name)).st_mtime)
    state["progress"] = max(marks) if marks else None
    # the supervisor makes the progress file at the job's first line or touch (its begin())
    state["begun"] = os.path.exists(os.path.join(run_dir, PROGRESS_FILE))
    state["pace"] = read_json(os.path.join(run_dir, "pace.json")) or None  # detached
    if state["pace"] is not None:  # this node's clock now: the monitor times the markers by it
        state["pace"]["now"] = time.time()
    state["ranks_ended"] = read_json(os.path.join(run_dir, RANKS_ENDED)) or None  # the A frame's
    if state.get("state") == "running" and not state["supervisor_alive"]:
        state["state"] = "lost"
    answer("D", state)
    return 0


def cmd_mark_stop(argv: list[str]) -> int:
    """Leave ``stop-request.json`` (job id, reason) in an existing run folder before a stop from
    another terminal, so the job's supervisor reports why it ended. ``D {"marked": bool}``."""
    opts = parse_opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    marked = bool(run_dir) and os.path.isdir(run_dir)
    if marked:
        record = {"job_id": opts.get("job_id"), "reason": opts.get("reason"), "time": time.time()}
        write_json(os.path.join(run_dir, STOP_REQUEST), record)
    answer("D", {"marked": marked})
    return 0


def cmd_follow(argv: list[str]) -> int:
    """``fleetctl logs``: the job's console.log as ``L <line>`` frames (``E <notice>`` when
    there is none). ``--follow 1`` keeps reading until the job's supervisor has ended and the
    log is read to the end, or stdin closes (fleetctl went away); ``--last N`` starts with the
    last N lines (-1: the whole log)."""
    opts = parse_opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    follow = opts.get("follow", "0") == "1"
    last = int(opts.get("last", "-1"))
    log = os.path.join(run_dir, CONSOLE_LOG)
    out = os.fdopen(1, "wb", 0)

    def running() -> bool:
        state = state_at(run_dir)
        if state is None:
            return os.path.isdir(run_dir) and not os.path.exists(log)
        return state.state == "running" and pid_alive(state.supervisor_pid, state.supervisor_start)

    def emit(line: bytes) -> None:
        out.write(framed("L", line.rstrip(b"\n")))

    deadline = time.time() + 30
    while not os.path.exists(log):
        if not follow or time.time() > deadline or not running():
            out.write(framed("E", b"no console.log on this node (the job never started here)"))
            return 0
        time.sleep(0.2)
    import select

    with open(log, "rb") as f:
        buf = b""
        if last >= 0:
            f.seek(0, 2)
            start = max(0, f.tell() - 262144)
            f.seek(start)
            tail = f.read().split(b"\n")
            if start > 0:
                tail = tail[1:]
            buf = tail[-1] if tail else b""
            for line in tail[:-1][-last:] if last > 0 else []:
                emit(line)
        while True:
            chunk = f.read(65536)
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    emit(line)
                continue
            if not follow:
                break
            alive = running()
            ready, _, _ = select.select([0], [], [], 0.3)
            if ready and not os.read(0, 4096):
                break
            if not alive:
                chunk = f.read()
                if not chunk:
                    break
                buf += chunk
        if buf:
            emit(buf)
    return 0


#: ``reattach`` says ``H`` after this long without a frame: the watcher takes half the
#: lost-node timeout of silence for a broken channel, and the supervisor's own heartbeats go
#: to the old one; without them a quiet job was reattached again and again, then lost.
REATTACH_BEAT = 0.5


def cmd_reattach(argv: list[str]) -> int:
    """The controller, back over a new connection after its channel to ``run`` went silent or
    closed: ``S <json>`` (is the supervisor alive), then the job's console.log from line
    ``--skip`` on as ``L`` frames, ``A`` from ranks_ended.json once every rank ended (the
    supervisor's own ``A`` may have gone down with the old channel; the controller takes the
    first), ``H`` while it says nothing else, and ``X`` from supervisor.json once the
    supervisor ended.
    Every byte on stdin is a heartbeat (the heartbeat file); ``t``/``k`` are relayed to the
    supervisor as SIGUSR2/SIGUSR1 (stop with grace / kill). EOF: the controller is gone."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    opts = parse_opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    skip = int(opts.get("skip", "0"))
    log, hb = os.path.join(run_dir, CONSOLE_LOG), os.path.join(run_dir, HEARTBEAT_FILE)
    state = state_at(run_dir) or SupervisorState()
    pid, start = state.supervisor_pid, state.supervisor_start
    out = os.fdopen(1, "wb", 0)
    lock = threading.Lock()
    gone = threading.Event()

    sent = [time.monotonic()]

    def frame(kind: str, payload: bytes = b"") -> None:
        with lock:
            out.write(framed(kind, payload))
            sent[0] = time.monotonic()

    def beat() -> None:
        with contextlib.suppress(OSError):
            with open(hb, "a"):
                pass
            os.utime(hb, None)

    def relay() -> None:
        while True:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                gone.set()
                return
            beat()
            sig = signal.SIGUSR1 if b"k" in data else signal.SIGUSR2 if b"t" in data else 0
            if sig and pid_alive(pid, start):
                with contextlib.suppress(OSError):
                    os.kill(int(pid), sig)  # type: ignore[arg-type]

    alive = pid_alive(pid, start)
    beat()
    frame("S", json.dumps({"alive": alive, "state": state.state}).encode())
    if not alive and state.state == "running":
        return 0  # the supervisor died without a word: nothing to reattach to
    threading.Thread(target=relay, daemon=True).start()
    seen = 0
    buf = b""
    said: list = []  # the ``A`` frame, once: it may have been lost with the old channel

    def ranks_ended() -> None:
        data = None if said else read_json(os.path.join(run_dir, RANKS_ENDED))
        if data:
            said.append(data)
            frame("A", json.dumps(data, sort_keys=True).encode())

    try:
        f = open(log, "rb")  # noqa: SIM115
    except OSError:
        f = None
    while not gone.is_set():
        now_state = (state_at(run_dir) or SupervisorState()).state
        ended = now_state != "running" or not pid_alive(pid, start)
        chunk = f.read(65536) if f is not None else b""
        if chunk:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                seen += 1
                if seen > skip:
                    frame("L", line)
            continue
        ranks_ended()
        if ended:
            break
        if time.monotonic() - sent[0] >= REATTACH_BEAT:  # a quiet job is not a silent node
            frame("H")
        time.sleep(0.1)
    if gone.is_set():
        return 0
    if buf and seen + 1 > skip:
        frame("L", buf)
    ranks_ended()
    final = state_at(run_dir) or SupervisorState()
    code = final.exit_code if final.exit_code is not None else -(final.signal or 0) or 255
    report = final.exit_report
    frame("X", str(code).encode() + (b" " + json.dumps(report).encode() if report else b""))
    return 0


def cmd_clean(argv: list[str]) -> int:
    """Leftovers of fleetctl jobs here (``fleetctl.testing.infra``): ``D <json>`` with the
    processes of a job (``--job-id``, else of any job) and the temp files under ``--workdir``.

    A process belongs to a job when its environment carries ``FLEET_JOB_ID`` (that id, or any),
    or when it is in the group the job's supervisor recorded and that group's leader is still
    the recorded process. Temp files: ``.tmp-*``, ``*.part``, and ``*.<pid>.tmp`` in run folders.
    """
    opts = parse_opts(argv)
    job = opts.get("job_id")
    workdir = os.path.expanduser(opts.get("workdir", "~/.fleetctl"))
    want = ("FLEET_JOB_ID=" + job).encode() if job else None
    groups: dict = {}
    if job:  # W/runs/<job>/<rank>-<host>/ (and W/runs/<job>/ of older versions)
        job_dir = os.path.join(workdir, "runs", job)
        with contextlib.suppress(OSError):
            for path in [job_dir] + [os.path.join(job_dir, n) for n in os.listdir(job_dir)]:
                state = state_at(path)
                if state is not None and state.pgid:
                    groups[state.pgid] = state.leader_start
    me = os.getpid()
    seen = []
    alive_groups = set()
    for pid in pids():
        if pid == me:
            continue
        st = proc_stat(pid)
        if st is None:
            continue
        if groups.get(pid) is not None and groups[pid] == st[3]:
            alive_groups.add(pid)
        if st[0] in ("Z", "X"):
            continue
        tag = None
        for entry in environ_entries(pid) or ():
            if entry.startswith(b"FLEET_JOB_ID=") and (want is None or entry == want):
                tag = entry[13:].decode("utf-8", "replace")
        seen.append((pid, st[2], tag))
    procs = [
        {"pid": pid, "pgid": pgid, "job_id": tag or job, "cmd": cmdline(pid)}
        for pid, pgid, tag in seen
        if tag is not None or pgid in alive_groups
    ]
    temps: list = []

    def scan(folder: str, runs: bool = False) -> None:
        try:
            names = os.listdir(folder)
        except OSError:
            return
        for n in names:
            pid_tmp = n.endswith(".tmp") and n[:-4].rsplit(".", 1)[-1].isdigit()
            if n.startswith(".tmp-") or n.endswith(".part") or (runs and pid_tmp):
                temps.append(os.path.join(folder, n))

    for sub in ("", "bin", "code", "envs"):
        scan(os.path.join(workdir, sub))
    runs_dir = os.path.join(workdir, "runs")
    try:
        jobs = [job] if job else os.listdir(runs_dir)
    except OSError:
        jobs = []
    for j in jobs:
        scan(os.path.join(runs_dir, j), runs=True)
    answer("D", {"processes": procs, "temp_files": sorted(temps), "workdir": workdir})
    return 0
