"""A checked ``RunSpec`` → the job core's request (or, for a dry run, the plan): what needs
the fleet is checked here, in the command's order, so a bad argument is refused before any
host is reached, by the library as by the command (the values alone: ``RunSpec`` itself)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from fleetctl.api.runspec import BeforeHook, RunSpec
from fleetctl.api.runspec_rules import role_file
from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from pathlib import Path

    from fleetctl.job.run.submit import JobRequest
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import Plan
    from fleetctl.transport.connection import SSHSettings


@dataclass(frozen=True)
class Prepared:
    """A run ready to go: the request, its before-launch hook, and for a dry run the plan."""

    request: JobRequest | None
    before: BeforeHook | None
    plan: Plan | None = None


def prepare(
    spec: RunSpec,
    *,
    nodes: Sequence[Node],
    groups: Mapping[str, Sequence[str]],
    settings: SSHSettings,
    runs_dir: str | Path,
    inventory: str | None,
    limit: str | None,
    dry_run: bool = False,
) -> Prepared:
    """Build the job's request from a checked record (``RunSpec`` refused its bad values when
    it was made): what needs the fleet (the script on disk, the role job, ``--nodes`` against
    the selection) is checked here, before any host is reached (UsageError, PlanError, …)."""
    from fleetctl.job.run.job import RunOptions
    from fleetctl.job.run.submit import JobRequest

    p, sup, rt = spec.program, spec.supervision, spec.retry
    script, args = p.script, p.args
    role_path = role_file(p)  # its clashes with SCRIPT and --launcher-arg: RunSpec refused them
    code_dir = p.code
    kind, folder, script_args = None, "", tuple(args)
    if role_path is None:
        assert script is not None  # role_file: one of them
        from fleetctl.plan.script_arg import resolve

        # SCRIPT or -m MODULE: what it is, the job's folder in the code (the script's own)
        prog = resolve(script, script_args, code_dir, p.launcher)
        script, kind, folder, script_args = prog.script, prog.kind, prog.folder, prog.args
        code_dir = prog.code_dir
    # refused before any host is reached; None: the work folder (the relay is not imported)
    relayed = None if rt.checkpoint_dir is None else rt.checkpoint_folder()
    relay = None
    if rt.resume is not None:  # the earlier job's run folder, read here (no host reached)
        from fleetctl.job.run.resume import resolve as resolve_resume

        relay = resolve_resume(rt.resume, runs_dir, nodes, relayed)
    before = _before_hook(p.before, inventory)
    wanted = spec.hosts.nodes
    if wanted is not None and wanted > len(nodes):
        raise UsageError(f"--nodes {wanted}: the selection has only {len(nodes)} host(s)")
    elastic = _elastic(spec, wanted, nodes)
    now = datetime.now(timezone.utc)
    job = spec.job_spec(
        script=script or "",
        job_id=_adopted_job_id() or new_job_id(now),
        args=script_args,
        created=now.isoformat(timespec="seconds"),
        kind=kind,
        folder=folder,
        elastic=elastic,
    )
    watched = spec.collective
    planner = None
    job_retry = None
    run_nodes: Sequence[Node] = nodes
    if role_path is not None:  # role job (fleetctl.plan.roles): the job file replaces SCRIPT
        from fleetctl.job.run.rolejob import load_role_job

        role_job = load_role_job(
            role_path,
            p,
            tuple(nodes),
            {g: tuple(m) for g, m in groups.items()},
            job,
            code_dir=code_dir,
            detach=spec.monitor.detach,
        )
        job, code_dir, planner = role_job.spec, role_job.code_dir, role_job.planner
        job_retry = planner.job.retry
        # the job file's limits and collective where the command line gave none
        sup, watched = sup.filled(planner.job), watched.filled(planner.job)
        run_nodes = planner.nodes
    # what the real run would refuse, a dry run refuses too
    retry_policy = rt.policy(job_retry)
    if code_dir is not None:  # `--code /` walked the whole disk before anything was said
        from fleetctl.phases.codesync import check_code_folder

        check_code_folder(code_dir)
    if dry_run:
        if planner is not None:
            return Prepared(None, before, planner.dry_plan(job))
        from fleetctl.plan.rankplan import make_plan

        return Prepared(None, before, make_plan(tuple(nodes), job))
    assert code_dir is not None  # resolve() or the role job settled it
    options = RunOptions(
        runs_dir=runs_dir,
        hosts=spec.hosts,
        supervision=sup,
        push=p.push_request(os.path.abspath(code_dir)),
        settings=settings,
        detach=spec.monitor.detach,
        planner=planner,
        inventory=inventory,
        limit=limit,
        collect=spec.collection.collect,
        elastic=elastic is not None,
        retry=rt,
        relay=relay,
        before_launch=before,
        collective=watched.collective,
    )
    from fleetctl.report import write_report  # above the job core, which only calls it

    request = JobRequest(
        job,
        run_nodes,
        options,
        retry=retry_policy,
        monitor=spec.monitor,
        report=write_report if spec.collection.report else None,
        observe=spec.observe,
    )
    return Prepared(request, before)


def new_job_id(now: datetime | None = None) -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>`` in UTC: sorts by start time, random suffix avoids clashes."""
    import secrets

    from fleetctl.plan.names import format_job_id

    return format_job_id(now or datetime.now(timezone.utc), secrets.token_hex(3))


def _adopted_job_id() -> str | None:
    """Inside the batch job ``run --slurm`` submitted: its job id (and run folder)."""
    from fleetctl.slurm.allocation import job_id

    if not job_id(os.environ):  # outside an allocation: the batch module is not loaded
        return None
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


def _elastic(spec: RunSpec, wanted: int | None, nodes: Sequence[Node]) -> str | None:
    """``run --elastic``: the node range of the elastic rendezvous (``Retry.members``), or
    None (RunSpec refused what it cannot do; here what needs the selection)."""
    rt = spec.retry
    if not rt.elastic or wanted is None:
        return None
    from fleetctl.transport.connection import transport

    if not all(transport(n).can_join_elastic for n in nodes):
        raise UsageError("--elastic: not inside a Slurm allocation yet (SSH nodes only)")
    return rt.members(wanted, len(nodes))
