"""``RunSpec``: the one record of a run — what to run, on how many hosts, how it is supervised,
retried, collected, benchmarked, contained, submitted, monitored and observed (metrics, hooks)
— in nested frozen groups.

Each field carries its option's metadata (:func:`option`: flags, help, check, the click
parameter's name), so the command's options and the library's keywords are one list, and
**validation lives on the record**: every group checks its fields in ``__post_init__`` with the
checks of :mod:`fleetctl.api.checks` (the same ones the command's option types call), so
``Fleet.run(timeout=nan)`` and ``fleetctl run --timeout nan`` both refuse with
``Invalid value for '--timeout': 'nan' is not a finite number`` (``UsageError``, exit 2).

Adding a run option: a field here (with its flags, help and check), its consumer (where the
job reads ``spec.<group>.<field>``), and a test (docs/api.md, "Adding a run option").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from fleetctl.api import checks as c
from fleetctl.api import runspec_collective as sub
from fleetctl.api.runspec_fields import _Group, keyword, option
from fleetctl.api.runspec_fields import hint as hint  # re-exported: the JSON form, the CLI
from fleetctl.api.runspec_fields import refuse as refuse
from fleetctl.errors import UsageError
from fleetctl.plan.userinput import (
    AGREE,
    MAX_BACKOFF,
    MAX_RETRIES,
    ON_SLOW,
    PROBE_TIMEOUT,
    PROBE_TIMEOUT_MAX,
    WINDOW,
    OnSlow,
)

if TYPE_CHECKING:
    from fleetctl.job.run.retry import RetryPolicy
    from fleetctl.node import Node
    from fleetctl.phases.check.preflight import CheckOptions
    from fleetctl.phases.collect import CollectOptions
    from fleetctl.phases.push.request import PushRequest
    from fleetctl.plan.collective import CollectiveOptions
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.plan.retryrules import RetrySpec
    from fleetctl.transport.connection import SSHSettings

# --startup-timeout where only --stall-timeout is given: loading a large model, compiling,
# joining a slow rendezvous take minutes before the job's first line
DEFAULT_STARTUP = 1800.0

BeforeHook = Callable[[Sequence["Node"], "SSHSettings | None"], None]


@dataclass(frozen=True)
class Program(_Group):
    """What to run: SCRIPT (or a role job), its launcher, code and environment."""

    TITLE = "What to run"

    script: str | None = option(None, check=c.TEXT)
    args: tuple[str, ...] = option((), kw="args")
    launcher: str = option(
        "torchrun", "--launcher", check=c.OneOf(c.launchers), show_default=True,
        help="How each node starts its processes.",
    )  # fmt: skip
    nproc_per_node: int | str = option(
        "auto", "--nproc-per-node", param="nproc", check=c.nproc, show_default=True,
        type_name="N|auto",
        help="Processes per node; auto = one per GPU (all nodes must agree), 1 without GPUs.",
    )  # fmt: skip
    master_port: int | None = option(
        None, "--master-port", check=c.count(1, 65535),
        help="Rendezvous port on node 0 (paddle: its start port). Default: the first port from "
        "29500 that is free and not held by another fleetctl job, claimed for this job; given, "
        "that port or a clear refusal.",
    )  # fmt: skip
    launcher_args: tuple[str, ...] = option(
        (), "--launcher-arg", check=c.TEXT, metavar="ARG",
        help="Passed to the launcher after fleetctl's own flags, before SCRIPT (repeatable): "
        "--launcher-arg=--max-restarts=3. Options fleetctl sets (--nnodes, --node-rank, --ips, "
        "--hostfile, …) are refused.",
    )  # fmt: skip
    env: Mapping[str, str] | None = option(
        None, "--env-var", param="env_vars", check=c.env_map, cli="pairs", metavar="NAME=VALUE",
        help="Extra env for every node; wins over fleetctl_env. Repeatable.",
    )  # fmt: skip
    backend: str | None = option(
        None, "--backend", check=c.OneOf(c.backends),
        help="Hint for the script (FLEET_BACKEND); default: the script decides.",
    )  # fmt: skip
    code: str | None = option(
        None, "--code-dir", "--code", param="code_dir", check=c.path, cli="dir",
        help="Local folder shipped to the nodes; SCRIPT must be inside it "
        "(default: the git work tree holding SCRIPT, else SCRIPT's folder).",
    )  # fmt: skip
    allow_secrets: tuple[str, ...] = option(
        (), "--allow-secret", check=c.TEXT, metavar="PATH",
        help="Ship this file although it looks like a private key (path relative to the code "
        "folder; repeatable). Without it such files stop the push.",
    )  # fmt: skip
    env_archive: str | None = option(
        None, "--env", check=c.path, cli="regular",
        help="conda-pack archive to push and run the job in (default: fleetctl_env_archive).",
    )  # fmt: skip
    before: str | BeforeHook | None = option(
        None, "--before", check=c.before, metavar="FILE:TASK",
        help="A Fabric task (fabfile.py:prepare) run on every node, each with its Connection, "
        "after the check and push, before the launch; failing on a node stops the run there.",
    )  # fmt: skip
    job_file: str | None = option(
        None, "--job", check=c.path, cli="file",
        help="Role job file (roles, ports, completion policy); replaces SCRIPT.",
    )  # fmt: skip
    env_style: str | None = option(
        None, "--env-style", check=c.OneOf(("fleet", "pai")),
        help="Role env names: fleet (FLEET_*), or pai (adds OpenPAI's PAI_*).",
    )  # fmt: skip

    def push_request(self, code: str) -> PushRequest:
        """What the run pushes: ``code`` (the folder as resolved), this archive and policy."""
        from fleetctl.phases.push.request import PushRequest

        return PushRequest(code, self.env_archive, self.allow_secrets)


@dataclass(frozen=True)
class Hosts(_Group):
    """Where: how many of the selection's hosts, and what their check lets pass."""

    TITLE = "Where"

    check: bool = option(
        True, "--no-check", param="no_check", help="Skip the preflight check (connect only)."
    )
    nodes: int | None = option(
        None, "--nodes", param="nodes_wanted", check=c.count(1), metavar="N",
        help="Run on N hosts of the selection (inventory order) that pass the check; the others "
        "are spares that replace a host failing later (with --max-retries).",
    )  # fmt: skip
    allow_busy_gpus: bool = option(
        False, "--allow-busy-gpus",
        help="GPUs with another job's processes or memory in use are a warning, not a failure.",
    )  # fmt: skip
    probe_timeout: float = option(
        PROBE_TIMEOUT, "--probe-timeout", check=c.seconds(1, PROBE_TIMEOUT_MAX), show_default=True,
        help="Seconds each host's python has to answer the check (start, import the launcher, "
        "print its facts); raise it for loaded hosts (a busy Slurm allocation).",
    )  # fmt: skip

    def check_options(self, **job: Any) -> CheckOptions:
        """The preflight check of these hosts (a run's, a spare's, ``fleetctl check``'s): what
        these options let pass, and what is asked of a node (``job``: the other fields)."""
        from fleetctl.phases.check.preflight import CheckOptions

        return CheckOptions(
            allow_busy_gpus=self.allow_busy_gpus, probe_timeout=self.probe_timeout, **job
        )


