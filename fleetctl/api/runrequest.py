"""``Fleet.run``'s arguments → the job core's request (or, for a dry run, the plan): what
``fleetctl run`` checks, in its order, so a bad argument is refused before any host is
reached, by the library as by the command."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from fleetctl.job.submit import JobRequest
    from fleetctl.node import Node
    from fleetctl.phases.collect import CollectOptions
    from fleetctl.phases.collective_judge import CollectiveOptions
    from fleetctl.plan.rankplan import Plan
    from fleetctl.ssh.connection import SSHSettings

BeforeHook = Callable[[Sequence["Node"], "SSHSettings | None"], None]


@dataclass(frozen=True)
class RunArgs:
    """Everything ``Fleet.run`` takes beyond the script and its arguments (see its doc)."""

    launcher: str = "torchrun"
    nproc_per_node: int | str = "auto"
    env: Mapping[str, str] | None = None
    stall_timeout: float | None = None
    startup_timeout: float | None = None
    timeout: float | None = None
    detach: bool = False
    code: str | os.PathLike[str] | None = None
    env_archive: str | os.PathLike[str] | None = None
    check: bool = True
    master_port: int | None = None
    launcher_args: Sequence[str] = ()
    backend: str | None = None
    grace: float = 5.0
    lost_timeout: float = 5.0
    deadman: float = 10.0
    max_retries: int | None = None
    retry_on: Sequence[str] = ()
    no_retry_on: Sequence[str] = ()
    retry_backoff: float | None = None
    allow_secrets: Sequence[str] = ()
    allow_busy_gpus: bool = False
    before: str | BeforeHook | None = None
    job_file: str | os.PathLike[str] | None = None
    env_style: str | None = None
    nodes: int | None = None
    checkpoint_dir: str | None = None
    resume: str | None = None
    image: str | None = None
    container_runtime: str | None = None
    collective: CollectiveOptions | None = None
    collect: CollectOptions | None = None
    monitor: bool = True
    monitor_lost_timeout: float | None = None
    probe_timeout: float = 30.0


@dataclass(frozen=True)
class Prepared:
    """A run ready to go: the request, its before-launch hook, and for a dry run the plan."""

    request: JobRequest | None
    before: BeforeHook | None
    plan: Plan | None = None


def prepare(
    script: str | None,
    args: Sequence[str],
    a: RunArgs,
    *,
    nodes: Sequence[Node],
    groups: Mapping[str, Sequence[str]],
    settings: SSHSettings,
    runs_dir: str | os.PathLike[str],
    inventory: str | None,
    limit: str | None,
    dry_run: bool = False,
) -> Prepared:
    """Check the arguments as ``fleetctl run`` does and build the job's request (UsageError,
    PlanError, … before any host is reached)."""
    from fleetctl.job.run import RunOptions
    from fleetctl.job.submit import JobRequest, RetryRequest
    from fleetctl.plan.launchers import LAUNCHER_NAMES
    from fleetctl.plan.rankplan import DEFAULT_MASTER_PORT, ENV_KEY_RE, JobSpec

    if a.launcher not in LAUNCHER_NAMES:
        raise UsageError(f"launcher {a.launcher!r}: one of {', '.join(LAUNCHER_NAMES)}")
    nproc = a.nproc_per_node
    if nproc != "auto" and not (
        isinstance(nproc, int) and not isinstance(nproc, bool) and nproc > 0
    ):
        raise UsageError(f"nproc_per_node {nproc!r}: a positive integer or 'auto'")
    from fleetctl.api.fleet import probe_timeout_arg

    probe_timeout = probe_timeout_arg(a.probe_timeout)
    if a.container_runtime is not None:
        from fleetctl.plan.runtimes import runtime

        runtime(a.container_runtime)  # a usage error before anything is read
    env = dict(a.env or {})
    bad = [k for k in env if not ENV_KEY_RE.match(k)]
    if bad:
        raise UsageError(f"env: {bad[0]!r} is not a valid variable name")
    retry = RetryRequest(
        max_retries=a.max_retries,
        retry_on=tuple(a.retry_on),
        no_retry_on=tuple(a.no_retry_on),
        backoff=a.retry_backoff,
    )
    job_file = None if a.job_file is None else os.fspath(a.job_file)
    if a.env_style is not None and job_file is None:
        raise UsageError("--env-style names role env variables: it needs a role job (--job FILE)")
    if job_file is not None and a.launcher_args:
        raise UsageError(
            "--launcher-arg applies to SCRIPT's launcher; a role job (--job) sets "
            "each role's command in the job file"
        )
    if job_file is not None and script is not None:
        raise UsageError(f"--job {job_file} replaces SCRIPT; got {script!r} too")
    code_dir = None if a.code is None else os.fspath(a.code)
    kind, folder, script_args = None, "", tuple(args)
    if job_file is None:
        if script is None:
            raise UsageError("missing SCRIPT (or --job FILE)")
        from fleetctl.plan.script_arg import resolve

        # SCRIPT or -m MODULE: what it is, the job's folder in the code (the script's own)
        prog = resolve(script, script_args, code_dir, a.launcher, tuple(a.launcher_args))
        script, kind, folder, script_args = prog.script, prog.kind, prog.folder, prog.args
        code_dir = prog.code_dir
    from fleetctl.phases.checkpoints import checkpoint_dir_arg

    checkpoint_dir = checkpoint_dir_arg(a.checkpoint_dir)
    relay = None
    if a.resume is not None:  # the earlier job's run folder, read here (no host reached)
        from fleetctl.job.resume import resolve

        relay = resolve(a.resume, runs_dir, nodes, checkpoint_dir)
    before = _before_hook(a.before, inventory)
    if a.nodes is not None and a.nodes > len(nodes):
        raise UsageError(f"--nodes {a.nodes}: the selection has only {len(nodes)} host(s)")
    now = datetime.now(timezone.utc)
    spec = JobSpec(
        script=script or "",
        job_id=_adopted_job_id() or new_job_id(now),
        args=script_args,
        launcher=a.launcher,
        nproc_per_node=nproc,
        master_port=a.master_port or DEFAULT_MASTER_PORT,
        master_port_fixed=a.master_port is not None,
        launcher_args=tuple(a.launcher_args),
        env=env,
        backend=a.backend,
        created=now.isoformat(timespec="seconds"),
        kind=kind,
        folder=folder,
        image=a.image,
        container_runtime=a.container_runtime,
    )
    timeout, stall_timeout, collective = a.timeout, a.stall_timeout, a.collective
    planner = None
    job_retry = None
    run_nodes: Sequence[Node] = nodes
    if job_file is not None:  # role job (fleetctl.plan.roles): the job file replaces SCRIPT
        from fleetctl.job.rolejob import load_role_job

        role_job = load_role_job(
            job_file,
            tuple(nodes),
            {g: tuple(m) for g, m in groups.items()},
            spec,
            code_dir=code_dir,
            env_style=a.env_style,
            detach=a.detach,
        )
        spec, code_dir, planner = role_job.spec, role_job.code_dir, role_job.planner
        job_retry = planner.job.retry
        timeout = timeout if timeout is not None else planner.job.timeout
        stall_timeout = stall_timeout if stall_timeout is not None else planner.job.stall_timeout
        collective = collective or planner.job.collective  # the job file's key
        run_nodes = planner.nodes
    # what the real run would refuse, a dry run refuses too
    retry_policy = retry.policy(job_retry)
    if code_dir is not None:  # `--code /` walked the whole disk before anything was said
        from fleetctl.phases.codesync import check_code_folder

        check_code_folder(code_dir)
    if dry_run:
        if planner is not None:
            return Prepared(None, before, planner.dry_plan(spec))
        from fleetctl.plan.rankplan import make_plan

        return Prepared(None, before, make_plan(tuple(nodes), spec))
    assert code_dir is not None  # resolve() or the role job settled it
    options = RunOptions(
        runs_dir=runs_dir,
        check=a.check,
        grace=a.grace,
        lost_timeout=a.lost_timeout,
        deadman=a.deadman,
        timeout=timeout,
        stall_timeout=stall_timeout,
        startup_timeout=a.startup_timeout,
        code=os.path.abspath(code_dir),
        env_archive=None if a.env_archive is None else os.fspath(a.env_archive),
        settings=settings,
        detach=a.detach,
        planner=planner,
        inventory=inventory,
        limit=limit,
        allow_secrets=tuple(a.allow_secrets),
        allow_busy_gpus=a.allow_busy_gpus,
        collect=a.collect,
        nodes_wanted=a.nodes,
        checkpoint_dir=checkpoint_dir,
        relay=relay,
        probe_timeout=probe_timeout,
        before_launch=before,
        collective=collective,
    )
    request = JobRequest(
        spec,
        run_nodes,
        options,
        retry=retry_policy,
        monitor=a.monitor,
        monitor_lost_timeout=a.monitor_lost_timeout,
    )
    return Prepared(request, before)


def new_job_id(now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>`` in UTC: sorts by start time, random suffix avoids clashes."""
    import secrets

    from fleetctl.plan.rankplan import format_job_id

    return format_job_id(now or datetime.now(timezone.utc), secrets.token_hex(3))


def _adopted_job_id() -> str | None:
    """Inside the batch job ``run --slurm`` submitted: its job id (and run folder)."""
    from fleetctl.slurm.batch import adopted_job_id

    return adopted_job_id(os.environ)


def _before_hook(before: str | BeforeHook | None, inventory: str | None) -> BeforeHook | None:
    """A callable as it is; ``"fabfile.py:task"`` loaded now, so a bad one fails before the
    check (and only over SSH: it needs an inventory)."""
    if before is None or callable(before):
        return before
    if inventory is None:
        raise UsageError("--before runs a Fabric task over SSH: it needs an inventory (-i)")
    from fleetctl.api.before import load_task

    return load_task(before)
