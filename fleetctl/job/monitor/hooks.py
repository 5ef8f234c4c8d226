"""``--on-failure CMD`` and ``--on-end CMD``: a local command run once the job ended — a
pager, a Slack webhook through curl, a Slurm drain script — told about the job in its
environment.

Each hook runs under ``/bin/sh -c`` in its own session, with the controller's environment plus
``FLEETCTL_*`` variables (:func:`hook_env`), its output (stdout and stderr) appended to
``hook-<name>.log`` in the run folder, for at most ``timeout`` seconds: then its whole process
group is sent SIGTERM and, 2 s later, SIGKILL. What a hook does never changes the run's exit
status: its end is a line in events.log and an event for the terminal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.job.records.runfolder import HOOK_LOG, RunFolder

if TYPE_CHECKING:
    from fleetctl.api.runspec import Observe
    from fleetctl.job.records.result import JobEvent, JobResult

DEFAULT_HOOK_TIMEOUT = 60.0  # s (RunSpec's --hook-timeout default)
KILL_WAIT = 2.0  # s between SIGTERM and SIGKILL of a hook past its time
FAILED = frozenset({"failed", "error"})  # the statuses --on-failure runs for


@dataclass(frozen=True)
class Hooks:
    """The run's hooks (None: not asked) and their time bound."""

    on_failure: str | None = None
    on_end: str | None = None
    timeout: float = DEFAULT_HOOK_TIMEOUT

    def __bool__(self) -> bool:
        return bool(self.on_failure or self.on_end)

    @classmethod
    def of(cls, observe: Observe) -> Hooks | None:
        """The hooks the run's ``--on-failure``/``--on-end`` ask for (None: none)."""
        return cls(observe.on_failure, observe.on_end, observe.hook_timeout) or None


@dataclass(frozen=True)
class HookRun:
    """How one hook ended: its exit code (None: killed after ``timeout``), where its output is."""

    name: str
    exit_code: int | None
    seconds: float
    log: Path

    def line(self) -> str:
        how = f"exited {self.exit_code}" if self.exit_code is not None else "killed: timed out"
        return f"--{self.name} {how} after {self.seconds:.1f}s (output: {self.log})"


def hook_env(
    job_id: str,
    status: str,
    folder: Path,
    *,
    result: JobResult | None = None,
    reason: str | None = None,
    culprit: tuple[str, int, str] | None = None,
) -> dict[str, str]:
    """The ``FLEETCTL_*`` variables a hook gets: the job, how it ended, the node that failed
    first (empty when none; ``culprit``: host, rank, how — the monitor's, which has no
    result), the post-mortem's likely causes, the run folder."""
    env = {
        "FLEETCTL_JOB_ID": job_id,
        "FLEETCTL_STATUS": str(status),
        "FLEETCTL_RUN_DIR": str(Path(folder).resolve()),
        "FLEETCTL_EXIT_CODE": "",
        "FLEETCTL_ATTEMPT": "1",
        "FLEETCTL_CULPRIT_HOST": "",
        "FLEETCTL_CULPRIT_RANK": "",
        "FLEETCTL_CULPRIT_REASON": "",
        "FLEETCTL_LIKELY_CAUSE": "",
        "FLEETCTL_REASON": reason or "",
    }
    if culprit is not None:
        host, rank, how = culprit
        env.update(FLEETCTL_CULPRIT_HOST=host, FLEETCTL_CULPRIT_RANK=str(rank))
        env["FLEETCTL_CULPRIT_REASON"] = how
    if result is not None:
        env["FLEETCTL_EXIT_CODE"] = str(result.exit_code)
        env["FLEETCTL_ATTEMPT"] = str(result.attempt)
        failed = result.failed_node
        if failed is not None:
            env["FLEETCTL_CULPRIT_HOST"] = failed.host
            env["FLEETCTL_CULPRIT_RANK"] = str(failed.rank)
            env["FLEETCTL_CULPRIT_REASON"] = failed.how()
        env["FLEETCTL_LIKELY_CAUSE"] = "; ".join(result.culprits or ())
        env["FLEETCTL_REASON"] = (
            reason
            or (f"node {failed.rank} ({failed.host}): {failed.how()}" if failed else result.verdict)
            or ""
        )
    return env


def run_hook(
    name: str, command: str, env: Mapping[str, str], folder: Path, timeout: float
) -> HookRun:
    """Run one hook to its end or its time bound; its output appended to the run folder."""
    log = Path(folder) / HOOK_LOG.format(name=name)
    fd = RunFolder(Path(folder)).open_hook_log(name)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=str(folder),
            start_new_session=True,  # its own process group: a timeout ends all it started
            close_fds=True,
        )
    except OSError as e:
        os.write(fd, f"fleetctl: cannot start the hook: {e}\n".encode())
        os.close(fd)
        return HookRun(name, 127, 0.0, log)
    os.close(fd)
    try:
        code: int | None = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        code = None
        _kill_group(proc)
    except KeyboardInterrupt:  # Ctrl-C: the hook goes too (its own session would outlive us)
        _kill_group(proc)
        raise
    return HookRun(name, code, time.monotonic() - start, log)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL, to the hook's process group (its pgid is its pid: we made it a
    session leader, not reaped yet when the first signal goes), and reap the hook."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(KILL_WAIT)


def run_hooks(
    hooks: Hooks,
    job_id: str,
    status: str,
    folder: Path,
    *,
    result: JobResult | None = None,
    reason: str | None = None,
    culprit: tuple[str, int, str] | None = None,
    on_event: Callable[[JobEvent], None] | None = None,
) -> list[HookRun]:
    """``--on-failure`` (the job failed, or could not start) then ``--on-end`` (always). Never
    raises for a hook: a failing or hanging one is a warning."""
    from fleetctl.job.records.result import JobEvent

    todo = []
    if hooks.on_failure and str(status) in FAILED:
        todo.append(("on-failure", hooks.on_failure))
    if hooks.on_end:
        todo.append(("on-end", hooks.on_end))
    env = hook_env(job_id, status, folder, result=result, reason=reason, culprit=culprit)
    out = []
    for name, command in todo:
        try:
            ran = run_hook(name, command, env, folder, hooks.timeout)
        except OSError as e:  # the run folder is gone or full: a note, never the run's fate
            if on_event is not None:
                on_event(JobEvent("warning", f"--{name} not run: {e}"))
            continue
        out.append(ran)
        with contextlib.suppress(OSError):
            RunFolder(Path(folder)).event(f"hook {ran.line()}")
        if on_event is not None:
            on_event(JobEvent("notice" if ran.exit_code == 0 else "warning", ran.line()))
    return out