@dataclass(frozen=True)
class Supervision(_Group):
    """How the job is watched and stopped."""

    TITLE = "Supervision"

    grace: float = option(
        5.0, "--grace", check=c.seconds(0), show_default=True,
        help="Seconds between SIGTERM and SIGKILL when the job is stopped.",
    )  # fmt: skip
    lost_timeout: float = option(
        5.0, "--lost-timeout", check=c.seconds(1, 60), show_default=True,
        help="A node silent this long (no heartbeat) is lost: the job is stopped everywhere.",
    )  # fmt: skip
    deadman: float = option(
        10.0, "--deadman", check=c.seconds(2, 10), show_default=True,
        help="Node side: no heartbeat from fleetctl this long and the node stops the job itself.",
    )  # fmt: skip
    timeout: float | None = option(
        None, "--timeout", check=c.seconds(1),
        help="Wall-clock limit from launch: then the job is stopped everywhere (exit 3).",
    )  # fmt: skip
    stall_timeout: float | None = option(
        None, "--stall-timeout", check=c.seconds(1),
        help="No output line or progress touch from any node this long once the job began: the "
        "job is stalled, its stacks dumped, and it is stopped (exit 3).",
    )  # fmt: skip
    startup_timeout: float | None = option(
        None, "--startup-timeout", check=c.seconds(1),
        help="No first output of a rank or progress touch on any node this long after the "
        "launch: stalled at start-up, stopped (exit 3). Default with --stall-timeout: the "
        "longer of 1800 s and it; else none.",
    )  # fmt: skip
    on_slow: OnSlow = option(
        "warn", "--on-slow", check=c.OneOf(ON_SLOW), show_default=True,
        help="A node the others wait for, named within a minute (docs/health.md): warn, stop "
        "the job (a retry with spares runs without it), or off (no watching).",
    )  # fmt: skip
    post_mortem: bool = option(
        True, "--no-post-mortem", param="no_post_mortem",
        help="After a stall, a lost node or a collective timeout, run no collective among the "
        "reachable hosts to prove the culprit (docs/health.md, The post-mortem's proof).",
    )  # fmt: skip
    post_mortem_timeout: float = option(
        30.0, "--post-mortem-timeout", check=c.seconds(1, 300), show_default=True,
        help="Seconds each step of the post-mortem may take at most: the fresh check of every "
        "host after a failure (done as soon as all answer) and the proof (neither changes the "
        "exit code).",
    )  # fmt: skip
    slow_rounds: int = option(
        AGREE, "--slow-rounds", check=c.count(1, WINDOW), show_default=True, metavar="N",
        help=f"Rounds of pace reports (one every ~2 s) of the last {WINDOW} that must name the "
        "same node, and no other, before it is named slow: fewer name it sooner, more only a "
        "node that stays slow.",
    )  # fmt: skip
    progress_regex: str | None = option(
        None, "--progress-regex", check=c.regex, metavar="REGEX",
        help="Jobs whose nodes progress independently: the regex whose group (n, or the first) "
        "is a rank's progress in its output lines, in place of the shapes recognised "
        "(docs/health.md, Nodes that progress independently).",
    )  # fmt: skip

    # what a detached job's monitor enforces and records in job.json (`fleetctl monitor`)
    MONITORED = ("grace", "timeout", "stall_timeout", "startup_timeout", "on_slow", "slow_rounds")
    LIMITS = ("timeout", "stall_timeout", "startup_timeout")

    def startup_limit(self) -> float | None:
        """Seconds from the launch to the job's first progress on any node before it is
        stalled at start-up: ``startup_timeout``; with only ``stall_timeout``, the longer of
        it and :data:`DEFAULT_STARTUP`; with neither, no limit."""
        if self.startup_timeout is not None:
            return self.startup_timeout
        return None if self.stall_timeout is None else max(DEFAULT_STARTUP, self.stall_timeout)

    def limited(self) -> bool:
        """A limit a detached job's monitor must enforce (``--timeout`` or a stall limit)."""
        return any(getattr(self, k) for k in self.LIMITS)

    def monitored(self) -> dict[str, Any]:
        """The values the job monitor enforces, by keyword (its options, job.json's keys)."""
        return {k: getattr(self, k) for k in self.MONITORED}


