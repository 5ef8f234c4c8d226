"""``fleetctl run --slurm``: the batch script that runs fleetctl inside its own allocation, and
sbatch's answers (pure).

Why a script that runs fleetctl and not ``srun torchrun``: inside the allocation fleetctl's own
Slurm mode (``fleetctl.slurm.allocation``) does the check, the per-node NIC, the launch by
``srun`` steps, first-failure teardown and the run folder; the submitter only waits, streams the
script's output and reports. The script exports ``FLEETCTL_RUN_ID`` so the inside run uses the
run folder the submitter made (``adopted_job_id``), and runs ``fleetctl run --spec FILE``: the
job's options travel in FILE (``fleetctl.slurm.specfile``), never on a command line.

Every value the script holds on one of its lines is checked for control characters first: a
newline in ``--partition`` or ``--sbatch-arg`` would end the ``#SBATCH`` line and run the rest
as shell on the batch node.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl.errors import FleetctlError, UsageError
from fleetctl.slurm.allocation import GPUS_VAR as GPUS_VAR  # set by the batch script

#: set by the batch script: the fleetctl job id (and run folder) the inside run adopts
RUN_ID_VAR = "FLEETCTL_RUN_ID"
MAX_GRES_COUNT = 4096  # per node and GRES: a typo's count must not reach sbatch
OUTPUT_FILE = "slurm.out"  # in the run folder: the batch script's stdout
ERROR_FILE = "slurm.err"  # and its stderr (fleetctl's own lines, the summary)
SCRIPT_FILE = "sbatch.sh"  # in the run folder: the script as submitted
JOB_FILE_DIR = "job-file"  # in the run folder: --job's file as submitted (its own name kept)
#: --slurm-no-shared-fs: where the batch host keeps the job's output and run folder (its /tmp
#: exists everywhere, slurmstepd opens the output before the script can make a folder)
PRIVATE_ROOT = "/tmp/fleetctl-slurm-{job}"
FETCHED = ".fetched"  # the submitter has pulled the private run folder home
ENDED_MARK = "fleetctl-slurm: ended "  # + exit code: the batch script's last stderr line
FETCH_WAIT = 300  # s the batch script waits for the pull before it exits anyway
_GRES_NAME = re.compile(r"^[A-Za-z][\w.-]*$")  # gpu, shard, mps; and a type: a100, h100_80g
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SPEC_END = "FLEETCTL_RUN_SPEC_END"  # the here-document's end (the spec is one JSON line)
_JOB_ID = re.compile(r"^\w[\w.-]*$")
_TIME = re.compile(r"^(?:\d+-)?\d+(?::\d+){0,2}$|^\d+-\d+$|^(?:UNLIMITED|INFINITE)$", re.I)
#: sbatch errors that say Slurm could not be asked, not that the request is wrong (exit 3)
_TRANSIENT = (
    "unable to contact slurm controller",
    "socket timed out",
    "temporarily unable",
    "connection refused",
    "communication connection failure",
    "slurm_persist_conn",
    "could not establish a configuration source",  # no slurm.conf, no configless server
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
    command: tuple[str, ...]  # what the script runs: ``fleetctl run --spec FILE``
    partition: str | None = None
    gres: str | None = None
    time: str | None = None
    account: str | None = None
    extra: tuple[str, ...] = ()  # --sbatch-arg, verbatim
    env: Mapping[str, str] = field(default_factory=dict)  # exported before the command
    #: --slurm-no-shared-fs: the batch host cannot see ``folder``; output and the run
    #: folder stay under ``private_root`` there until the submitter pulls them
    private: bool = False
    #: the run inside's spec (``run --spec``'s file, ``fleetctl.slurm.specfile.document``):
    #: written into the run folder by the submitter, or (``private``) by the script on the
    #: batch host from a here-document
    spec: Mapping[str, Any] | None = None

    @property
    def spec_file(self) -> str:
        return spec_path(self.folder, self.job_id, private=self.private)

    @property
    def private_root(self) -> str:
        return PRIVATE_ROOT.format(job=self.job_id)

    @property
    def inside_folder(self) -> str:
        """The run folder as the run inside writes it."""
        return f"{self.private_root}/{self.job_id}" if self.private else self.folder

    @property
    def output(self) -> str:
        return f"{self.private_root}.out" if self.private else f"{self.folder}/{OUTPUT_FILE}"

    @property
    def error(self) -> str:
        return f"{self.private_root}.err" if self.private else f"{self.folder}/{ERROR_FILE}"


def spec_path(folder: str, job_id: str, *, private: bool) -> str:
    """Where the run inside reads its spec: the run folder, or (no shared filesystem) the
    batch host's private folder (the run folder there must be new: it is not in it)."""
    from fleetctl.slurm.specfile import SPEC_FILE  # not at import: every run reads GPUS_VAR

    return f"{PRIVATE_ROOT.format(job=job_id) if private else folder}/{SPEC_FILE}"


