"""``fleetctl run --slurm``: the batch script that runs fleetctl inside its own allocation, and
sbatch's answers (pure).

Why a script that runs fleetctl and not ``srun torchrun``: inside the allocation fleetctl's own
Slurm mode (``fleetctl.slurm.allocation``) does the check, the per-node NIC, the launch by
``srun`` steps, first-failure teardown and the run folder; the submitter only waits, streams the
script's output and reports. The script exports ``FLEETCTL_RUN_ID`` so the inside run uses the
run folder the submitter made (``adopted_job_id``).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fleetctl.errors import FleetctlError, UsageError

#: set by the batch script: the fleetctl job id (and run folder) the inside run adopts
RUN_ID_VAR = "FLEETCTL_RUN_ID"
OUTPUT_FILE = "slurm.out"  # in the run folder: the batch script's stdout
ERROR_FILE = "slurm.err"  # and its stderr (fleetctl's own lines, the summary)
SCRIPT_FILE = "sbatch.sh"  # in the run folder: the script as submitted
_GRES_ITEM = re.compile(r"^[A-Za-z][\w.-]*(?::[\w.-]+)?(?::\d+)?$")
_TIME = re.compile(r"^(?:\d+-)?\d+(?::\d+){0,2}$|^\d+-\d+$|^(?:UNLIMITED|INFINITE)$", re.I)
#: sbatch errors that say Slurm could not be asked, not that the request is wrong (exit 3)
_TRANSIENT = (
    "unable to contact slurm controller",
    "socket timed out",
    "temporarily unable",
    "connection refused",
    "communication connection failure",
    "slurm_persist_conn",
)


class SlurmError(FleetctlError):
    """Slurm could not be asked or did not answer (sbatch, squeue, scancel): exit 3."""

    exit_code = 3


class QueueTimeout(FleetctlError):
    """The job did not start within ``--queue-timeout`` (it was cancelled): exit 5, apart
    from a failed job (3) and incomplete logs (4), so a script can resubmit elsewhere."""

    exit_code = 5


class SlurmJobFailed(FleetctlError):
    """The job ran inside and failed: the inside run's exit code (3, or 2 for a bad request
    only the allocation could judge)."""

    def __init__(self, message: str, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class BatchRequest:
    """What the user asked Slurm for, and the fleetctl command the script runs inside."""

    nodes: int
    job_id: str  # fleetctl's job id: the run folder's name
    folder: str  # absolute path of the run folder (shared with the nodes)
    chdir: str  # where the inside fleetctl starts (the submitter's cwd)
    command: tuple[str, ...]  # the inside ``fleetctl run …`` argv
    partition: str | None = None
    gres: str | None = None
    time: str | None = None
    account: str | None = None
    extra: tuple[str, ...] = ()  # --sbatch-arg, verbatim
    env: Mapping[str, str] = field(default_factory=dict)  # exported before the command

    @property
    def output(self) -> str:
        return f"{self.folder}/{OUTPUT_FILE}"

    @property
    def error(self) -> str:
        return f"{self.folder}/{ERROR_FILE}"


def check_gres(value: str) -> str:
    """``gpu:2``, ``gpu:a100:2``, ``shard:4`` or a comma list of them; UsageError otherwise."""
    items = value.split(",")
    if not items or any(not _GRES_ITEM.match(x) for x in items):
        raise UsageError(f"--gres {value!r}: use NAME[:TYPE]:COUNT, e.g. gpu:1 or shard:4")
    return value


def check_time(value: str) -> str:
    """Slurm's time formats: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``."""
    if not _TIME.match(value.strip()):
        raise UsageError(f"--time {value!r}: use MINUTES, HH:MM:SS or DAYS-HH:MM:SS (Slurm's)")
    return value.strip()


def render(req: BatchRequest) -> str:
    """The batch script: ``#SBATCH`` lines, then the inside fleetctl exec'd (its exit code is
    the job's)."""
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name=fleetctl-{req.job_id}",
        f"#SBATCH --nodes={req.nodes}",
    ]
    lines.append("#SBATCH --ntasks-per-node=1")
    for flag, value in (
        ("partition", req.partition),
        ("gres", req.gres),
        ("time", req.time),
        ("account", req.account),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [f"#SBATCH --output={req.output}", f"#SBATCH --error={req.error}"]
    lines.append(f"#SBATCH --chdir={req.chdir}")
    lines += [f"#SBATCH {arg}" for arg in req.extra]
    lines.append("# written by fleetctl run --slurm: the same job run inside the allocation")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in req.env.items()]
    lines.append(f"exec {shlex.join(req.command)}")
    return "\n".join(lines) + "\n"


def parse_job_id(stdout: str) -> str:
    """``sbatch --parsable`` → the job id (``42`` or ``42;cluster``)."""
    first = stdout.strip().splitlines()[0] if stdout.strip() else ""
    job = first.split(";", 1)[0].strip()
    if not job.isdigit():
        raise FleetctlError(f"sbatch answered no job id: {stdout.strip()[:200]!r}")
    return job


def submit_error(stderr: str, returncode: int) -> FleetctlError:
    """sbatch refusing → one line quoting Slurm's reason: exit 2 when the request is wrong
    (partition, node count, gres, time, account), 3 when Slurm could not be asked."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    reasons = [re.sub(r"^sbatch:\s*(error:\s*)?", "", ln) for ln in lines]
    reasons = [r.replace("Batch job submission failed: ", "") for r in reasons]
    # the last line is sbatch's verdict; an earlier one often says which value (partition)
    reason = "; ".join(dict.fromkeys(r for r in reasons if r)) or f"exit code {returncode}"
    if any(t in reason.lower() for t in _TRANSIENT):
        return SlurmError(f"sbatch failed: {reason}")
    return UsageError(f"Slurm refused the job: {reason}")


def adopted_job_id(env: Mapping[str, str]) -> str | None:
    """Inside the batch script ``fleetctl run --slurm`` submitted: the job id to run as."""
    if not (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")):
        return None
    return env.get(RUN_ID_VAR) or None


def inside_command(
    python: str, options: Sequence[str], script: str, script_args: Sequence[str]
) -> tuple[str, ...]:
    """``python -m fleetctl run OPTIONS SCRIPT ARGS…``: the job run inside the allocation."""
    return (python, "-m", "fleetctl", "run", *options, script, *script_args)