@dataclass(frozen=True)
class Retry(_Group):
    """Retries after a retryable failure, and what a retry carries over."""

    TITLE = "Retries"

    max_retries: int | None = option(
        None, "--max-retries", check=c.count(0, MAX_RETRIES),
        help="Run again after a retryable failure, up to N times (default 0; job file).",
    )  # fmt: skip
    retry_on: tuple[str, ...] = option(
        (), "--retry-on", check=c.TEXT, metavar="RULE",
        help="Also retry on: exit:N[,N] | signal:NAME | lost | node-stop | start-failed | "
        "log:REGEX | any. Repeatable.",
    )  # fmt: skip
    no_retry_on: tuple[str, ...] = option(
        (), "--no-retry-on", check=c.TEXT, metavar="RULE", help="Never retry on RULE (wins)."
    )
    retry_backoff: float | None = option(
        None, "--retry-backoff", check=c.seconds(0, MAX_BACKOFF),
        help="First wait between attempts in seconds (doubles, jittered, max 300).",
    )  # fmt: skip
    reboot_timeout: float = option(
        300.0, "--reboot-timeout", check=c.seconds(0, 3600), show_default=True,
        help="Before a retry, wait up to this long for a host the failed attempt lost (a "
        "reboot, a link back) to answer SSH again; 0: no wait.",
    )  # fmt: skip
    checkpoint_dir: str | None = option(
        None, "--checkpoint-dir", check=c.TEXT, metavar="DIR",
        help="With --max-retries or --resume: the folder whose files rank 0's node relays to "
        "every node of a retry or a resumed job (relative to the job's work folder, or absolute "
        "on the nodes; default: the work folder).",
    )  # fmt: skip
    elastic: bool = option(
        False, "--elastic",
        help="torchrun with --nodes N: an elastic rendezvous; a lost node is replaced by a "
        "spare while the other nodes' agents run on (docs/commands/run.md, Elastic jobs).",
    )  # fmt: skip
    min_nodes: int | None = option(
        None, "--min-nodes", check=c.count(1), metavar="N",
        help="With --elastic: when a node is lost and no spare is left, go on with the others "
        "if at least N remain (default: --nodes, end the job).",
    )  # fmt: skip
    resume: str | None = option(
        None, "--resume", check=c.TEXT, metavar="JOB|last",
        help="Continue an earlier job: its rank 0's checkpoint files (its work folder, or "
        "--checkpoint-dir) are copied to every node's work folder before launch, as a retry's "
        "are.",
    )  # fmt: skip

    def policy(self, file: RetrySpec | None = None) -> RetryPolicy:
        """The attempt loop's policy: these rules first, then a role job file's ``retry:``
        block's (``file``), whose values fill the fields unset here by name (its keys'
        mapping: ``plan.retryrules.RETRY_KEYS``); UsageError names a bad rule and where."""
        from fleetctl.job.run.retry import RetryPolicy
        from fleetctl.plan.retryrules import RetrySpec

        file = file or RetrySpec()
        own, where = self.filled(file), file.where or "job file"
        return RetryPolicy.build(
            max_retries=own.max_retries or 0,
            retry_on=[(r, "--retry-on") for r in self.retry_on]
            + [(r, where) for r in file.retry_on],
            no_retry_on=[(r, "--no-retry-on") for r in self.no_retry_on]
            + [(r, where) for r in file.no_retry_on],
            backoff=own.retry_backoff,
            backoff_max=file.retry_backoff_max,
        )

    def checkpoint_folder(self) -> str | None:
        """The folder a retry or ``--resume`` relays, as the nodes name it (normalized;
        None: the job's work folder); UsageError (exit 2) for one that is not a folder."""
        from fleetctl.phases.push.relay import checkpoint_dir_arg

        return checkpoint_dir_arg(self.checkpoint_dir)

    def members(self, wanted: int, pool: int) -> str:
        """``--elastic --nodes N`` on ``pool`` hosts: the rendezvous's ``MIN:MAX`` nodes. A
        round needs ``--min-nodes`` (default N) nodes, and a full round has room for a spare
        (torch puts a node that finds the round full on a redundancy list that never trains);
        UsageError when a lost node could neither be replaced nor left out."""
        if pool <= wanted and self.min_nodes is None:
            raise UsageError(
                f"--elastic --nodes {wanted}: the selection has no spare host ({pool} host(s)) "
                "and there is no --min-nodes: a lost node would end the job as without --elastic"
            )
        low = wanted if self.min_nodes is None else self.min_nodes
        return f"{low}:{max(wanted, pool)}"


