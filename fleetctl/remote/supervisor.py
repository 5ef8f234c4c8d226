#!/usr/bin/env python3
"""fleetctl node supervisor: runs ONE job's launcher on one node and stops only that job.

Stdlib only, Python >= 3.8: it is uploaded to ``W/bin/supervisor_<sha12>.py`` and run by the
node's own python. fleetctl starts it over SSH as one streamed command (mode ``run``):

controller -> supervisor (stdin)
    after the supervisor prints ``R``: one JSON line, the spec (argv, env, cwd, run_dir, job_id,
    node_rank, deadman, grace, detach, files, path_prepend, heartbeat); then single bytes:
    ``h`` heartbeat, ``t`` stop the job (grace), ``k`` kill the job now. EOF = controller gone.
supervisor -> controller (stdout), one frame per line, never a partial line:
    ``R`` ready for the spec · ``S <json>`` started (pid, pgid, ...) · ``C <text>`` a piece of a
    line longer than MAX_LINE (its ``L`` frame ends it) · ``L <text>`` one output
    line of the job · ``H`` heartbeat · ``E <text>`` supervisor notice · ``F <text>`` could not
    start · ``Q`` detached · ``X <code> [<json>]`` the job ended (exit code, or -signal), with
    what the scan for the job's processes after the exit found, killed and left.

The job runs in its own session/process group with ``FLEET_JOB_ID``/``FLEET_NODE_RANK`` in its
env. Stopping = SIGTERM to that group and to every process whose /proc/<pid>/environ carries
exactly this job id and node rank (catches ``setsid`` escapees), a grace period, SIGKILL, then a
check that none remain. Never by name pattern, never another job's processes.

Dead-man switch (attached mode): no heartbeat byte for ``deadman`` seconds, or EOF on stdin
(controller killed, connection closed) -> the supervisor stops the job by itself. SIGHUP and
SIGPIPE never kill it: it always finishes teardown and writes its logs.

Other modes, each one remote command answering in the same framing (``D <json>``):
``stop --job-id J --run-dir D [--rank R] [--grace G]`` (what was found, killed, remains),
``status --run-dir D``, ``mark-stop --run-dir D --job-id J --reason R`` (leave
``stop-request.json`` before a stop from another terminal), ``clean [--job-id J] --workdir W``
(leftover processes and temp files, for tests), ``follow --run-dir D --follow 0|1 --last N``
(``L`` lines of console.log), ``pack --run-dir D`` (a ``T`` frame, then a tar of the run
folder: regular files and folders only). This file holds the one /proc/PID/stat parser
(:func:`proc_stat`), imported by the controller too.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import io
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time

PROTOCOL = 1
STATE_FILE = "supervisor.json"
PROGRESS_FILE = "progress"  # FLEET_PROGRESS_FILE: touched by the job when it moves on
CONSOLE_LOG = "console.log"
STOP_REQUEST = "stop-request.json"  # written by `fleetctl stop` (any terminal) before it stops
MAX_LINE = 65536
ECHO_WINDOW = 10000  # rank 0 lines paddle may still copy to its stdout
ECHO_LOOKAHEAD = 64  # how far past an unmatched (torn) echo a copy is looked for
RANK_PIDS = "rank_pids.json"  # local rank -> pids of its processes, for ranks.json
RANK_EXITS = "rank_exits.json"  # how rank processes ended, in order: who failed first
# Touched by ``reattach`` (the controller over a new connection) for each heartbeat it relays:
# the dead-man switch counts it like a heartbeat on the supervisor's own channel.
HEARTBEAT_FILE = "controller-heartbeat"
MAX_DEADMAN = 10.0
OUT_QUEUE = 10000  # frames buffered for a slow controller; beyond that lines go to the log only
COALESCE_BYTES = 32768  # frames joined into one write (about one SSH packet)
LINGER = 120.0  # s after the exit to wait for the controller's ``c`` (collect) or EOF
TAR_MARKER = b'T {"stream": "tar"}\n'  # the frame before a tar stream (fleetctl.phases.collect)
COLLECT_MANIFEST = ".fleetctl-collect.json"  # the tar's first member: what is (not) sent, why
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".json", ".jsonl")
MAX_OPTIONS = 64 << 20  # bytes of collect options on stdin (the controller's file list)


# ------------------------------------------------------------------------------- /proc helpers


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks since boot); None when gone or a zombie.

    With the pid it names one process for good: pids are reused, start times are not.
    """
    st = proc_stat(pid)
    return None if st is None or st[0] in ("Z", "X") else st[3]


# port_probe.py's CLAIMS: host-local, one private folder per user
PORT_CLAIMS = os.environ.get("FLEETCTL_PORT_CLAIMS") or f"/tmp/fleetctl-ports-{os.getuid()}"


