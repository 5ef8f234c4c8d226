"""``fleetctl run --slurm``: submit the batch job, wait for it to start, follow its output, and
``scancel`` it (verified) when the submitter is stopped.

The job itself runs fleetctl inside its allocation (``fleetctl.slurm.batch``), which does the
check, launch, first-failure teardown and run folder; this side only watches Slurm and the
script's output file, which lies in the run folder on the filesystem the cluster shares. Every
Slurm command and every wait is bounded; progress is reported as ``SlurmEvent``s, never printed.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import UsageError
from fleetctl.slurm.batch import QueueTimeout, SlurmError, parse_job_id, submit_error
from fleetctl.slurm.queue import JobInfo, describe, in_queue, parse_show_job, queue_position

if TYPE_CHECKING:
    from fleetctl.slurm.private import PrivateFollower

COMMAND_TIMEOUT = 30.0  # one sbatch/squeue/scontrol/scancel call
CANCEL_TIMEOUT = 90.0  # scancel → the job and every step of it gone from the queue
GRACEFUL_TIMEOUT = 30.0  # SIGTERM to the fleetctl inside → its teardown and collect done
POLL = 0.2  # s between reads of the output file (and whether the run inside has ended)
#: s between asks of slurmctld while the run inside is live: every ask is an RPC that a busy
#: slurmctld serves late, and the run inside says itself when it has ended (its job.json)
STATE_EVERY = 2.0
STATE_EVERY_ENDED = 0.1  # ... once it has: the batch script exits right after


@dataclass(frozen=True)
class SlurmEvent:
    """One thing the submitter saw: ``waiting`` (state/reason/position changed), ``started``,
    ``line``/``errline`` (one line of the job's stdout/stderr), ``cancelling``, ``cancelled``,
    ``cancel_failed``, ``ended``."""

    kind: str
    job_id: str
    text: str = ""
    info: JobInfo | None = None


Emit = Callable[[SlurmEvent], None]


class SlurmClient:
    """Slurm's commands as this process may run them: bounded, errors as ``SlurmError``."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(os.environ if env is None else env)

    def _run(
        self, argv: list[str], *, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT
    ) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv,
                input=stdin if stdin is not None else "",
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
            )
        except FileNotFoundError as e:
            raise UsageError(
                f"--slurm: `{argv[0]}` not found (is Slurm's client installed?)"
            ) from e
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SlurmError(f"`{' '.join(argv)}` failed: {e}") from e

    def sbatch(self, script: str) -> str:
        """Submit ``script`` (on stdin); the job id. Refusals are one-line errors (batch)."""
        p = self._run(["sbatch", "--parsable"], stdin=script)
        if p.returncode != 0:
            raise submit_error(p.stderr or p.stdout, p.returncode)
        return parse_job_id(p.stdout)

    def test_only(self, script: str) -> None:
        """``sbatch --test-only``: slurmctld judges ``script`` as it would a submission, and
        nothing is queued. Refusals raise as :meth:`sbatch`'s do (UsageError, SlurmError)."""
        p = self._run(["sbatch", "--test-only"], stdin=script)
        if p.returncode != 0:
            raise submit_error(p.stderr or p.stdout, p.returncode)

    def show(self, job: str) -> JobInfo | None:
        """The job as slurmctld knows it; None once it has forgotten it (``MinJobAge``)."""
        p = self._run(["scontrol", "show", "job", "-o", job])
        if p.returncode != 0:
            if "invalid job id" in (p.stderr + p.stdout).lower():
                return None
            raise SlurmError(f"scontrol show job {job}: {(p.stderr or p.stdout).strip()}")
        return parse_show_job(p.stdout)

    def position(self, job: str) -> int | None:
        p = self._run(["squeue", "-h", "-t", "PD", "-o", "%i", "--sort=-p,i"])
        return queue_position(p.stdout, job) if p.returncode == 0 else None

    def queued(self, job: str, *, steps: bool = False) -> bool:
        """The job (``steps``: any step of it) is still in the queue."""
        p = self._run(["squeue", "-h", *(["-s"] if steps else []), "-j", job, "-o", "%i %T"])
        if p.returncode != 0:
            if "invalid job id" in (p.stderr + p.stdout).lower():
                return False
            raise SlurmError(f"squeue -j {job}: {(p.stderr or p.stdout).strip()}")
        return in_queue(p.stdout)

    def cancel(self, job: str, *, graceful: bool = False, timeout: float = CANCEL_TIMEOUT) -> None:
        """Cancel and wait until neither the job nor a step of it is left in the queue.

        ``graceful``: first SIGTERM to the batch script alone (the fleetctl inside, which
        then stops its ranks on every node, verified, and brings the logs home), and only
        after ``GRACEFUL_TIMEOUT`` a plain ``scancel``: killing every step at once leaves
        slurmstepd waiting a minute on the IO of steps whose srun is gone."""
        info = self.show(job) if graceful else None
        if info is not None and info.state == "RUNNING":  # scancel --signal waits on others
            p = self._run(["scancel", "--batch", "--signal=TERM", job], timeout=10.0)
            if p.returncode == 0 and self._wait_gone(job, GRACEFUL_TIMEOUT):
                return
        self._scancel(job)
        if not self._wait_gone(job, timeout):
            raise SlurmError(
                f"Slurm job {job}: still in the queue {timeout:g}s after scancel "
                f"(`squeue -j {job}`)"
            )

    def _scancel(self, job: str, *flags: str) -> None:
        p = self._run(["scancel", *flags, job])
        if p.returncode != 0 and "invalid job id" not in (p.stderr + p.stdout).lower():
            raise SlurmError(f"scancel {job}: {(p.stderr or p.stdout).strip()}")

    def _wait_gone(self, job: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.queued(job) or self.queued(job, steps=True):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True


def wait_started(
    slurm: SlurmClient, job: str, emit: Emit, *, queue_timeout: float | None
) -> JobInfo:
    """Block until the job runs (or has already ended); the waiting line on every change.
    A job that can never start as asked, or does not start in ``queue_timeout``, is cancelled
    (verified) and raised: UsageError (exit 2) / QueueTimeout (exit 5)."""
    start = time.monotonic()
    last = None
    while True:
        info = slurm.show(job)
        if info is None:
            raise SlurmError(f"Slurm job {job}: slurmctld no longer knows it")
        if not info.pending:
            return info
        pos = slurm.position(job) if info.state == "PENDING" else None
        if info.hopeless:
            slurm.cancel(job)
            raise UsageError(f"Slurm job {job} can never start as asked ({info.reason}); cancelled")
        line = describe(info, pos)
        if line != last:
            emit(SlurmEvent("waiting", job, line, info))
            last = line
        waited = time.monotonic() - start
        if queue_timeout is not None and waited >= queue_timeout:
            emit(SlurmEvent("cancelling", job, f"not started after {queue_timeout:g}s"))
            slurm.cancel(job)
            raise QueueTimeout(
                f"Slurm job {job} did not start within --queue-timeout {queue_timeout:g}s "
                f"({describe(info)}); cancelled"
            )
        time.sleep(0.25 if waited < 5 else 1.0)


class OutputTail:
    """New complete lines of a file another machine appends to (the job's output)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 0
        self._rest = b""

    def lines(self, *, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self._pos += len(data)
        data = self._rest + data
        *done, self._rest = data.split(b"\n")
        if final and self._rest:
            done.append(self._rest)
            self._rest = b""
        return [ln.decode("utf-8", "replace") for ln in done]


def follow(
    slurm: SlurmClient,
    job: str,
    output: Path,
    emit: Emit,
    error: Path | None = None,
    *,
    ended: Callable[[], bool],
) -> JobInfo:
    """Stream the job's output (``line``) and error (``errline``) lines until Slurm says it
    ended; its last state. ``ended``: the run inside has written its end to the run folder
    (its job.json, read through the record by the caller: this layer is below the records);
    Slurm is then asked often, the batch script's end being a moment away."""
    tails = [("line", OutputTail(output))] + ([("errline", OutputTail(error))] if error else [])
    asked = 0.0
    while True:
        for kind, tail in tails:
            for ln in tail.lines():
                emit(SlurmEvent(kind, job, ln))
        every = STATE_EVERY_ENDED if ended() else STATE_EVERY
        if time.monotonic() - asked >= every:
            asked = time.monotonic()
            info = slurm.show(job)
            if info is None or info.done:
                # Slurm's view can lead the file's by a write: a last read after it
                for kind, tail in tails:
                    for ln in tail.lines(final=True):
                        emit(SlurmEvent(kind, job, ln))
                return info or JobInfo(job, "COMPLETED")
        time.sleep(POLL)


def _stop_and_pull(
    slurm: SlurmClient, job: str, info: JobInfo, private: PrivateFollower, emit: Emit
) -> None:
    """No shared filesystem: SIGTERM to the fleetctl inside (it stops the ranks and collects
    on the batch host), then follow on until its folder is pulled home, within
    ``GRACEFUL_TIMEOUT``; the caller's scancel ends what is left."""
    from fleetctl.errors import FleetctlError
    from fleetctl.slurm.private import follow_private

    if info.done or info.pending:
        return
    p = slurm._run(["scancel", "--batch", "--signal=TERM", job], timeout=10.0)
    if p.returncode != 0:
        return
    deadline = time.monotonic() + GRACEFUL_TIMEOUT
    try:
        follow_private(slurm, job, info, private, emit, deadline=deadline)
    except FleetctlError as e:
        emit(SlurmEvent("cancel_failed", job, e.one_line()))


def run_submitted(
    slurm: SlurmClient,
    job: str,
    output: Path,
    emit: Emit,
    *,
    queue_timeout: float | None,
    on_state: Callable[[JobInfo], None] | None = None,
    error: Path | None = None,
    private: PrivateFollower | None = None,
    ended: Callable[[], bool],
) -> JobInfo:
    """Wait for the job, follow it to its end. Whatever stops this side first (Ctrl-C, an
    error) cancels the job, verified gone with every step, before it propagates.
    ``ended``: :func:`follow`'s (the run folder says the run inside has ended).
    ``private`` (no shared filesystem): the output comes through the batch host, whose run
    folder is pulled home once the run inside has ended (``fleetctl.slurm.private``)."""
    try:
        return _run_submitted(
            slurm, job, output, emit, queue_timeout, on_state, error, private, ended
        )
    finally:
        if private is not None:
            private.stop()


def _run_submitted(
    slurm: SlurmClient,
    job: str,
    output: Path,
    emit: Emit,
    queue_timeout: float | None,
    on_state: Callable[[JobInfo], None] | None,
    error: Path | None,
    private: PrivateFollower | None,
    ended: Callable[[], bool],
) -> JobInfo:
    from fleetctl.slurm.private import follow_private

    info: JobInfo | None = None
    try:
        info = wait_started(slurm, job, emit, queue_timeout=queue_timeout)
        if on_state is not None:
            on_state(info)
        if not info.done:
            emit(SlurmEvent("started", job, info.nodes or "", info))
            if private is not None:
                info = follow_private(slurm, job, info, private, emit)
            else:
                info = follow(slurm, job, output, emit, error, ended=ended)
        if on_state is not None:
            on_state(info)
        emit(SlurmEvent("ended", job, describe(info), info))
        return info
    except (QueueTimeout, UsageError):
        raise  # cancelled already
    except BaseException:
        emit(SlurmEvent("cancelling", job, "SIGTERM to the fleetctl inside, then scancel"))
        try:
            try:
                if private is not None and info is not None and not private.pulled:
                    _stop_and_pull(slurm, job, info, private, emit)
                slurm.cancel(job, graceful=private is None)
            except KeyboardInterrupt:  # a second Ctrl-C: no more waiting for the inside
                slurm.cancel(job)
        except SlurmError as e:  # reported beside the original error, never instead of it
            emit(SlurmEvent("cancel_failed", job, e.one_line()))
        else:
            emit(SlurmEvent("cancelled", job, "gone from the queue, no step left"))
        raise