@dataclass(frozen=True)
class Collection(_Group):
    """What the run leaves in its run folder: the logs collection brings home
    (``--collect-max``, ``--collect-exclude``: its sub-options, shared with ``fleetctl
    collect``) and the report written at its end."""

    TITLE = "Collection"

    collect: CollectOptions | None = option(
        None, sub.COLLECT[0].flag, param="collect_max", check=sub.collect_options,
        record=sub.collect_cls, subs=sub.COLLECT,
    )  # fmt: skip
    report: bool = option(
        True, "--no-report", param="no_report",
        help="Write no report.html into the run folder when the run ends (`fleetctl report "
        "JOB` makes one later); see docs/report.md.",
    )  # fmt: skip


@dataclass(frozen=True)
class Collective(_Group):
    """The collective benchmark in the check (``--collective`` and its knobs: its
    sub-options, shared with ``fleetctl check``)."""

    TITLE = "Collective benchmark"

    collective: CollectiveOptions | None = option(
        None, sub.COLLECTIVE[0].flag, check=sub.collective_options, record=sub.collective_cls,
        subs=sub.COLLECTIVE,
    )  # fmt: skip


@dataclass(frozen=True)
class Container(_Group):
    """Each node's launcher in a container."""

    TITLE = "Containers"

    image: str | None = option(
        None, "--image", check=c.image, metavar="IMAGE",
        help="Run each node's launcher in one container of IMAGE (over the inventory's "
        "fleetctl_image); see docs/containers.md.",
    )  # fmt: skip
    container_runtime: str | None = option(
        None, "--container-runtime", check=c.runtime, metavar="podman|docker|apptainer",
        help="The runtime for --image (default: the first found on the node).",
    )  # fmt: skip
    runtime_timeout: float = option(
        30.0, "--runtime-timeout", check=c.seconds(1, 600), show_default=True,
        help="Seconds each container runtime call at a node's teardown (ps, stop, rm) has: a "
        "runtime that does not answer is cut and named, the container reported as maybe left.",
    )  # fmt: skip

    def runtime_for(self, node: Node) -> str | None:
        """``node``'s runtime: this one, else its ``fleetctl_container_runtime`` (None: any)."""
        rt = self.container_runtime or node.vars.get("fleetctl_container_runtime")
        return None if rt is None else str(rt)


