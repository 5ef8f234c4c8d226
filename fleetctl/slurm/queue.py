"""What Slurm says about a submitted job: ``scontrol show job -o`` and ``squeue`` parsed (pure).

Why scontrol for the state: it answers for a finished job too (until ``MinJobAge``), with its
``ExitCode``, where squeue only lists jobs still in the queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: a job in these states has left the queue for good
TERMINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
#: pending reasons that mean the job can never start as asked: the request is wrong (exit 2)
HOPELESS = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "AssocMaxNodesPerJobLimit",
        "AssocMaxWallDurationPerJobLimit",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
    }
)
_FIELD = re.compile(r"(?:^|\s)(\w+(?:[/:]\w+)*)=(\S*)")


@dataclass(frozen=True)
class JobInfo:
    """One Slurm job as scontrol shows it."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, …
    reason: str | None = None  # why pending (None when Slurm says None)
    exit_code: int | None = None  # the batch script's, from ExitCode=CODE:SIGNAL
    signal: int | None = None
    nodes: str | None = None  # NodeList, a hostlist expression
    batch_host: str | None = None

    @property
    def pending(self) -> bool:
        return self.state in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "SUSPENDED")

    @property
    def done(self) -> bool:
        return self.state in TERMINAL

    @property
    def hopeless(self) -> bool:
        return self.pending and self.reason in HOPELESS


def parse_show_job(text: str) -> JobInfo | None:
    """``scontrol show job -o J`` → JobInfo; None for "Invalid job id" (no JobId= line)."""
    for line in text.splitlines():
        if "JobId=" not in line:
            continue
        f = dict(_FIELD.findall(line))
        state = (f.get("JobState") or "UNKNOWN").split("+", 1)[0]
        code = sig = None
        m = re.match(r"^(\d+):(\d+)$", f.get("ExitCode", ""))
        if m:
            code, sig = int(m.group(1)), int(m.group(2))
        reason = f.get("Reason")
        nodes = f.get("NodeList")
        return JobInfo(
            job_id=f.get("JobId", ""),
            state=state,
            reason=None if reason in (None, "", "None") else reason,
            exit_code=code,
            signal=sig or None,
            nodes=None if nodes in (None, "", "(null)") else nodes,
            batch_host=None if f.get("BatchHost") in (None, "", "(null)") else f["BatchHost"],
        )
    return None


def queue_position(squeue_pending: str, job_id: str) -> int | None:
    """1-based place of ``job_id`` among pending jobs, from ``squeue -h -t PD -o %i
    --sort=-p,i`` (highest priority first); None when it is not pending."""
    ids = [ln.strip() for ln in squeue_pending.splitlines() if ln.strip()]
    return ids.index(job_id) + 1 if job_id in ids else None


def in_queue(squeue_job: str) -> bool:
    """``squeue -h -j J -o %T``: any line means the job (or one of its steps with ``-s``) is
    still there; Slurm prints nothing for a finished job."""
    return any(ln.strip() for ln in squeue_job.splitlines())


def describe(info: JobInfo, position: int | None = None) -> str:
    """``PENDING (Resources), 2nd in queue`` for the waiting line."""
    text = info.state + (f" ({info.reason})" if info.reason else "")
    if position is not None:
        text += f", position {position} in queue"
    return text