def check_line(what: str, value: str) -> str:
    """``value`` as it may stand on one line of the batch script: no control character (a
    newline ends an ``#SBATCH`` line and the rest runs as shell on the batch node)."""
    m = _CONTROL.search(value)
    if m:
        raise UsageError(
            f"{what} {value!r}: control character {m.group()!r} not allowed (it would end "
            "a line of the batch script)"
        )
    return value


def check_gres(value: str) -> str:
    """``gpu``, ``gpu:2``, ``gpu:a100:2``, ``shard:4`` or a comma list of them, each count a
    whole number 1..MAX_GRES_COUNT; UsageError otherwise."""
    check_line("--gres", value)
    for item in value.split(","):
        _gres_item(value, item)
    return value


def _gres_item(value: str, item: str) -> tuple[str, int]:
    """``NAME[:TYPE][:COUNT]`` → (name, count). A type starts with a letter; a field that
    does not is the count."""
    usage = f"--gres {value!r}: use NAME[:TYPE][:COUNT], e.g. gpu:1, gpu:a100:2 or shard:4"
    parts = item.split(":")
    if len(parts) > 3 or not _GRES_NAME.match(parts[0]):
        raise UsageError(usage)
    if len(parts) == 3 and not _GRES_NAME.match(parts[1]):
        raise UsageError(usage)
    if len(parts) == 1 or (len(parts) == 2 and _GRES_NAME.match(parts[1])):
        return parts[0], 1  # Slurm's default count
    last = parts[-1]
    if not (last.isascii() and last.isdigit()):
        raise UsageError(f"--gres {value!r}: count {last!r} is not a whole number")
    count = int(last)
    if not 1 <= count <= MAX_GRES_COUNT:
        raise UsageError(f"--gres {value!r}: count {count} is not within 1..{MAX_GRES_COUNT}")
    return parts[0], count


def gres_gpus(value: str | None) -> int | None:
    """The GPUs per node a (checked) ``--gres`` asks for; None without a ``gpu`` item."""
    if not value:
        return None
    counts = [n for name, n in (_gres_item(value, x) for x in value.split(",")) if name == "gpu"]
    return sum(counts) if counts else None


def check_time(value: str) -> str:
    """Slurm's time formats: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``."""
    check_line("--time", value)
    if not _TIME.match(value.strip()):
        raise UsageError(f"--time {value!r}: use MINUTES, HH:MM:SS or DAYS-HH:MM:SS (Slurm's)")
    return value.strip()


def check_request(req: BatchRequest) -> None:
    """Every value :func:`render` puts on a line of the script, named as the user gave it:
    UsageError for a control character (or a job id that is no plain name)."""
    if isinstance(req.nodes, bool) or not isinstance(req.nodes, int) or req.nodes < 1:
        raise UsageError(f"--nodes {req.nodes!r}: a whole number of nodes, 1 or more")
    if not _JOB_ID.match(req.job_id):
        raise UsageError(f"job id {req.job_id!r}: use letters, digits, '_', '.', '-'")
    for what, value in (
        ("--partition", req.partition),
        ("--gres", req.gres),
        ("--time", req.time),
        ("--account", req.account),
        ("--runs-dir", req.folder),
        ("the current folder (#SBATCH --chdir)", req.chdir),
        *(("--sbatch-arg", arg) for arg in req.extra),
        *((f"the batch script's {k}", v) for k, v in req.env.items()),
        *(("the batch script's command", arg) for arg in req.command),
    ):
        if value is not None:
            check_line(what, value)
    for key in req.env:
        if not re.match(r"^[A-Za-z_]\w*$", key):
            raise UsageError(f"the batch script's variable {key!r}: not a variable name")


