"""The job monitor as a process: is it alive (by its identity, pid + /proc start time + boot id,
never a bare pid: ``fleetctl.job.records.controller``), starting one for a detached job, and
asking a live one to exit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError, RunFolderError
from fleetctl.job.monitor.decide import DEFAULT_LOST_TIMEOUT, DEFAULT_POLL
from fleetctl.job.records.controller import boot_id
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.remote.kit.procfs import proc_start_time

if TYPE_CHECKING:
    from fleetctl.api.runspec import Observe, Supervision
    from fleetctl.job.records.jobrecord import JobRecord
    from fleetctl.transport.connection import SSHSettings

REGISTER_WAIT = 20.0  # s for a spawned monitor to record itself in job.json
STOP_WAIT = 30.0  # s for a watching monitor to exit after SIGTERM (a poll in flight ends)
FINISH_WAIT = 180.0  # s for a monitor already tearing down / collecting to finish

# ------------------------------------------------------------------------ process identity


def monitor_alive(info: Any) -> bool:
    """Is the process job.json's ``monitor`` entry names still that very process, here?"""
    if not isinstance(info, dict):
        return False
    pid, start = info.get("pid"), info.get("start_time")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(start, int):
        return False
    if info.get("host") not in (None, socket.gethostname()):
        return False  # recorded on another controller: its pid means nothing here
    if info.get("boot_id") not in (None, boot_id()):
        return False
    return proc_start_time(pid) == start


def monitor_status(job: JobRecord) -> dict[str, Any] | None:
    """``fleetctl status``'s view of the job's monitor (None: it never had one)."""
    info = job.monitor
    if info is None:
        return None
    return {
        "pid": info.get("pid"),
        "alive": monitor_alive(info),
        "phase": info.get("phase"),
        "log": info.get("log"),
        "outcome": info.get("outcome"),
    }


# ----------------------------------------------------------------- spawning and stopping


@dataclass
class SpawnedMonitor:
    pid: int
    log: str
    registered: bool  # it recorded itself in job.json (else: see its log)
    exit_code: int | None = None  # when it already ended


def spawn_monitor(
    folder: str | Path,
    *,
    settings: SSHSettings | None = None,
    poll: float = DEFAULT_POLL,
    lost_after: float = DEFAULT_LOST_TIMEOUT,
    wait: float = REGISTER_WAIT,
    sup: Supervision | None = None,
    observe: Observe | None = None,
    report: bool = True,
) -> SpawnedMonitor:
    """Start ``fleetctl monitor`` for the job in ``folder`` as its own process (own session,
    no terminal, output to ``monitor.log`` 0600), and wait (bounded) until it has recorded
    itself in job.json. ``lost_after``: its ``--lost-timeout``; ``sup``: the run's limits and
    grace it enforces; ``observe``: the metrics it serves and the hooks it runs — as its
    options, each group's fields that differ from their defaults (a relative
    ``--metrics-textfile`` means the same to it: it starts in this folder)."""
    from fleetctl.api.runspec import Observe, Supervision

    folder = Path(folder).resolve()
    argv = [
        sys.executable,
        "-m",
        "fleetctl",
        "monitor",
        "--runs-dir",
        str(folder.parent),
        "--poll",
        repr(float(poll)),
        "--lost-timeout",
        repr(float(lost_after)),
        *(sup or Supervision()).argv(Supervision.MONITORED),
        *(observe or Observe()).argv(),
    ]
    if not report:
        argv.append("--no-report")
    if settings is not None:
        argv += ["--connect-timeout", repr(float(settings.connect_timeout))]
        if settings.known_hosts:
            argv += ["--known-hosts", os.path.abspath(os.path.expanduser(settings.known_hosts))]
    argv.append(folder.name)
    run = RunFolder(folder)
    log = run.monitor_log
    fd = run.open_monitor_log()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise FleetctlError(f"cannot start the job monitor: {e}") from e
    finally:
        os.close(fd)
    end = time.monotonic() + wait
    while True:
        with contextlib.suppress(RunFolderError):
            info = run.load_job().monitor
            if info is not None and info.get("pid") == proc.pid:
                return SpawnedMonitor(proc.pid, str(log), True, proc.poll())
        code = proc.poll()
        if code is not None or time.monotonic() > end:
            return SpawnedMonitor(proc.pid, str(log), False, code)
        time.sleep(0.1)


def stop_monitor(
    folder: RunFolder,
    *,
    wait: float = STOP_WAIT,
    finish_wait: float = FINISH_WAIT,
) -> str | None:
    """Ask the job's live monitor to exit (SIGTERM to its verified pid) and wait for it, so a
    ``fleetctl stop`` never tears down and collects at the same time as the monitor.

    A monitor already tearing down is given ``finish_wait`` to end the job itself; one that
    still runs after that is killed (SIGKILL, pid and start time checked again). Returns a
    line saying what happened, None when no live monitor watches the job.
    """
    try:
        info = folder.load_job().monitor
    except RunFolderError:
        return None
    if info is None or not monitor_alive(info):
        return None
    pid = int(info["pid"])
    if not _signal_verified(info, signal.SIGTERM):
        return None
    end = time.monotonic() + wait
    while time.monotonic() < end or _finishing(folder, pid, time.monotonic() < end + finish_wait):
        if not monitor_alive(info):
            return f"monitor pid {pid} exited"
        time.sleep(0.1)
    if _signal_verified(info, signal.SIGKILL):
        for _ in range(50):
            if not monitor_alive(info):
                break
            time.sleep(0.1)
        return f"monitor pid {pid} did not exit in time: killed"
    return f"monitor pid {pid} exited"


def _finishing(folder: RunFolder, pid: int, in_time: bool) -> bool:
    if not in_time:
        return False
    with contextlib.suppress(RunFolderError):
        info = folder.load_job().monitor
        return info is not None and info.get("pid") == pid and info.get("phase") == "finishing"
    return False


def _signal_verified(info: dict[str, Any], sig: int) -> bool:
    """Signal the monitor only while pid and start time still name it."""
    if not monitor_alive(info):
        return False
    try:
        os.kill(int(info["pid"]), sig)
    except ProcessLookupError:
        return False
    except PermissionError as e:
        raise FleetctlError(f"cannot signal monitor pid {info['pid']}: {e}") from e
    return True