@dataclass(frozen=True)
class Monitor(_Group):
    """Detached jobs and the monitor that watches them."""

    TITLE = "Detach and monitor"

    detach: bool = option(
        False, "--detach",
        help="Start the job and return its id; it runs on under the node supervisors "
        "(no dead-man switch). Then: logs -f, status, stop, collect.",
    )  # fmt: skip
    monitor: bool = option(
        True, "--no-monitor", param="no_monitor",
        help="With --detach: start no job monitor (nobody tears the job down on a "
        "failure or brings its logs home; `fleetctl monitor JOB` attaches one later).",
    )  # fmt: skip
    monitor_lost_timeout: float | None = option(
        None, "--monitor-lost-timeout", check=c.seconds(1),
        help="With --detach: a node unreachable this long is lost and the job is "
        "stopped (default 60 s).",
    )  # fmt: skip


@dataclass(frozen=True)
class Observe(_Group):
    """What the run tells the outside while it lasts and when it ends: Prometheus metrics
    (docs/metrics.md) and local hook commands."""

    TITLE = "Metrics and hooks"

    metrics_addr: str | None = option(
        None, "--metrics-addr", check=c.host_port, metavar="HOST:PORT",
        help="Serve Prometheus metrics at http://HOST:PORT/metrics while the run lasts (the "
        "job monitor's, with --detach); only that address is bound.",
    )  # fmt: skip
    metrics_textfile: str | None = option(
        None, "--metrics-textfile", check=c.TEXT, metavar="PATH",
        help="Write the same metrics to PATH (atomically, every few seconds and at the end), "
        "for node_exporter's textfile collector.",
    )  # fmt: skip
    on_failure: str | None = option(
        None, "--on-failure", check=c.TEXT, metavar="CMD",
        help="A local shell command run once the job failed (FLEETCTL_JOB_ID, FLEETCTL_STATUS, "
        "FLEETCTL_CULPRIT_HOST, FLEETCTL_RUN_DIR, … in its env); its output in the run folder.",
    )  # fmt: skip
    on_end: str | None = option(
        None, "--on-end", check=c.TEXT, metavar="CMD",
        help="A local shell command run once the job ended, however it ended (as --on-failure).",
    )  # fmt: skip
    hook_timeout: float = option(
        60.0, "--hook-timeout", check=c.seconds(1, 3600), show_default=True,
        help="Seconds a hook may run before it (and all it started) is killed; a hook never "
        "changes the run's exit status.",
    )  # fmt: skip

    def asked(self) -> bool:
        """Metrics or a hook asked for (a hook's time limit alone asks for nothing)."""
        return any(getattr(self, f.name) for f in fields(self) if f.default is None)


@dataclass(frozen=True)
class Slurm(_Group):
    """``run --slurm``: what is asked of Slurm. Every value may reach an ``#SBATCH`` line."""

    TITLE = "Slurm"

    partition: str | None = option(
        None, "--partition", check=c.TEXT, metavar="P", help="--slurm: the partition."
    )
    gres: str | None = option(
        None, "--gres", check=c.TEXT, metavar="gpu:K|shard:K", help="--slurm: per-node GRES."
    )
    time: str | None = option(
        None, "--time", param="slurm_time", check=c.TEXT, metavar="T",
        help="--slurm: the job's time limit (Slurm's format: 30, 1:00:00, 1-00:00:00).",
    )  # fmt: skip
    account: str | None = option(
        None, "--account", check=c.TEXT, metavar="A", help="--slurm: the account."
    )
    sbatch_args: tuple[str, ...] = option(
        (), "--sbatch-arg", check=c.TEXT, metavar="ARG",
        help="--slurm: one more #SBATCH line, verbatim (--sbatch-arg=--qos=high). Repeatable.",
    )  # fmt: skip
    queue_timeout: float | None = option(
        None, "--queue-timeout", check=c.seconds(1),
        help="--slurm: not started this long → scancel, exit 5 (default: wait).",
    )  # fmt: skip