def adopt_port_claims(job_id: str) -> list:
    """The port claims made for this job (by the controller's port probe) now name this
    supervisor, so they hold exactly as long as it lives; returns their paths."""
    pid, mine = os.getpid(), []
    try:
        names = [n for n in os.listdir(PORT_CLAIMS) if n.isdigit()]
    except OSError:
        return mine
    for name in names:
        path = os.path.join(PORT_CLAIMS, name)
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if not isinstance(data, dict) or data.get("job") != job_id:
                continue
            data.update(pid=pid, start=proc_start_time(pid))
            tmp = os.path.join(PORT_CLAIMS, f".{name}.{pid}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f)
            os.replace(tmp, path)
            mine.append(path)
        except (OSError, ValueError):
            continue
    return mine


def release_port_claims(paths: list, job_id: str) -> None:
    for path in paths:
        try:
            with open(path, encoding="utf-8") as f:
                if json.load(f).get("job") == job_id:
                    os.unlink(path)
        except (OSError, ValueError, AttributeError):
            continue


def proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, ppid, pgid, starttime) of a process, None when it is gone.

    The one /proc/PID/stat parser of fleetctl: node programs run it here, the controller and
    the lab import it.
    """
    got = _proc_stat_flags(pid)
    return None if got is None else got[:4]


PF_KTHREAD = 0x00200000


def _proc_stat_flags(pid: int) -> tuple[str, int, int, int, int] | None:
    """(state, ppid, pgid, starttime, flags): :func:`proc_stat` and the kernel's flags."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # comm may hold spaces and parentheses: split after the last ')'.
    rest = data[data.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[1]), int(rest[2]), int(rest[19]), int(rest[6])
    except (IndexError, ValueError):
        return None


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the child subreaper (Linux >= 3.4): a descendant of the job that
    leaves its session, process group and environment (``setsid env -i …``) and loses its
    parent is re-parented here, not to init, so the sweep still finds it. False where the
    kernel or libc does not offer it (then only env tags and the group count)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _environ_has(pid: int, tags: list[bytes]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = set(f.read().split(b"\0"))
    except OSError:
        return False
    return all(t in entries for t in tags)


def job_tags(job_id: str, rank: int | None) -> list[bytes]:
    tags = [b"FLEET_JOB_ID=" + job_id.encode()]
    if rank is not None:
        tags.append(b"FLEET_NODE_RANK=" + str(rank).encode())
    return tags


def find_job_processes(
    job_id: str,
    rank: int | None,
    pgid: int | None = None,
    leader_start: int | None = None,
    root: int | None = None,
) -> list[int]:
    """Live (non-zombie) processes of this job here: env-tagged, in its verified group, or
    descendants of ``root`` (the job's supervisor, its children's subreaper)."""
    return scan_job(job_id, rank, pgid, leader_start, root)[0]


def scan_job(
    job_id: str,
    rank: int | None,
    pgid: int | None,
    leader_start: int | None,
    root: int | None = None,
) -> tuple[list[int], bool]:
    """(live pids of the job, whether the recorded process group is still this job's).

    The recorded group counts only when it is still ours (its leader has the recorded start
    time, or a member carries the job's env tag): a recycled pgid never points at strangers.
    Every descendant of ``root`` is the job's whatever its session, group or environment.
    """
    me = os.getpid()
    tags = job_tags(job_id, rank)
    tagged: list[int] = []
    group: list[int] = []
    children: dict[int, list[int]] = {}
    group_ours = False
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == me:
            continue
        st = _proc_stat_flags(pid)
        if st is None or st[4] & PF_KTHREAD:  # kernel threads (thousands on big hosts)
            continue
        if pgid is not None and pid == pgid and leader_start is not None and st[3] == leader_start:
            group_ours = True
        if st[0] in ("Z", "X"):
            continue
        children.setdefault(st[1], []).append(pid)
        has_tag = _environ_has(pid, tags)
        if has_tag:
            tagged.append(pid)
        if pgid is not None and st[2] == pgid:
            group.append(pid)
            group_ours = group_ours or has_tag
    found = set(tagged)
    if group_ours:
        found.update(group)
    todo = list(children.get(root, [])) if root is not None else []
    while todo:  # descendants of the subreaper, at any depth
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return sorted(found), group_ours


def _signal_all(pids: list[int], pgid: int | None, group_ours: bool, sig: int) -> None:
    if pgid is not None and group_ours:
        with contextlib.suppress(OSError):
            os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def stop_processes(
    job_id: str,
    rank: int | None,
    pgid: int | None,
    leader_start: int | None,
    grace: float,
    reap: object = None,
    settle: float = 5.0,
    root: int | None = None,
) -> dict:
    """SIGTERM, wait ``grace``, SIGKILL, wait up to ``settle``: returns what was done and left.

    ``reap`` (a Popen) is polled while waiting so the supervisor's own child never lingers as a
    zombie that would keep its group alive.
    """

    def alive() -> tuple[list[int], bool]:
        if reap is not None:
            reap.poll()  # type: ignore[attr-defined]
        return scan_job(job_id, rank, pgid, leader_start, root)

    first, ours = alive()
    result: dict = {"found": first, "terminated": [], "killed": [], "remaining": []}
    if not first:
        return result
    _signal_all(first, pgid, ours, signal.SIGTERM)
    result["terminated"] = first
    deadline = time.monotonic() + max(0.0, grace)
    left, ours = alive()
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left, ours = alive()
    if left:
        _signal_all(left, pgid, ours, signal.SIGKILL)
        result["killed"] = left
        deadline = time.monotonic() + settle
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left, ours = alive()
            if left:
                _signal_all(left, pgid, ours, signal.SIGKILL)
    result["remaining"] = [{"pid": p, "cmd": _cmdline(p)} for p in left]
    return result


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:200]
    except OSError:
        return ""


# ------------------------------------------------------------------------------------ state


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _now() -> float:
    return round(time.time(), 3)


# ----------------------------------------------------------------------------------- output


