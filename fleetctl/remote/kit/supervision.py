"""One job on this node (mode ``run``): start it, copy its output, watch the controller, stop it.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import threading
import time

from .atomic import now, read_json, write_json
from .container_guard import start_guard
from .containers import client_half, end_containers, main_pid, stopped_code, tells_pid
from .jobprocs import adopt_port_claims, become_subreaper, stop_processes
from .output import Out, gap_note, write_all, write_problem
from .pace import pace_file, watch_pace
from .procfs import pid_alive, proc_stat
from .ranktail import MAX_LINE, RankTail
from .rankwatch import RankWatch
from .records import RecordError, SupervisorSpec, SupervisorState, read_state
from .spec import seed_work_folder
from .wire import (
    CONSOLE_LOG,
    HEARTBEAT_FILE,
    PROGRESS_FILE,
    PROTOCOL,
    RANK_PIDS,
    STATE_FILE,
    STOP_REQUEST,
)

ECHO_WINDOW = 10000  # rank 0 lines paddle may still copy to its stdout
ECHO_LOOKAHEAD = 64  # how far past an unmatched (torn) echo a copy is looked for
MAX_DEADMAN = 10.0


class Supervisor(RankTail):
    """One job on this node: start it, copy its output, watch the controller, stop it."""

    def __init__(
        self, spec: SupervisorSpec, out: Out, stdin_fd: int | None, early: bytes = b""
    ) -> None:
        self.spec = spec
        self.out = out
        self.stdin_fd = stdin_fd
        self.early = early
        self.job_id = spec.job_id
        self.rank = spec.node_rank
        self.run_dir = os.path.abspath(os.path.expanduser(spec.run_dir))
        self.grace = spec.grace
        self.deadman = min(spec.deadman, MAX_DEADMAN)
        self.hb_every = spec.heartbeat
        self.detach = spec.detach
        self.proc: subprocess.Popen | None = None
        self.leader_start: int | None = None
        self.subreaper = False  # set in start(): orphans of the job come back to us
        self.guard = None  # --image: the container guard (container_guard.py), started in start()
        self.guard_problem: str | None = None  # why there is none
        self.container_pid: int | None = None  # --image: its main process, found by the scan
        self.last_hb = time.monotonic()
        self.stop_request: tuple[float, str] | None = None  # (grace, reason)
        self.stop_reason: str | None = None
        self.leftovers: dict | None = None  # the after-exit scan, reported with ``X``
        self.ended_at: float | None = None  # when the launcher ended (this node's clock)
        self.stop_asked = False  # a stop had reached us before the launcher ended
        self.stopped: dict = {}  # what a requested stop found and killed
        self.lock = threading.Lock()
        self.log = None
        self.log_problem: str | None = None  # e.g. "disk full on <run dir>": console.log has gaps
        self.log_lost = 0  # bytes of output console.log could not take since the last write
        self.state = SupervisorState()
        self.listening = False
        self.collect_req = threading.Event()  # ``c``: send the run folder, then exit
        self.released = threading.Event()  # ``c`` or EOF: nothing more to wait for
        self.port_claims: list = []  # this job's port claims on this host, freed at the end
        self.emit_lock = threading.Lock()  # one line at a time into console.log and the stream
        self.tail_lock = threading.Lock()  # one reader at a time per rank file (pump, tailer)
        self.rank_files: dict = {}  # rank log path -> [offset, pending bytes, tag]
        # paddle copies local rank 0's workerlog to its stdout: those lines already went out
        # as ``[rank G]`` lines from the file; the pump drops the copies (see _is_echo)
        self.echo_path: str | None = None
        self.echo_lines: collections.deque = collections.deque(maxlen=ECHO_WINDOW)
        self.rank_pids: dict = {}  # local rank -> pids (a launcher restart adds one)
        self.stream_closed = False  # the controller's channel closed (it may reattach)
        self.begun = False  # the job's own first line or progress touch here (begin())
        # detached: the progress markers the monitor judges (no controller reads our lines)
        pace = spec.pace if spec.detach else None
        self.tally = None
        if pace is not None:  # here: its import (dataclasses, the shapes' regexes) is ~10 ms
            from .progress import Tally  # of CPU per start, and an attached run never needs it

            self.tally = Tally(pace.get("progress_regex"))

    # -- setup --------------------------------------------------------------------------
    def prepare(self) -> None:
        runs = os.path.dirname(self.run_dir)
        os.makedirs(runs, mode=0o700, exist_ok=True)
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        try:
            old = read_state(os.path.join(self.run_dir, STATE_FILE)) or SupervisorState()
        except RecordError:  # not a record of a running job: this job's replaces it
            old = SupervisorState()
        if old.state == "running" and pid_alive(old.supervisor_pid, old.supervisor_start):
            raise RuntimeError(
                f"job {self.job_id} is already running here (supervisor pid {old.supervisor_pid})"
            )
        for rel, content in self.spec.files.items():
            path = rel if os.path.isabs(rel) else os.path.join(self.run_dir, rel)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                f.write(content)
        # the work folder is seeded whole; cwd may be the script's folder inside it
        seed_work_folder(self.spec.work or self.spec.cwd, self.spec.work_seed)
        # unbuffered: a failed write (disk full) fails there and then, never again at close()
        self.log = open(os.path.join(self.run_dir, CONSOLE_LOG), "ab", buffering=0)  # noqa: SIM115
        with contextlib.suppress(FileNotFoundError):  # begun is this job's, not a past one's
            os.unlink(os.path.join(self.run_dir, PROGRESS_FILE))
        self.port_claims = adopt_port_claims(self.job_id)

    def child_env(self) -> dict:
        env = dict(os.environ)
        for key in ("FLEET_SUPERVISOR",):
            env.pop(key, None)
        env.update(self.spec.env)
        prepend = [os.path.expanduser(p) for p in self.spec.path_prepend]
        if prepend:
            env["PATH"] = os.pathsep.join([*prepend, env.get("PATH", "/usr/bin:/bin")])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["FLEET_JOB_ID"] = self.job_id
        env["FLEET_NODE_RANK"] = str(self.rank)
        env["FLEET_RUN_DIR"] = self.run_dir
        env["FLEET_PROGRESS_FILE"] = os.path.join(self.run_dir, PROGRESS_FILE)
        return env

    def start(self) -> None:
        cwd = os.path.expanduser(self.spec.cwd or self.run_dir)
        if self.spec.container:  # before the subreaper: the guard must not end up under us
            self.guard, self.guard_problem = start_guard(
                self.spec.container, self.job_id, self.rank, self.run_dir, self.grace
            )
        self.subreaper = become_subreaper()  # before the job: its orphans come back here
        self.proc = subprocess.Popen(
            list(self.spec.argv),
            cwd=cwd,
            env=self.child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
        st = proc_stat(self.proc.pid)
        self.leader_start = st[3] if st else None
        me = proc_stat(os.getpid())
        self.state = SupervisorState(
            protocol=PROTOCOL,
            job_id=self.job_id,
            node_rank=self.rank,
            run_dir=self.run_dir,
            cwd=cwd,
            argv=list(self.spec.argv),
            pid=self.proc.pid,
            pgid=self.proc.pid,
            leader_start=self.leader_start,
            supervisor_pid=os.getpid(),
            supervisor_start=me[3] if me else None,
            subreaper=self.subreaper,
            start_time=now(),
            detached=self.detach,
            deadman=None if self.detach else self.deadman,
            grace=self.grace,
            state="running",
        )
        write_json(os.path.join(self.run_dir, STATE_FILE), self.state.to_dict())

    # -- threads ------------------------------------------------------------------------
    def pump(self) -> None:
        """Job output -> console.log (byte-exact) and the controller, line by line.

        Reads at most ``MAX_LINE`` bytes at a time (bounded memory): a longer line goes out as
        ``C`` frames (a piece of a line that goes on) ended by its ``L`` frame, so it arrives
        as one line; console.log gets the bytes exactly as the job wrote them."""
        assert self.proc is not None and self.proc.stdout is not None
        src = self.proc.stdout
        while True:
            line = src.readline(MAX_LINE)
            if not line:
                break
            # readline returns less than MAX_LINE without a newline only at EOF: the line ends
            ends = line.endswith(b"\n") or len(line) < MAX_LINE
            if self.echo_path is not None and ends and self._is_echo(line):
                continue
            self.emit(line, ends=ends)
            if not self.begun and not self.spec.rank_logs:  # the launcher's lines are the ranks'
                self.begin()

    def begin(self) -> None:
        """The job's start-up is over on this node: a rank wrote its first output (where the
        ranks write files of their own, the launcher's lines do not count). ``--stall-timeout``
        counts from the first node's begin or progress touch (``--startup-timeout`` before):
        ``P`` now for the controller, and the progress file (which a touch of the job's makes
        too) exists from now on, for ``status`` (a detached job's monitor)."""
        if self.begun:
            return
        self.begun = True
        path = os.path.join(self.run_dir, PROGRESS_FILE)
        with contextlib.suppress(OSError), open(path, "ab"):
            pass
        self.out.frame("P", repr(time.time()).encode())

    def _is_echo(self, line: bytes) -> bool:
        """Whether a launcher stdout line is paddle's copy of a line of local rank 0's file.
        paddle reads the file to print it, so the line is in the file by now: read the file
        first (its lines go out tagged), then match among the next lines not yet echoed."""
        self._tail_path(self.echo_path or "", final=False)
        text = line.rstrip(b"\n")
        with self.tail_lock:
            for i, seen in enumerate(self.echo_lines):
                if seen == text:
                    for _ in range(i + 1):
                        self.echo_lines.popleft()
                    return True
                if i >= ECHO_LOOKAHEAD:
                    break
        return False

    def emit(self, line: bytes, *, ends: bool, log: bytes | None = None) -> None:
        """One line (or a piece of a long one, ``ends`` False) into console.log (``log``: other
        bytes than the line itself) and the stream; the pump and the rank tailer both come
        here, so lines never splice."""
        kind, text = "L" if ends else "C", line[:-1] if line.endswith(b"\n") else line
        with self.emit_lock:
            if self.tally is not None and ends:
                self.tally.line(text)
            self.write_log(line if log is None else log)
            if self.log_problem is None:
                self.out.frame(kind, text)
            else:  # no copy on this node's disk: the controller's must not drop any
                self.out.frame_or_wait(kind, text)

    def write_log(self, data: bytes) -> None:
        """Append to console.log. When the disk is full the job goes on, and so does the
        stream to the controller (which keeps its own copy): say so once (``E``), count what
        was lost, and once writes work again mark the gap in the log."""
        if self.log is None:
            return
        try:
            if self.log_lost:
                write_all(self.log, gap_note(self.log_lost, self.log_problem))
                self.log_lost = 0
            write_all(self.log, data)
        except OSError as e:
            self.log_lost += len(data)
            if self.log_problem is None:
                self.log_problem = write_problem(e, self.run_dir)
                self.out.frame(
                    "E",
                    f"{self.log_problem}: console.log on the node misses output from here "
                    "on; the stream to fleetctl goes on".encode(),
                    must=True,
                )

    def watch_rank_pids(self, done: threading.Event) -> None:
        """Which process is which local rank, and how each ended (:class:`RankWatch`), into
        ``rank_pids.json`` for the controller's ``ranks.json``."""
        assert self.proc is not None
        if self.spec.one_process:  # no launcher between: our child is local rank 0
            self.rank_pids = {"0": [self.proc.pid]}
            write_json(os.path.join(self.run_dir, RANK_PIDS), self.rank_pids)
            return
        try:
            expected = int(self.spec.env.get("FLEET_NPROC_PER_NODE") or 1)
        except ValueError:
            expected = 1

        def stopping() -> bool:
            with self.lock:
                return self.stop_request is not None

        watch = RankWatch(
            self.run_dir, self.out, self.rank_pids, expected, self.rank_root, stopping
        )
        watch.run(done)

    def rank_root(self) -> int | None:
        """Where the ranks are: under the launcher, or (``--image``) under the container's
        main process, a host pid whose parent is the runtime's conmon, not the supervisor
        (None until it runs: the runtime's client carries the job's env, no rank's pid)."""
        assert self.proc is not None
        cfg = self.spec.container
        if not tells_pid(cfg):
            return self.proc.pid
        if self.container_pid is None:
            self.container_pid = main_pid(cfg)
        return self.container_pid

    def heartbeats(self, done: threading.Event) -> None:
        """``H`` every heartbeat; ``P`` when the job touched its progress file since the last
        one (``FLEET_PROGRESS_FILE``: a job that prints nothing for long can still say it
        moves, so ``--stall-timeout`` does not take it for hung)."""
        path = os.path.join(self.run_dir, PROGRESS_FILE)
        seen = None
        while not done.wait(self.hb_every):
            self.out.frame("H")
            try:
                mtime = os.stat(path).st_mtime
            except OSError:
                continue
            if mtime != seen:
                seen = mtime
                self.out.frame("P", repr(mtime).encode())

    def listen(self) -> None:
        """Controller bytes: heartbeats and stop requests; EOF means the controller is gone."""
        self._handle(self.early)
        while True:
            try:
                data = os.read(self.stdin_fd, 4096)  # type: ignore[arg-type]
            except OSError:
                data = b""
            if not data:
                if not self.spec.reattach:
                    self.request_stop(self.grace, "controller connection closed (dead-man switch)")
                # else the controller may come back over a new connection (``reattach``): the
                # job runs on while its heartbeats come, and the dead-man window stays the bound
                self.stream_closed = True
                self.released.set()
                return
            self._handle(data)

    def silence(self) -> float:
        """Seconds since the controller was last heard: on this channel, or through a
        ``reattach`` over a new connection (the heartbeat file)."""
        quiet = time.monotonic() - self.last_hb
        if quiet > self.deadman and self.spec.reattach:
            with contextlib.suppress(OSError):
                age = time.time() - os.stat(os.path.join(self.run_dir, HEARTBEAT_FILE)).st_mtime
                quiet = min(quiet, max(0.0, age))
        return quiet

    def _handle(self, data: bytes) -> None:
        if not data:
            return
        self.last_hb = time.monotonic()
        if b"c" in data:
            self.collect_req.set()
            self.released.set()
        if b"k" in data:
            self.request_stop(0.0, "kill requested by the controller")
        elif b"t" in data:
            self.request_stop(self.grace, "stop requested by the controller")

    def request_stop(self, grace: float, reason: str) -> None:
        with self.lock:
            if self.stop_request is None or grace < self.stop_request[0]:
                self.stop_request = (grace, reason)

    # -- main loop ----------------------------------------------------------------------
    def supervise(self) -> int:
        assert self.proc is not None
        done = threading.Event()
        pump = threading.Thread(target=self.pump, daemon=True)
        pump.start()
        ranks_done = threading.Event()
        tailer = None
        cfg = self.spec.rank_logs or {}
        if cfg.get("echo") is not None:
            root = os.path.join(self.run_dir, str(cfg.get("dir") or ""))
            self.echo_path = os.path.join(root, str(cfg["echo"]))
        if cfg:
            tailer = threading.Thread(target=self.tail_ranks, args=(ranks_done,), daemon=True)
            tailer.start()
        threading.Thread(target=self.watch_rank_pids, args=(done,), daemon=True).start()
        if self.spec.pace is not None:  # where the ranks are: ``W`` (detached: a file)
            ranks = lambda: {k: v[-1] for k, v in list(self.rank_pids.items())}  # noqa: E731
            send = lambda said: self.out.frame("W", said)  # noqa: E731
            if self.detach:
                send = pace_file(self.run_dir)
            args = (self.spec.pace, ranks, send, done, self.tally)
            threading.Thread(target=watch_pace, args=args, daemon=True).start()
        if not self.detach:
            threading.Thread(target=self.heartbeats, args=(done,), daemon=True).start()
            threading.Thread(target=self.listen, daemon=True).start()
            self.listening = True
        stopping_with: float | None = None
        stopper: threading.Thread | None = None
        while self.proc.poll() is None:
            if not self.detach and self.silence() > self.deadman:
                self.request_stop(
                    self.grace,
                    f"no heartbeat from the controller for {self.deadman:g}s (dead-man switch)",
                )
            with self.lock:
                req = self.stop_request
            if req is not None and (stopping_with is None or req[0] < stopping_with):
                stopping_with = req[0]
                self.stop_reason = req[1]
                self.out.frame("E", f"stopping job: {req[1]}".encode(), must=True)
                stopper = threading.Thread(target=self._stop, args=(req[0],), daemon=True)
                stopper.start()
            time.sleep(0.05)
        code = self.proc.returncode
        # --image: rootless podman's client may end 0 on SIGTERM while its other half waits
        half = None
        if code == 0 and self.spec.container and self.subreaper:
            half = client_half(self.proc.pid)
        # What only this node knows for sure: when its launcher ended, and whether it had been
        # told to stop by then (ended by the teardown) or ended on its own (failed first?).
        self.ended_at = now()
        with self.lock:
            self.stop_asked = stopping_with is not None or self.stop_request is not None
        if self.stop_reason is None:  # stopped from another terminal: say so to the controller
            req = read_json(os.path.join(self.run_dir, STOP_REQUEST))
            if req.get("job_id") == self.job_id and req.get("reason"):
                self.stop_reason = str(req["reason"])
                self.out.frame("E", f"stopping job: {self.stop_reason}".encode(), must=True)
        # `fleetctl stop` (another terminal) leaves its request before it signals the job
        self.stop_asked = self.stop_asked or self.stop_reason is not None
        if stopper is not None:  # let the stop finish its grace period for the workers
            stopper.join((stopping_with or 0.0) + 6.0)
        # The launcher is gone; anything of the job still alive is a straggler.
        left = stop_processes(
            self.job_id,
            self.rank,
            self.proc.pid,
            self.leader_start,
            min(self.grace, 2.0) if stopping_with is None else 0.0,
            root=os.getpid() if self.subreaper else None,
        )
        self.leftovers = {
            "found": sorted({*self.stopped.get("found", []), *left["found"]}),
            "killed": sorted({*self.stopped.get("killed", []), *left["killed"]}),
            "remaining": left["remaining"],
        }
        if left["found"]:
            self.out.frame(
                "E", f"stopped {len(left['found'])} leftover process(es) of the job".encode()
            )
        self.end_containers()
        sweep = (self.state.containers, self.leftovers, self.stopped)
        code = stopped_code(
            code, half, self.spec.container, self.stop_asked, self.container_pid, *sweep
        )
        pump.join(5.0)
        if tailer is not None:  # the ranks' last words, partial lines included
            ranks_done.set()
            tailer.join(10.0)
        done.set()
        st = self.state
        st.state = "stopped" if self.stop_reason else "exited"
        st.exit_code, st.signal = (code, None) if code >= 0 else (None, -code)
        st.end_time, st.stop_reason, st.remaining = now(), self.stop_reason, left["remaining"]
        st.dropped_frames, st.problem = self.out.dropped, self.log_problem
        st.exit_report = self.exit_report()
        with contextlib.suppress(OSError):
            write_json(os.path.join(self.run_dir, STATE_FILE), st.to_dict())
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.close()
        return code

    def end_containers(self) -> None:
        """``--image``: every container labelled with the job stopped, removed, listed again;
        what is still there (or could not be listed) is said, never hidden."""
        cfg = self.spec.container
        if not cfg:
            return
        ended = end_containers(cfg, self.grace)
        self.state.containers = ended
        if ended["problem"]:
            self.out.frame("E", f"containers of the job: {ended['problem']}".encode(), must=True)
        if self.guard is not None:  # verified: the guard may go; else it tries the end too,
            # but not after a runtime that did not answer in time: it would hang the guard as
            # long again, a process of ours left after the job's end was reported (the report
            # names the hung call and the container for the operator)
            self.guard.release(ended["problem"] is None or bool(ended.get("hung")))
        if self.guard_problem:
            self.out.frame("E", self.guard_problem.encode(), must=True)

    def exit_report(self) -> dict | None:
        """What the ``X`` frame says after the code: the after-exit scan, when the launcher
        ended, whether a stop had been asked, a node problem ("disk full on …")."""
        if self.leftovers is None:
            return None
        said = {
            **{k: self.leftovers.get(k, []) for k in ("found", "killed", "remaining")},
            "ended_at": self.ended_at,
            "stop_asked": self.stop_asked and self.node_stop() is None,
        }
        if self.node_stop():  # not the controller's stop: it blames this node
            said["node_stop"] = self.node_stop()
        if self.log_problem:
            said["problem"] = self.log_problem
        ended = self.state.containers
        if isinstance(ended, dict) and ended.get("problem"):  # --image: the end not verified
            said["containers"] = {k: ended.get(k) for k in ("problem", "remaining", "hung")}
        return said

    def node_stop(self) -> str | None:
        """The node's own stop (SIGTERM/SIGINT to us: a shutdown, a reboot, someone there)."""
        why = self.stop_reason or (self.stop_request or (0.0, ""))[1]
        return why if why.startswith("supervisor got SIG") else None

    def _stop(self, grace: float) -> None:
        self.stopped = stop_processes(
            self.job_id,
            self.rank,
            self.proc.pid if self.proc else None,
            self.leader_start,
            grace,
            reap=self.proc,
            root=os.getpid() if self.subreaper else None,
        )


def ignore_signal(signum: int, frame: object) -> None:
    """A handler (not SIG_IGN) so the job's processes get default dispositions after exec."""