GROUPS: dict[str, type[_Group]] = {
    "program": Program,
    "hosts": Hosts,
    "supervision": Supervision,
    "retry": Retry,
    "collection": Collection,
    "collective": Collective,
    "container": Container,
    "monitor": Monitor,
    "observe": Observe,
    "slurm": Slurm,
}


def _keywords() -> dict[str, tuple[str, str]]:
    """Library keyword → (group, field): the flat names ``Fleet.run`` and ``build`` take."""
    out: dict[str, tuple[str, str]] = {}
    for group, cls in GROUPS.items():
        for f in fields(cls):  # type: ignore[arg-type]
            kw = keyword(f)
            assert kw not in out, f"two fields take the keyword {kw!r}"
            out[kw] = (group, f.name)
    return out


@dataclass(frozen=True)
class RunSpec:
    """A whole run request, checked: making one with a bad value raises ``UsageError`` (one
    line, exit 2), the message the command prints for the same value. Build one from flat
    keywords with :meth:`build`; read it by group (``spec.supervision.timeout``)."""

    program: Program = field(default_factory=Program)
    hosts: Hosts = field(default_factory=Hosts)
    supervision: Supervision = field(default_factory=Supervision)
    retry: Retry = field(default_factory=Retry)
    collection: Collection = field(default_factory=Collection)
    collective: Collective = field(default_factory=Collective)
    container: Container = field(default_factory=Container)
    monitor: Monitor = field(default_factory=Monitor)
    observe: Observe = field(default_factory=Observe)
    slurm: Slurm = field(default_factory=Slurm)

    def __post_init__(self) -> None:
        from fleetctl.api.runspec_rules import check

        check(self)  # what one group cannot see: the rules across groups

    @classmethod
    def build(cls, script: str | None = None, *args: str, **kw: Any) -> RunSpec:
        """The record of ``Fleet.run(script, *args, **kw)``'s keywords (``timeout=``,
        ``max_retries=``, …: see :data:`KEYWORDS`); an unknown keyword is a TypeError."""
        return cls().replace(script=script, args=tuple(args), **kw)

    def replace(self, **kw: Any) -> RunSpec:
        """A copy with these flat keywords changed (checked again)."""
        table = KEYWORDS
        by_group: dict[str, dict[str, Any]] = {}
        for k, v in kw.items():
            if k not in table:
                raise TypeError(f"RunSpec got an unexpected keyword argument {k!r}")
            group, name = table[k]
            by_group.setdefault(group, {})[name] = v
        groups = {g: replace(getattr(self, g), **changes) for g, changes in by_group.items()}
        return replace(self, **groups)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON data, every group's every field (``run --slurm``'s run-spec.json);
        UsageError for a value only a library call can hold (a ``before`` callable)."""
        from fleetctl.api.runspec_json import to_dict

        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Any) -> RunSpec:
        """The record of :meth:`to_dict`'s data, checked (UsageError: the command's line)."""
        from fleetctl.api.runspec_json import from_dict

        return from_dict(data)

    def job_spec(self, **resolved: Any) -> JobSpec:
        """The rank plan's request, its container group whole (``resolved``: what only the run
        knows: job id, script, folder, …); UsageError for a ``--launcher-arg`` the plan refuses."""
        from fleetctl.errors import PlanError
        from fleetctl.plan.launchers import get_launcher
        from fleetctl.plan.rankplan import DEFAULT_MASTER_PORT, JobSpec, check_launcher_args

        p = self.program
        try:
            check_launcher_args(get_launcher(p.launcher), p.launcher_args)
        except PlanError as e:
            raise UsageError(str(e)) from e
        return JobSpec(
            launcher=p.launcher,
            procs=p.nproc_per_node,
            rdzv_port=p.master_port or DEFAULT_MASTER_PORT,
            rdzv_port_fixed=p.master_port is not None,  # that port, or a clear refusal
            launcher_args=p.launcher_args,
            env=dict(p.env or {}),
            backend=p.backend,
            container=self.container,
            **resolved,
        )

    def flat(self) -> dict[str, Any]:
        """The record as ``build``'s keywords (``script`` and ``args`` included)."""
        return {kw: getattr(getattr(self, group), name) for kw, (group, name) in KEYWORDS.items()}


KEYWORDS: dict[str, tuple[str, str]] = _keywords()


def field_of(kw: str) -> Any:
    """The ``dataclasses.Field`` behind library keyword ``kw`` (its option's metadata)."""
    group, name = KEYWORDS[kw]
    return next(f for f in fields(GROUPS[group]) if f.name == name)  # type: ignore[arg-type]