class Out:
    """Frames to the controller through one writer thread, so a stalled SSH channel never blocks
    the job, the log or the dead-man switch. Frames are whole lines, written in one call each."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd
        self.q: queue.Queue = queue.Queue(OUT_QUEUE)
        self.dropped = 0
        self.broken = fd is None
        self.thread = threading.Thread(target=self._loop, daemon=True)
        if fd is not None:
            self.thread.start()

    def frame(self, kind: str, payload: bytes = b"", *, must: bool = False) -> None:
        if self.broken:
            return
        data = kind.encode() + (b" " + payload if payload else b"") + b"\n"
        try:
            if must:
                self.q.put(data, timeout=2.0)
            else:
                self.q.put_nowait(data)
        except queue.Full:
            self.dropped += 1

    def frame_or_wait(self, kind: str, payload: bytes) -> None:
        """Like :meth:`frame`, but wait for room instead of dropping: used while console.log
        cannot be written (disk full), when the controller's copy is the only one left. The
        job then waits on its pipe rather than lose lines; only a gone controller drops them."""
        data = kind.encode() + (b" " + payload if payload else b"") + b"\n"
        while not self.broken:
            try:
                self.q.put(data, timeout=1.0)
                return
            except queue.Full:
                continue

    def _loop(self) -> None:
        while True:
            data = self.q.get()
            if data is None:
                return
            # Coalesce what queued meanwhile: one write, and fewer SSH packets for the
            # controller to decrypt, when the job prints fast.
            end = False
            parts = [data]
            size = len(data)
            while size < COALESCE_BYTES:
                try:
                    more = self.q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    end = True
                    break
                parts.append(more)
                size += len(more)
            if len(parts) > 1:
                data = b"".join(parts)
            try:
                view = memoryview(data)
                while view:
                    n = os.write(self.fd, view)  # type: ignore[arg-type]
                    view = view[n:]
            except OSError:
                self.broken = True  # controller gone; the log still gets everything
                return
            if end:
                return

    def close(self, timeout: float) -> None:
        if self.fd is None or not self.thread.is_alive():
            return
        try:
            self.q.put(None, timeout=timeout)
        except queue.Full:
            return
        self.thread.join(timeout)


# -------------------------------------------------------------------------------------- run


def _read_spec(fd: int, timeout: float) -> tuple[dict, bytes]:
    """The JSON spec line from stdin; returns (spec, bytes read past it)."""
    import select

    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError(f"no spec within {timeout:g}s")
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            raise ValueError("stdin closed before the spec")
        buf += chunk
    line, rest = buf.split(b"\n", 1)
    spec = json.loads(line.decode("utf-8"))
    if not isinstance(spec, dict) or not spec.get("argv") or not spec.get("job_id"):
        raise ValueError("spec needs argv and job_id")
    return spec, rest


class Supervisor:
    """One job on this node: start it, copy its output, watch the controller, stop it."""

    def __init__(self, spec: dict, out: Out, stdin_fd: int | None, early: bytes = b"") -> None:
        self.spec = spec
        self.out = out
        self.stdin_fd = stdin_fd
        self.early = early
        self.job_id = str(spec["job_id"])
        self.rank = int(spec.get("node_rank", 0))
        self.run_dir = os.path.abspath(os.path.expanduser(spec["run_dir"]))
        self.grace = float(spec.get("grace", 5.0))
        self.deadman = min(float(spec.get("deadman", MAX_DEADMAN)), MAX_DEADMAN)
        self.hb_every = float(spec.get("heartbeat", 1.0))
        self.detach = bool(spec.get("detach", False))
        self.proc: subprocess.Popen | None = None
        self.leader_start: int | None = None
        self.subreaper = False  # set in start(): orphans of the job come back to us
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
        self.state: dict = {}
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

    # -- setup --------------------------------------------------------------------------
    def prepare(self) -> None:
        runs = os.path.dirname(self.run_dir)
        os.makedirs(runs, mode=0o700, exist_ok=True)
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        old = _read_json(os.path.join(self.run_dir, STATE_FILE))
        if old.get("state") == "running" and _pid_alive(
            old.get("supervisor_pid"), old.get("supervisor_start")
        ):
            raise RuntimeError(
                f"job {self.job_id} is already running here "
                f"(supervisor pid {old.get('supervisor_pid')})"
            )
        for rel, content in (self.spec.get("files") or {}).items():
            path = rel if os.path.isabs(rel) else os.path.join(self.run_dir, rel)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                f.write(content)
        # the work folder is seeded whole; cwd may be the script's folder inside it
        seed_work_folder(self.spec.get("work") or self.spec.get("cwd"), self.spec.get("work_seed"))
        # unbuffered: a failed write (disk full) fails there and then, never again at close()
        self.log = open(os.path.join(self.run_dir, CONSOLE_LOG), "ab", buffering=0)  # noqa: SIM115
        self.port_claims = adopt_port_claims(self.job_id)

    def child_env(self) -> dict:
        env = dict(os.environ)
        for key in ("FLEET_SUPERVISOR",):
            env.pop(key, None)
        env.update({str(k): str(v) for k, v in (self.spec.get("env") or {}).items()})
        prepend = [os.path.expanduser(p) for p in self.spec.get("path_prepend") or []]
        if prepend:
            env["PATH"] = os.pathsep.join([*prepend, env.get("PATH", "/usr/bin:/bin")])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["FLEET_JOB_ID"] = self.job_id
        env["FLEET_NODE_RANK"] = str(self.rank)
        env["FLEET_RUN_DIR"] = self.run_dir
        env["FLEET_PROGRESS_FILE"] = os.path.join(self.run_dir, PROGRESS_FILE)
        return env

    def start(self) -> None:
        cwd = os.path.expanduser(self.spec.get("cwd") or self.run_dir)
        self.subreaper = become_subreaper()  # before the job: its orphans come back here
        self.proc = subprocess.Popen(
            [str(a) for a in self.spec["argv"]],
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
        self.state = {
            "protocol": PROTOCOL,
            "job_id": self.job_id,
            "node_rank": self.rank,
            "run_dir": self.run_dir,
            "cwd": cwd,
            "argv": [str(a) for a in self.spec["argv"]],
            "pid": self.proc.pid,
            "pgid": self.proc.pid,
            "leader_start": self.leader_start,
            "supervisor_pid": os.getpid(),
            "supervisor_start": me[3] if me else None,
            "subreaper": self.subreaper,
            "start_time": _now(),
            "detached": self.detach,
            "deadman": None if self.detach else self.deadman,
            "grace": self.grace,
            "state": "running",
        }
        _write_json(os.path.join(self.run_dir, STATE_FILE), self.state)

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
            self.write_log(line if log is None else log)
            if self.log_problem is None:
                self.out.frame(kind, text)
            else:  # no copy on this node's disk: the controller's must not drop any
                self.out.frame_or_wait(kind, text)

    def tail_ranks(self, done: threading.Event) -> None:
        """Each local rank's own output files (torchrun ``--redirects``), line by line, as
        ``[rank G] line``: whole lines per rank in the stream and console.log, whatever mix of
        partial writes the ranks make. A partial line waits for its end (or the job's end)."""
        cfg = self.spec.get("rank_logs") or {}
        root = os.path.join(self.run_dir, str(cfg.get("dir") or ""))
        base = int(cfg.get("base") or 0)
        while True:
            last = done.wait(0.1)
            for path, local in _rank_log_files(root, str(cfg.get("layout") or "torchrun")):
                with self.tail_lock:
                    if path not in self.rank_files:
                        self.rank_files[path] = [0, b"", b"[rank %d] " % (base + local)]
            for path in list(self.rank_files):
                self._tail_path(path, final=last)
            if last:
                return

    def _tail_path(self, path: str, *, final: bool) -> None:
        with self.tail_lock:
            st = self.rank_files.get(path)
            if st is None and path == self.echo_path and os.path.exists(path):
                base = int((self.spec.get("rank_logs") or {}).get("base") or 0)
                st = self.rank_files[path] = [0, b"", b"[rank %d] " % base]
            if st is not None:
                self._tail_one(path, st, final=final)

    def _tail_one(self, path: str, st: list, *, final: bool) -> None:
        try:
            with open(path, "rb") as f:
                f.seek(st[0])
                data = f.read(1 << 20)
        except OSError:
            return
        st[0] += len(data)
        buf = st[1] + data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            self.emit(st[2] + buf[: nl + 1], ends=True)
            if path == self.echo_path:
                self.echo_lines.append(buf[:nl])
            buf = buf[nl + 1 :]
        if len(buf) >= MAX_LINE:  # bounded: a very long line goes on in pieces
            self.emit(st[2] + buf, ends=False)
            buf = b""
        if final and buf:  # the rank's last, unterminated line: whole in the log too
            self.emit(st[2] + buf, ends=True, log=st[2] + buf + b"\n")
            buf = b""
        st[1] = buf
        if final and len(data) == 1 << 20:  # more after a big burst: keep draining
            self._tail_one(path, st, final=True)

    def write_log(self, data: bytes) -> None:
        """Append to console.log. When the disk is full the job goes on, and so does the
        stream to the controller (which keeps its own copy): say so once (``E``), count what
        was lost, and once writes work again mark the gap in the log."""
        if self.log is None:
            return
        try:
            if self.log_lost:
                _write_all(self.log, _gap_note(self.log_lost, self.log_problem))
                self.log_lost = 0
            _write_all(self.log, data)
        except OSError as e:
            self.log_lost += len(data)
            if self.log_problem is None:
                self.log_problem = _write_problem(e, self.run_dir)
                self.out.frame(
                    "E",
                    f"{self.log_problem}: console.log on the node misses output from here "
                    "on; the stream to fleetctl goes on".encode(),
                    must=True,
                )

    def watch_rank_pids(self, done: threading.Event) -> None:
        """Which process is which local rank (``LOCAL_RANK`` torchrun/deepspeed,
        ``PADDLE_LOCAL_RANK`` paddle in its env): the topmost one per rank, each new one (a
        launcher restart) added, into ``rank_pids.json`` for the controller's ``ranks.json``.
        Often at first, then every few seconds: ranks start once, restarts are rare (a rank
        that ends within a fraction of a second may go unseen: its pid stays unknown)."""
        assert self.proc is not None
        if self.spec.get("env", {}).get("FLEET_LAUNCHER") in ("plain", "command"):
            self.rank_pids = {"0": [self.proc.pid]}
            _write_json(os.path.join(self.run_dir, RANK_PIDS), self.rank_pids)
            return
        t0 = time.monotonic()
        next_scan = 0.0
        exits: dict = {}  # pid -> {"local", "pid", "code", "at"[, "after_stop"]}: how ranks ended
        # A pidfd per rank process wakes us the moment it ends: its time is exact (which rank
        # failed first, across nodes, is decided by these times) and its exit status is read
        # while it is still a zombie, before its launcher reaps it (torchrun looks every
        # 0.1 s, deepspeed every 1 s). Without pidfds (Linux < 5.3) /proc is read every 0.05 s.
        poller = select.poll()
        pidfds: dict = {}  # fd -> (pid, local)
        watched: set = set()

        def ended(pid: int, local: str, code: int | None) -> None:
            exits[pid] = {"local": int(local), "pid": pid, "code": code, "at": _now()}
            with self.lock:
                if self.stop_request is not None:  # ended by our stop: never a first failure
                    exits[pid]["after_stop"] = True
            with contextlib.suppress(OSError):
                _write_json(os.path.join(self.run_dir, RANK_EXITS), {"exits": list(exits.values())})

        try:
            while not done.is_set():
                for local, pids in list(self.rank_pids.items()):
                    pid = pids[-1]
                    if pid in watched:
                        continue
                    watched.add(pid)
                    fd = pidfd_open(pid)
                    if fd is not None:
                        pidfds[fd] = (pid, local)
                        poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(50):
                    pid, local = pidfds.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    ended(pid, local, zombie_exit(pid))
                for local, pids in list(self.rank_pids.items()):
                    pid = pids[-1]
                    if pid in exits or any(pid == p for p, _ in pidfds.values()):
                        continue
                    code = zombie_exit(pid)
                    if code is not None:
                        ended(pid, local, code)
                age = time.monotonic() - t0
                if age < next_scan:
                    continue
                next_scan = age + (0.2 if age < 10 else 1.0 if age < 60 else 5.0)
                changed = False
                for local, pid in rank_processes(self.proc.pid):
                    pids = self.rank_pids.setdefault(str(local), [])
                    if pid not in pids:
                        pids.append(pid)
                        changed = True
                if changed:
                    with contextlib.suppress(OSError):
                        _write_json(os.path.join(self.run_dir, RANK_PIDS), self.rank_pids)
        finally:
            for fd in pidfds:
                with contextlib.suppress(OSError):
                    os.close(fd)

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
                if not self.spec.get("reattach"):
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
        if quiet > self.deadman and self.spec.get("reattach"):
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
        cfg = self.spec.get("rank_logs") or {}
        if cfg.get("echo") is not None:
            root = os.path.join(self.run_dir, str(cfg.get("dir") or ""))
            self.echo_path = os.path.join(root, str(cfg["echo"]))
        if cfg:
            tailer = threading.Thread(target=self.tail_ranks, args=(ranks_done,), daemon=True)
            tailer.start()
        threading.Thread(target=self.watch_rank_pids, args=(done,), daemon=True).start()
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
        # What only this node knows for sure: when its launcher ended, and whether it had been
        # told to stop by then (ended by the teardown) or ended on its own (failed first?).
        self.ended_at = _now()
        with self.lock:
            self.stop_asked = stopping_with is not None or self.stop_request is not None
        if self.stop_reason is None:  # stopped from another terminal: say so to the controller
            req = _read_json(os.path.join(self.run_dir, STOP_REQUEST))
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
        pump.join(5.0)
        if tailer is not None:  # the ranks' last words, partial lines included
            ranks_done.set()
            tailer.join(10.0)
        done.set()
        self.state.update(
            {
                "state": "stopped" if self.stop_reason else "exited",
                "exit_code": code if code >= 0 else None,
                "signal": -code if code < 0 else None,
                "end_time": _now(),
                "stop_reason": self.stop_reason,
                "remaining": left["remaining"],
                "dropped_frames": self.out.dropped,
                "problem": self.log_problem,
                "exit_report": self.exit_report(),
            }
        )
        with contextlib.suppress(OSError):
            _write_json(os.path.join(self.run_dir, STATE_FILE), self.state)
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.close()
        return code

    def exit_report(self) -> dict | None:
        """What the ``X`` frame says after the code: the after-exit scan, when the launcher
        ended, whether a stop had been asked, a node problem ("disk full on …")."""
        if self.leftovers is None:
            return None
        said = {
            **{k: self.leftovers.get(k, []) for k in ("found", "killed", "remaining")},
            "ended_at": self.ended_at,
            "stop_asked": self.stop_asked,
        }
        if self.log_problem:
            said["problem"] = self.log_problem
        return said

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


def _write_all(f, data: bytes) -> None:
    """All of ``data`` to an unbuffered file (a raw write may take only part of it)."""
    view = memoryview(data)
    while view:
        n = f.write(view)
        if not n:
            raise OSError(errno.ENOSPC, "no space left on device")
        view = view[n:]


def _write_problem(e: OSError, run_dir: str) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full on {run_dir}"
    return f"cannot write console.log in {run_dir}: {e.strerror or e}"


def _gap_note(lost: int, problem: str | None) -> bytes:
    return (
        f"\n[fleetctl supervisor] {lost} bytes of output are missing here ({problem}); "
        "fleetctl's streamed copy has them\n"
    ).encode()


def _pid_alive(pid: object, start: object) -> bool:
    if not isinstance(pid, int):
        return False
    st = proc_stat(pid)
    return st is not None and st[0] not in ("Z", "X") and (start is None or st[3] == start)


def _noop(signum: int, frame: object) -> None:
    """A handler (not SIG_IGN) so the job's processes get default dispositions after exec."""


def cmd_run() -> int:
    signal.signal(signal.SIGHUP, _noop)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # subprocess restores it for the job
    out_fd = 1
    out = Out(out_fd)
    out.frame("R", b"%d" % PROTOCOL, must=True)
    try:
        spec, early = _read_spec(0, 60.0)
    except (ValueError, OSError) as e:
        out.frame("F", f"bad spec: {e}".encode(), must=True)
        out.frame("X", b"127", must=True)
        out.close(2.0)
        return 2
    if spec.get("detach"):
        return _run_detached(spec, out)
    sup = Supervisor(spec, out, 0, early)
    signal.signal(
        signal.SIGTERM, lambda s, f: sup.request_stop(sup.grace, "supervisor got SIGTERM")
    )
    signal.signal(signal.SIGINT, lambda s, f: sup.request_stop(sup.grace, "supervisor got SIGINT"))
    # the controller's stop and kill, relayed by ``reattach`` when it came back on a new channel
    signal.signal(
        signal.SIGUSR2, lambda s, f: sup.request_stop(sup.grace, "stop requested by the controller")
    )
    signal.signal(
        signal.SIGUSR1, lambda s, f: sup.request_stop(0.0, "kill requested by the controller")
    )
    code = _start_and_supervise(sup)
    # ``X <code> <json>``: the scan after the launcher exited, the same one `stop` mode does,
    # so the controller's teardown needs no extra remote command for this node.
    said = sup.exit_report()
    report = b"" if said is None else b" " + json.dumps(said).encode()
    out.frame("X", str(code).encode() + report, must=True)
    out.close(3.0)
    # After the exit, the controller may ask for the run folder on this same channel (``c``):
    # no second remote command to collect the logs. EOF, or nothing within LINGER, ends it.
    released = sup.listening and not out.broken and sup.released.wait(LINGER)
    if released and sup.collect_req.is_set():
        with contextlib.suppress(OSError):
            os.write(out_fd, TAR_MARKER)
            pack_dir(sup.run_dir, out_fd, sup.spec.get("collect"))
    return 0


def _start_and_supervise(sup: Supervisor) -> int:
    try:
        return _start_and_supervise_job(sup)
    finally:
        release_port_claims(sup.port_claims, sup.job_id)


def _start_and_supervise_job(sup: Supervisor) -> int:
    try:
        sup.prepare()
        sup.start()
    except Exception as e:  # report why the job could not start; the controller shows it
        why = str(e)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            why = f"disk full on {sup.run_dir}"
        msg = f"cannot start job on this node: {why}"
        sup.out.frame("F", msg.encode(), must=True)
        if sup.log is not None:
            with contextlib.suppress(OSError):
                sup.log.write(f"[fleetctl supervisor] {msg}\n".encode())
                sup.log.close()
        return 127
    sup.out.frame(
        "S",
        json.dumps(
            {k: sup.state[k] for k in ("pid", "pgid", "supervisor_pid", "start_time", "run_dir")}
        ).encode(),
        must=True,
    )
    return sup.supervise()


def _run_detached(spec: dict, out: Out) -> int:
    """Double-fork: the job keeps running under a supervisor that outlives the SSH channel."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(rfd)
        os.setsid()
        if os.fork() != 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        sup = Supervisor(spec, Out(None), None)
        signal.signal(
            signal.SIGTERM, lambda s, f: sup.request_stop(sup.grace, "supervisor got SIGTERM")
        )
        try:
            sup.prepare()
            sup.start()
            os.write(wfd, ("S " + json.dumps(sup.state) + "\n").encode())
        except Exception as e:
            os.write(wfd, f"F cannot start job on this node: {e}\n".encode())
            os._exit(1)
        os.close(wfd)
        try:
            sup.supervise()
        finally:
            release_port_claims(sup.port_claims, sup.job_id)
        os._exit(0)
    os.close(wfd)
    os.waitpid(pid, 0)
    data = b""
    while True:
        chunk = os.read(rfd, 65536)
        if not chunk:
            break
        data += chunk
    line = data.strip() or b"F detached supervisor died before starting the job"
    kind, _, payload = line.partition(b" ")
    out.frame(kind.decode(), payload, must=True)
    if kind == b"S":
        out.frame("Q", must=True)
    else:
        out.frame("X", b"127", must=True)
    out.close(3.0)
    return 0


# ------------------------------------------------------------------------------ other modes


def _opts(argv: list[str]) -> dict:
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
    sys.stdout.write(kind + " " + json.dumps(payload) + "\n")
    sys.stdout.flush()


def cmd_stop(argv: list[str]) -> int:
    """Stop a job on this node (teardown, ``fleetctl stop``); answers ``D <json>`` with what
    was found, killed and remains."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    opts = _opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    state = _read_json(os.path.join(run_dir, STATE_FILE)) if run_dir else {}
    job_id = opts.get("job_id") or state.get("job_id")
    if not job_id:
        answer("D", {"error": "no job id"})
        return 2
    if state and state.get("job_id") not in (None, job_id):
        state = {}  # a folder of another job: trust only the env tag
    rank = opts.get("rank", state.get("node_rank"))
    sup_pid = state.get("supervisor_pid")
    sup_alive = _pid_alive(sup_pid, state.get("supervisor_start"))
    result = stop_processes(
        job_id,
        int(rank) if rank is not None else None,
        state.get("pgid"),
        state.get("leader_start"),
        float(opts.get("grace", 5.0)),
        # a live subreaper supervisor: every descendant of it is the job's
        root=sup_pid if sup_alive and state.get("subreaper") else None,
    )
    result["job_id"] = job_id
    result["supervisor_alive"] = _pid_alive(
        state.get("supervisor_pid"), state.get("supervisor_start")
    )
    answer("D", result)
    return 0


def cmd_status(argv: list[str]) -> int:
    """State of a job on this node (for ``fleetctl status``): ``D <json>``."""
    opts = _opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    state = _read_json(os.path.join(run_dir, STATE_FILE))
    job_id = opts.get("job_id") or state.get("job_id")
    live = []
    if job_id:
        live = find_job_processes(
            job_id, state.get("node_rank"), state.get("pgid"), state.get("leader_start")
        )
    state["processes"] = live
    state["supervisor_alive"] = _pid_alive(
        state.get("supervisor_pid"), state.get("supervisor_start")
    )
    marks = []  # the job moved on: it printed, or touched FLEET_PROGRESS_FILE
    for name in ("console.log", PROGRESS_FILE):
        with contextlib.suppress(OSError):
            marks.append(os.stat(os.path.join(run_dir, name)).st_mtime)
    state["progress"] = max(marks) if marks else None
    if state.get("state") == "running" and not state["supervisor_alive"]:
        state["state"] = "lost"
    answer("D", state)
    return 0


def cmd_mark_stop(argv: list[str]) -> int:
    """Leave ``stop-request.json`` (job id, reason) in an existing run folder before a stop from
    another terminal, so the job's supervisor reports why it ended. ``D {"marked": bool}``."""
    opts = _opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    marked = bool(run_dir) and os.path.isdir(run_dir)
    if marked:
        record = {"job_id": opts.get("job_id"), "reason": opts.get("reason"), "time": time.time()}
        _write_json(os.path.join(run_dir, STOP_REQUEST), record)
    answer("D", {"marked": marked})
    return 0


def cmd_follow(argv: list[str]) -> int:
    """``fleetctl logs``: the job's console.log as ``L <line>`` frames (``E <notice>`` when
    there is none). ``--follow 1`` keeps reading until the job's supervisor has ended and the
    log is read to the end, or stdin closes (fleetctl went away); ``--last N`` starts with the
    last N lines (-1: the whole log)."""
    opts = _opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    follow = opts.get("follow", "0") == "1"
    last = int(opts.get("last", "-1"))
    log, state_file = os.path.join(run_dir, CONSOLE_LOG), os.path.join(run_dir, STATE_FILE)
    out = os.fdopen(1, "wb", 0)

    def running() -> bool:
        state = _read_json(state_file)
        if not state:
            return os.path.isdir(run_dir) and not os.path.exists(log)
        return state.get("state") == "running" and _pid_alive(
            state.get("supervisor_pid"), state.get("supervisor_start")
        )

    def emit(line: bytes) -> None:
        out.write(b"L " + line.rstrip(b"\n") + b"\n")

    deadline = time.time() + 30
    while not os.path.exists(log):
        if not follow or time.time() > deadline or not running():
            out.write(b"E no console.log on this node (the job never started here)\n")
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


def cmd_reattach(argv: list[str]) -> int:
    """The controller, back over a new connection after its channel to ``run`` went silent or
    closed: ``S <json>`` (is the supervisor alive), then the job's console.log from line
    ``--skip`` on as ``L`` frames, and ``X`` from supervisor.json once the supervisor ended.
    Every byte on stdin is a heartbeat (the heartbeat file); ``t``/``k`` are relayed to the
    supervisor as SIGUSR2/SIGUSR1 (stop with grace / kill). EOF: the controller is gone."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    opts = _opts(argv)
    run_dir = os.path.expanduser(opts.get("run_dir", ""))
    skip = int(opts.get("skip", "0"))
    state_file, log = os.path.join(run_dir, STATE_FILE), os.path.join(run_dir, CONSOLE_LOG)
    hb = os.path.join(run_dir, HEARTBEAT_FILE)
    state = _read_json(state_file)
    pid, start = state.get("supervisor_pid"), state.get("supervisor_start")
    out = os.fdopen(1, "wb", 0)
    lock = threading.Lock()
    gone = threading.Event()

    def frame(kind: str, payload: bytes = b"") -> None:
        with lock:
            out.write(kind.encode() + (b" " + payload if payload else b"") + b"\n")

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
            if sig and _pid_alive(pid, start):
                with contextlib.suppress(OSError):
                    os.kill(int(pid), sig)  # type: ignore[arg-type]

    alive = _pid_alive(pid, start)
    beat()
    frame("S", json.dumps({"alive": alive, "state": state.get("state")}).encode())
    if not alive and state.get("state") == "running":
        return 0  # the supervisor died without a word: nothing to reattach to
    threading.Thread(target=relay, daemon=True).start()
    seen = 0
    buf = b""
    try:
        f = open(log, "rb")  # noqa: SIM115
    except OSError:
        f = None
    while not gone.is_set():
        ended = _read_json(state_file).get("state") != "running" or not _pid_alive(pid, start)
        chunk = f.read(65536) if f is not None else b""
        if chunk:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                seen += 1
                if seen > skip:
                    frame("L", line)
            continue
        if ended:
            break
        time.sleep(0.1)
    if gone.is_set():
        return 0
    if buf and seen + 1 > skip:
        frame("L", buf)
    final = _read_json(state_file)
    code = final.get("exit_code")
    code = code if code is not None else -int(final.get("signal") or 0) or 255
    report = final.get("exit_report")
    frame("X", str(code).encode() + (b" " + json.dumps(report).encode() if report else b""))
    return 0


def cmd_clean(argv: list[str]) -> int:
    """Leftovers of fleetctl jobs here (``fleetctl.testing.infra``): ``D <json>`` with the
    processes of a job (``--job-id``, else of any job) and the temp files under ``--workdir``.

    A process belongs to a job when its environment carries ``FLEET_JOB_ID`` (that id, or any),
    or when it is in the group the job's supervisor recorded and that group's leader is still
    the recorded process. Temp files: ``.tmp-*``, ``*.part``, and ``*.<pid>.tmp`` in run folders.
    """
    opts = _opts(argv)
    job = opts.get("job_id")
    workdir = os.path.expanduser(opts.get("workdir", "~/.fleetctl"))
    want = ("FLEET_JOB_ID=" + job).encode() if job else None
    groups: dict = {}
    if job:  # W/runs/<job>/<rank>-<host>/ (and W/runs/<job>/ of older versions)
        job_dir = os.path.join(workdir, "runs", job)
        with contextlib.suppress(OSError):
            for path in [job_dir] + [os.path.join(job_dir, n) for n in os.listdir(job_dir)]:
                state = _read_json(os.path.join(path, STATE_FILE))
                if state.get("pgid"):
                    groups[int(state["pgid"])] = state.get("leader_start")
    me = os.getpid()
    seen = []
    alive_groups = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        st = proc_stat(pid)
        if st is None:
            continue
        if groups.get(pid) is not None and groups[pid] == st[3]:
            alive_groups.add(pid)
        if st[0] in ("Z", "X"):
            continue
        tag = None
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            env = []
        for entry in env:
            if entry.startswith(b"FLEET_JOB_ID=") and (want is None or entry == want):
                tag = entry[13:].decode("utf-8", "replace")
        seen.append((pid, st[2], tag))
    procs = [
        {"pid": pid, "pgid": pgid, "job_id": tag or job, "cmd": _cmdline(pid)}
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


def cmd_pack(argv: list[str]) -> int:
    """The run folder as a tar stream on stdout after a ``T`` frame: regular files and folders
    only, no links. Nothing at all when there is no run folder (exit 3). ``--stdin 1``: what to
    send (cap, excludes, files already home) comes as one JSON line on stdin."""
    opts = _opts(argv)
    root = os.path.abspath(os.path.expanduser(opts["run_dir"]))
    collect = None
    if opts.get("stdin") == "1":
        collect = _read_collect_options(0)
    if not os.path.isdir(root):
        return 3
    os.write(1, TAR_MARKER)
    pack_dir(root, 1, collect)
    return 0


def _read_collect_options(fd: int) -> dict:
    """One JSON line (``max``, ``exclude``, ``have``) from ``fd``; {} when there is none."""
    buf = b""
    while b"\n" not in buf and len(buf) < MAX_OPTIONS:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    try:
        data = json.loads(buf.split(b"\n", 1)[0].decode("utf-8") or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _collect_class(rel: str) -> int:
    """Send order: the supervisor's record and the console, then logs, then everything else
    (so a cap or a broken transfer costs big job files, never the logs)."""
    if rel in (STATE_FILE, CONSOLE_LOG):
        return 0
    name = rel.rsplit("/", 1)[-1]
    folders = rel.split("/")[:-1]
    if (
        name.endswith(LOG_SUFFIXES)
        or name.startswith(("workerlog", "stdout", "stderr", "endpoints"))
        or any(f in ("log", "logs", "stacks") for f in folders)
    ):
        return 1
    return 2


def collect_plan(root: str, options: dict | None = None) -> tuple[list[str], list[dict]]:
    """What ``pack`` sends from ``root``: (folders, files in send order).

    Each file is ``{"path", "size", "mtime"}`` plus ``"send": true`` or a ``"reason"``:
    ``excluded`` (with the ``glob``), ``home`` (same size and mtime as the controller's copy
    in ``have``), ``over cap`` (the node's files, home ones included, would exceed ``max``
    bytes; small files come first, so one big file never crowds out the logs). A file sent
    whose partial copy is home (``partial``: same size and mtime) gets the ``offset`` to
    resume from.
    """
    import fnmatch

    options = options or {}
    excludes = [str(g) for g in options.get("exclude") or []]
    have = options.get("have") or {}
    partial = options.get("partial") or {}
    cap = options.get("max")
    folders: list[str] = []
    files: list[dict] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir != ".":
            folders.append(rel_dir)
        for name in sorted(filenames):
            rel = name if rel_dir == "." else rel_dir + "/" + name
            if rel == COLLECT_MANIFEST:
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if _is_regular(st.st_mode):
                files.append({"path": rel, "size": st.st_size, "mtime": int(st.st_mtime)})
    files.sort(key=lambda f: (_collect_class(f["path"]), f["size"], f["path"]))
    budget = None if cap is None else int(cap)
    for f in files:
        base = f["path"].rsplit("/", 1)[-1]
        glob = next(
            (g for g in excludes if fnmatch.fnmatch(f["path"], g) or fnmatch.fnmatch(base, g)),
            None,
        )
        if glob is not None:
            f["reason"], f["glob"] = "excluded", glob
            continue
        home = have.get(f["path"]) == [f["size"], f["mtime"]]
        if budget is not None and f["size"] > budget and not home:
            f["reason"] = "over cap"
            continue
        if budget is not None:
            budget = max(0, budget - f["size"])
        if home:
            f["reason"] = "home"
            continue
        f["send"] = True
        part = partial.get(f["path"])  # a broken transfer's copy: send only the rest
        if (
            isinstance(part, list)
            and len(part) == 3
            and part[:2] == [f["size"], f["mtime"]]
            and 0 < int(part[2]) < f["size"]
        ):
            f["offset"] = int(part[2])
    return folders, files


def pack_dir(root: str, fd: int, options: dict | None = None) -> None:
    """Write ``root`` as a tar stream to ``fd``: first the manifest (every file and what
    happens to it, :func:`collect_plan`), the folders, then the files to send in order.

    Written by :class:`TarWriter`, not tarfile: importing tarfile (shutil, bz2, lzma) cost
    every node ~6 ms of CPU at the end of every job; the controller reads it with tarfile."""
    folders, files = collect_plan(root, options)
    out = os.fdopen(fd, "wb", closefd=False)
    tar = TarWriter(out)
    now = int(time.time())
    manifest = json.dumps({"version": 1, "max": (options or {}).get("max"), "files": files})
    tar.add(COLLECT_MANIFEST, io.BytesIO(manifest.encode()), len(manifest.encode()), 0o600, now)
    for rel in folders:  # folders too: launcher log trees may hold empty rank folders
        tar.add_dir(rel, 0o700, now)
    for f in files:
        if not f.get("send"):
            continue
        try:
            with open(os.path.join(root, f["path"]), "rb") as src:
                offset = f.get("offset", 0)
                pax = None
                if offset:  # resumed: the tail only (fleetctl.phases.collect.OFFSET_KEY)
                    src.seek(offset)
                    pax = {"fleetctl.offset": str(offset)}
                size = f["size"] - offset
                tar.add(f["path"], _Bounded(src, size), size, 0o600, f["mtime"], pax)
        except OSError:
            continue  # gone meanwhile: the controller sees it listed but not sent
    tar.close()
    out.flush()


class TarWriter:
    """A POSIX (pax) tar stream, as ``tarfile.open(mode="w|", format=PAX_FORMAT)`` writes it
    for regular files and folders: ustar headers, a pax header first where a name is long or
    not ASCII, a size or time does not fit, or extra keys are given."""

    BLOCK = 512
    RECORD = 20 * 512

    def __init__(self, out) -> None:  # type: ignore[no-untyped-def]
        self.out, self.written = out, 0

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self.written += len(data)

    def _pad(self, n: int) -> None:
        if n % self.BLOCK:
            self._write(b"\0" * (self.BLOCK - n % self.BLOCK))

    def _header(
        self, name: str, size: int, mode: int, mtime: int, kind: bytes, pax: dict | None
    ) -> None:
        pax = dict(pax or {})
        raw = name.encode("utf-8", "surrogateescape")
        if len(raw) > 100 or not name.isascii():
            pax["path"] = name
        if size >= 8**11:
            pax["size"] = str(size)
        if not 0 <= mtime < 8**11:
            pax["mtime"] = str(mtime)
        if pax:
            records = b"".join(_pax_record(k, v) for k, v in pax.items())
            self._write(_ustar(b"././@PaxHeader", len(records), 0o644, 0, b"x"))
            self._write(records)
            self._pad(len(records))
        safe = name.encode("ascii", "replace")[:100]
        self._write(
            _ustar(safe, 0 if size >= 8**11 else size, mode, max(0, min(mtime, 8**11 - 1)), kind)
        )

    def add(  # type: ignore[no-untyped-def]
        self, name: str, src, size: int, mode: int, mtime: int, pax: dict | None = None
    ) -> None:
        """A regular file of exactly ``size`` bytes read from ``src``."""
        self._header(name, size, mode, int(mtime), b"0", pax)
        left = size
        while left > 0:
            data = src.read(min(left, 1 << 20))
            if not data:
                data = b"\0" * min(left, 1 << 20)  # the file shrank: keep the stream whole
            self._write(data[:left])
            left -= len(data[:left])
        self._pad(size)

    def add_dir(self, name: str, mode: int, mtime: int) -> None:
        self._header(name.rstrip("/") + "/", 0, mode, int(mtime), b"5", None)

    def close(self) -> None:
        """The end: two zero blocks, then zeros to a whole record, as tarfile ends it."""
        self._write(b"\0" * (2 * self.BLOCK))
        if self.written % self.RECORD:
            self._write(b"\0" * (self.RECORD - self.written % self.RECORD))


def _ustar(name: bytes, size: int, mode: int, mtime: int, kind: bytes) -> bytes:
    h = bytearray(512)
    h[0 : len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = b"%07o\0" % 0  # uid: the controller does not restore owners
    h[116:124] = b"%07o\0" % 0
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % mtime
    h[148:156] = b" " * 8  # the checksum counts its own field as spaces
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _pax_record(key: str, value: str) -> bytes:
    """``"<length> <key>=<value>\\n"``, where the length counts its own digits."""
    payload = b" " + key.encode("utf-8") + b"=" + value.encode("utf-8", "surrogateescape") + b"\n"
    n = len(payload) + 1
    while len(str(n)) + len(payload) != n:
        n = len(str(n)) + len(payload)
    return str(n).encode() + payload


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


class _Bounded:
    """Reads at most ``size`` bytes, padding with NULs if the file shrank meanwhile."""

    def __init__(self, f, size: int) -> None:
        self.f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            data += b"\0" * (n - len(data))
        self.left -= len(data)
        return data


MODES = {
    "stop": cmd_stop,
    "status": cmd_status,
    "pack": cmd_pack,
    "follow": cmd_follow,
    "mark-stop": cmd_mark_stop,
    "clean": cmd_clean,
    "reattach": cmd_reattach,
}


def rank_processes(leader: int) -> list:
    """(local rank, pid) of the topmost process of each local rank under ``leader``."""
    children: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None and st[0] not in ("Z", "X"):
                children.setdefault(st[1], []).append(int(name))
    out = []
    todo = [(leader, None)]
    while todo:  # depth first; a rank's own children (data loaders) share its LOCAL_RANK
        pid, parent_rank = todo.pop()
        local = _local_rank(pid)
        if local is not None and local != parent_rank:
            out.append((local, pid))
        todo.extend((c, local if local is not None else parent_rank) for c in children.get(pid, []))
    return sorted(out)


def pidfd_open(pid: int) -> int | None:
    """A pidfd for ``pid`` (Linux >= 5.3; ``os.pidfd_open`` from Python 3.9, the raw syscall
    before): readable once the process ended. None where the kernel or the process says no."""
    opener = getattr(os, "pidfd_open", None)
    try:
        if opener is not None:
            return int(opener(pid))
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = int(libc.syscall(434, pid, 0))  # pidfd_open: 434 on every architecture
        return fd if fd >= 0 else None
    except (OSError, AttributeError, ValueError):
        return None


def zombie_exit(pid: int) -> int | None:
    """A process that ended and waits for its parent to reap it: its exit code, or -signal
    (``/proc/PID/stat`` field 52, Linux >= 3.5). None while it runs, once reaped, or when
    the kernel does not say."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(b")") + 2 :].split()
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    status = int(fields[49])
    return -(status & 0x7F) if status & 0x7F else status >> 8


