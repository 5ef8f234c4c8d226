"""What a :class:`fleetctl.api.job.Job` asks of the executor that runs its job: one interface,
one module per variant.

- ``direct`` (:class:`fleetctl.api.direct.Direct`): the job runs on its nodes over SSH,
  locally or as ``srun`` steps, controlled from this process (attached: a background thread;
  ``foreground``: the calling thread) or, detached or found again by id, through its run
  folder and node supervisors.
- ``sbatch`` (:class:`fleetctl.api.submitted.Submitted`): ``run --slurm`` submitted it; its
  controller is the fleetctl inside the batch script, reached through Slurm (queue state,
  the script's output, ``scancel``) and, once it ran, through the same run folder.

``Job`` holds one executor and hands every call to it; it never asks which kind it holds.
The run folder's job.json ``executor`` says which one ``Job.attach`` builds. A new executor is
a module with this interface and a test in ``tests/pure/test_executors.py``.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from fleetctl.errors import FleetctlError

if TYPE_CHECKING:
    from fleetctl.api.lifecycle import StatusReport, StopReport
    from fleetctl.api.result import LogLine, RunResult
    from fleetctl.api.submitted import Queued, Submitted
    from fleetctl.job.monitor.process import SpawnedMonitor
    from fleetctl.job.records.result import JobResult

ExecutorKind = Literal["direct", "sbatch"]

LINE_BUFFER = 100_000  # lines held for lines() until read; older ones are dropped (all on disk)
POLL = 2.0  # s between looks at a job's record (or Slurm's queue) while waiting


class WaitTimeout(FleetctlError, TimeoutError):
    """``Job.wait(timeout=…)`` ran out before the job ended (the job runs on)."""


@runtime_checkable
class Executor(Protocol):
    """The calls a ``Job`` hands to its executor; the signatures are ``Job``'s own (see its
    methods for what each promises). ``details``/``monitor`` belong to a direct run here,
    ``submitted`` to a submitted job: the other executor answers None."""

    @property
    def kind(self) -> ExecutorKind: ...

    @property
    def job_id(self) -> str: ...

    @property
    def run_folder(self) -> Path: ...

    @property
    def done(self) -> bool: ...

    @property
    def details(self) -> JobResult | None: ...

    @property
    def monitor(self) -> SpawnedMonitor | None: ...

    @property
    def submitted(self) -> Submitted | None: ...

    def lines(self, timeout: float | None = None) -> Iterator[LogLine]: ...

    def wait(self, timeout: float | None = None, *, queued: Queued | None = None) -> RunResult: ...

    def error(self, result: RunResult) -> FleetctlError | None: ...

    def stop(
        self,
        grace: float = 5.0,
        *,
        collect: bool = True,
        collect_max: int | None = None,
        collect_exclude: Sequence[str] | None = None,
        ended_too: bool = False,
        check: bool = True,
        on_note: Callable[[str], None] | None = None,
    ) -> StopReport | None: ...

    def status(self) -> StatusReport: ...


class LineFeed:
    """The lines ``lines()`` yields, in arrival order, bounded; closed when no more come.
    Filled by the thread that reads them (the run, a log follower, the batch output's
    follower), emptied by the caller's."""

    def __init__(self) -> None:
        self.buf: collections.deque[LogLine] = collections.deque()
        self.cond = threading.Condition()
        self.closed = False
        self.dropped = 0

    def put(self, lines: list[LogLine]) -> None:
        with self.cond:
            self.buf.extend(lines)
            while len(self.buf) > LINE_BUFFER:
                self.buf.popleft()
                self.dropped += 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def get(self, timeout: float | None) -> LogLine | None:
        """The next line; None once closed and empty. WaitTimeout after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while not self.buf:
                if self.closed:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise WaitTimeout(f"no output line within {timeout:g} s")
                self.cond.wait(min(1.0, left) if left is not None else 1.0)
            return self.buf.popleft()


def wait_until(
    done: Callable[[], bool], deadline: float | None, what: str, timeout: float | None
) -> None:
    """Poll ``done()`` every :data:`POLL` s; WaitTimeout once ``deadline`` (monotonic) passed."""
    while not done():
        if deadline is not None and time.monotonic() > deadline:
            raise WaitTimeout(f"{what} still running after {timeout:g} s")
        time.sleep(POLL)