def render(req: BatchRequest) -> str:
    """The batch script: ``#SBATCH`` lines, then the inside fleetctl exec'd (its exit code is
    the job's). UsageError for a value that would break out of its line (:func:`check_request`)."""
    check_request(req)
    lines = [
        "#!/bin/sh",
        f"#SBATCH --job-name=fleetctl-{req.job_id}",
        f"#SBATCH --nodes={req.nodes}",
    ]
    lines.append("#SBATCH --ntasks-per-node=1")
    # a node failing is fleetctl's to handle (lost node: teardown of the rest, logs home),
    # not Slurm's: without this Slurm kills the whole job when it marks a node DOWN, racing
    # that teardown and collection
    lines.append("#SBATCH --no-kill")
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
    if not req.private:
        lines.append(f"exec {shlex.join(req.command)}")
        return "\n".join(lines) + "\n"
    root, folder = shlex.quote(req.private_root), shlex.quote(req.inside_folder)
    spec = shlex.quote(req.spec_file)
    if req.spec is not None:  # the batch host cannot see the run folder: the spec comes here
        from fleetctl.slurm.specfile import dumps

        lines += [
            "# the run's options, for `fleetctl run --spec` (0600 in a 0700 folder, never on",
            "# a command line)",
            f"(umask 077 && mkdir -p {root} && [ ! -L {root} ] && [ -O {root} ] && "
            f"chmod 700 {root} && cat >{spec}) <<'{_SPEC_END}' || "
            f'{{ echo "fleetctl-slurm: cannot write {spec} (a folder of another user?)" >&2; '
            "exit 3; }",
            dumps(req.spec),
            _SPEC_END,
        ]
    lines += [
        "# no shared filesystem: fleetctl runs as a child (TERM passed on: scancel --batch);",
        "# once it has ended the submitter pulls the run folder by an srun step and says so",
        f"{shlex.join(req.command)} &",
        "pid=$!",
        "trap 'kill -TERM $pid 2>/dev/null' TERM INT",
        "while :; do wait $pid; code=$?; kill -0 $pid 2>/dev/null || break; done",
        f'echo "{ENDED_MARK}$code" >&2',
        "i=0",
        f"while [ ! -e {folder}/{FETCHED} ] && [ $i -lt {FETCH_WAIT * 2} ]; do",
        "  sleep 0.5; i=$((i+1))",
        "done",
        f"rm -rf {root} {shlex.quote(req.output)} {shlex.quote(req.error)}",
        "exit $code",
    ]
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
    # (``--test-only`` words the verdict ``allocation failure: …``)
    reasons = [re.sub(r"^(sbatch:\s*(error:\s*)?|allocation failure:\s*)", "", ln) for ln in lines]
    reasons = [r.replace("Batch job submission failed: ", "") for r in reasons]
    # the last line is sbatch's verdict; an earlier one often says which value (partition)
    reason = "; ".join(dict.fromkeys(r for r in reasons if r)) or f"exit code {returncode}"
    if any(t in reason.lower() for t in _TRANSIENT):
        return SlurmError(f"sbatch failed: {reason}")
    return UsageError(f"Slurm refused the job: {reason}")


def adopted_job_id(env: Mapping[str, str]) -> str | None:
    """Inside the batch script ``fleetctl run --slurm`` submitted: the job id to run as."""
    from fleetctl.slurm.allocation import job_id

    if not job_id(env):
        return None
    return env.get(RUN_ID_VAR) or None


def inside_command(python: str, spec_file: str) -> tuple[str, ...]:
    """``python -m fleetctl run --spec FILE``: no option value on the batch node's process
    list (``--env-var`` secrets), only the file's path."""
    return (python, "-m", "fleetctl", "run", f"--spec={spec_file}")


def role_nodes(instances: Sequence[tuple[str, int | None]], where: str) -> int:
    """The nodes a role job needs: one per task, the sum of its roles' ``instances``. A role
    without ``instances`` takes every free host of its group, which only the allocation knows:
    then ``--nodes`` must say it (UsageError)."""
    open_ended = [name for name, n in instances if n is None]
    if open_ended:
        raise UsageError(
            f"--slurm --job {where}: role {open_ended[0]!r} has no 'instances' (every free "
            "host of its group): give --nodes N, the nodes to ask Slurm for"
        )
    total = sum(n or 0 for _, n in instances)
    if total < 1:
        raise UsageError(f"--slurm --job {where}: no task to run")
    return total
