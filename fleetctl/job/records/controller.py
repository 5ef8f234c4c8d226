"""Who a process is, beyond its pid (pid + /proc start time + boot id + host): the controller's
``controller.json`` in the run folder and the detached monitor's entry in job.json both record
it, so a pid that was reused is never mistaken for the process that wrote it."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from fleetctl.remote.kit.procfs import proc_start_time


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def identity(pid: int | None = None) -> dict[str, Any]:
    """Who a process is, beyond its pid: start time, boot, host."""
    pid = os.getpid() if pid is None else pid
    return {
        "pid": pid,
        "start_time": proc_start_time(pid),
        "boot_id": boot_id(),
        "host": socket.gethostname(),
    }
