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
folder: regular files and folders only). The spec and ``supervisor.json`` are typed records
(``records.py``); /proc is read by ``procfs.py``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys

from ..kit.framing import line
from ..kit.jobprocs import find_job_processes, release_port_claims, stop_processes
from ..kit.modes import cmd_clean, cmd_follow, cmd_mark_stop, cmd_reattach, cmd_status, cmd_stop
from ..kit.output import Out
from ..kit.pack import cmd_pack, pack_dir
from ..kit.procfs import proc_start_time, proc_stat
from ..kit.records import SupervisorSpec
from ..kit.spec import read_spec
from ..kit.supervision import Supervisor, ignore_signal
from ..kit.wire import COLLECT_MANIFEST, PROTOCOL, TAR_MARKER

# the program's entry points, and what tests still import from here (stop logic, markers)
__all__ = [
    "COLLECT_MANIFEST",
    "TAR_MARKER",
    "find_job_processes",
    "main",
    "pack_dir",
    "proc_start_time",
    "proc_stat",
    "program",
    "stop_processes",
]

LINGER = 120.0  # s after the exit to wait for the controller's ``c`` (collect) or EOF


def cmd_run() -> int:
    signal.signal(signal.SIGHUP, ignore_signal)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # subprocess restores it for the job
    out_fd = 1
    out = Out(out_fd)
    out.frame("R", b"%d" % PROTOCOL, must=True)
    try:
        spec, early = read_spec(0, 60.0)
    except (ValueError, OSError) as e:
        out.frame("F", f"bad spec: {e}".encode(), must=True)
        out.frame("X", b"127", must=True)
        out.close(2.0)
        return 2
    if spec.detach:
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
            pack_dir(sup.run_dir, out_fd, sup.spec.collect)
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
    st = sup.state
    said = {
        "pid": st.pid,
        "pgid": st.pgid,
        "supervisor_pid": st.supervisor_pid,
        "start_time": st.start_time,
        "run_dir": st.run_dir,
    }
    sup.out.frame("S", json.dumps(said).encode(), must=True)
    return sup.supervise()


def _run_detached(spec: SupervisorSpec, out: Out) -> int:
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
            os.write(wfd, line("S", json.dumps(sup.state.to_dict()).encode()))
        except Exception as e:
            os.write(wfd, line("F", f"cannot start job on this node: {e}".encode()))
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
    said = data.strip() or b"F detached supervisor died before starting the job"
    kind, _, payload = said.partition(b" ")
    out.frame(kind.decode(), payload, must=True)
    if kind == b"S":
        out.frame("Q", must=True)
    else:
        out.frame("X", b"127", must=True)
    out.close(3.0)
    return 0


MODES = {
    "stop": cmd_stop,
    "status": cmd_status,
    "pack": cmd_pack,
    "follow": cmd_follow,
    "mark-stop": cmd_mark_stop,
    "clean": cmd_clean,
    "reattach": cmd_reattach,
}


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