def _local_rank(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    for e in entries:
        for key in (b"PADDLE_LOCAL_RANK=", b"LOCAL_RANK="):
            if e.startswith(key) and e[len(key) :].isdigit():
                return int(e[len(key) :])
    return None


def _rank_log_files(root: str, layout: str) -> list:
    """(path, rank) of each local rank's output file the launcher made so far: torchrun
    ``<dir>/<run>/attempt_K/<local>/{stdout,stderr}.log``, paddle ``<dir>/workerlog.<local>``
    (local ranks), deepspeed ``<dir>/<time>_rank<G>.log`` (global ranks)."""
    out = []
    if layout == "deepspeed":
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(root)):
                stem, _, rank = name[: -len(".log")].rpartition("_rank")
                if stem and name.endswith(".log") and rank.isdigit():
                    out.append((os.path.join(root, name), int(rank)))
        return out
    if layout == "paddle":
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(root)):
                local = name[len("workerlog.") :]
                if name.startswith("workerlog.") and local.isdigit():
                    out.append((os.path.join(root, name), int(local)))
        return out
    for dirpath, _dirs, _names in os.walk(root):
        local = os.path.basename(dirpath)
        if not local.isdigit():
            continue
        for name in ("stdout.log", "stderr.log"):
            path = os.path.join(dirpath, name)
            if os.path.exists(path):
                out.append((path, int(local)))
    return out


def seed_work_folder(cwd: str | None, seed: str | None) -> None:
    """The job's work folder (its cwd, shared by every attempt of the job) starts as a copy
    of the code snapshot: relative paths resolve as in the user's checkout, and what the job
    writes there (checkpoints, downloaded data) stays the job's own, never the snapshot's
    (which other jobs share), and survives a retry. Made once, under a temporary name and
    renamed: nodes sharing one home race safely, the loser drops its copy."""
    if not cwd or not seed:
        return
    work = os.path.abspath(os.path.expanduser(cwd))
    if os.path.isdir(work):
        return
    import shutil  # here: only the first attempt of a job copies

    src = os.path.abspath(os.path.expanduser(seed))
    parent = os.path.dirname(work)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    # a name of its own: pids repeat across the nodes of a shared home
    tmp = os.path.join(parent, f".tmp-{os.path.basename(work)}-{os.getpid()}-{os.urandom(4).hex()}")
    shutil.copytree(src, tmp, symlinks=True)
    os.chmod(tmp, 0o700)
    try:
        os.rename(tmp, work)
    except OSError:  # another node of a shared home made it first: theirs is the same copy
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(work):
            raise


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    mode = args[0] if args else "run"
    if mode == "run":
        return cmd_run()
    if mode in MODES:
        return MODES[mode](args[1:])
    print(f"unknown mode {mode!r} (run, {', '.join(MODES)})", file=sys.stderr)
    return 2


def program() -> None:
    """Run as the node's program (``fleetctl.remote.file_argv``, the loader, or a script)."""
    code = main()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os._exit(code)  # no interpreter teardown: daemon threads may sit in blocking writes


if __name__ == "__main__":
    program()
