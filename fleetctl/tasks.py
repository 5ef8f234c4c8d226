"""fleetctl as invoke tasks: ``check``, ``push``, ``run``, ``runs``, ``stop`` over the library
API (``fleetctl.api``), for a team's own ``tasks.py`` or fabfile::

    from invoke import Collection
    import fleetctl.tasks

    ns = Collection(...)                       # the team's own tasks
    ns.add_collection(fleetctl.tasks)          # inv fleetctl.check -i hosts.yml, fleetctl.run …

Defaults come from invoke's configuration under ``fleetctl`` (``invoke.yaml``:
``fleetctl: {inventory: hosts.yml, runs_dir: fleet-runs}``), so a project names its fleet
once. Like ``fleetctl/cli``, this is a terminal surface: it prints, and a failure is an
``invoke.Exit`` with the CLI's exit code (2 usage, 3 a host or the job failed, 130
interrupted) and its one-line message.
"""

from __future__ import annotations

import dataclasses
import functools
import shlex
from collections.abc import Callable
from typing import Any, TypeVar

from invoke import Collection, Context, Exit, task

from fleetctl.errors import FleetctlError

F = TypeVar("F", bound=Callable[..., Any])

_FLEET_HELP = {
    "inventory": "Ansible inventory (default: config fleetctl.inventory, else this machine)",
    "limit": "Ansible host pattern selecting hosts of the inventory",
}


def _errors_exit(fn: F) -> F:
    """A FleetctlError becomes invoke's Exit: its one line, the CLI's exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except FleetctlError as e:
            raise Exit(f"fleetctl: error: {e.one_line()}", code=e.exit_code) from e

    return wrapper  # type: ignore[return-value]


def _setting(c: Context, name: str, given: Any) -> Any:
    if given not in (None, ""):
        return given
    section = c.config.get("fleetctl") or {}
    return section.get(name)


def _fleet(c: Context, inventory: str | None, limit: str | None) -> Any:
    from fleetctl.api import Fleet

    inventory = _setting(c, "inventory", inventory)
    runs_dir = _setting(c, "runs_dir", None) or "fleet-runs"
    if inventory is None:
        if limit:
            raise Exit("fleetctl: error: --limit needs an inventory (-i FILE)", code=2)
        return Fleet.local(runs_dir=runs_dir)
    return Fleet.from_inventory(inventory, limit=limit, runs_dir=runs_dir)


@task(help={**_FLEET_HELP, "recheck": "ignore a cached passing check"})
@_errors_exit
def check(c: Context, inventory: str = "", limit: str = "", recheck: bool = False) -> None:
    """fleetctl check: every host's SSH, network, GPUs, ports, disk and tools."""
    report = _fleet(c, inventory, limit).check(recheck=recheck)
    for name, host in report.hosts.items():
        bad = host.failed
        print(f"{name}: " + ("ok" if not bad else "FAILED " + ", ".join(bad)))
    for host, what, why in report.failures:
        print(f"  {host}: {what}: {why}")
    if not report.ok:
        raise Exit(f"fleetctl: check failed: {report.summary()}", code=3)
    print(f"fleetctl: {report.summary()}")


@task(help={**_FLEET_HELP, "code": "folder to ship (default .)", "env": "conda-pack archive"})
@_errors_exit
def push(c: Context, inventory: str = "", limit: str = "", code: str = ".", env: str = "") -> None:
    """fleetctl push: the code snapshot (and an env archive) to every host, verified."""
    report = _fleet(c, inventory, limit).push(code, env or None)
    print(f"fleetctl: pushed to {len(report.nodes)} host(s)")


# The run task's options that are the run record's, by flag: invoke makes a task's flags of its
# parameters' names, so the parameter, its name (``Fleet.run``'s keyword) and default are the
# record field's (``_with_run_options``); the help is the task's own, shorter than the command's.
_RUN_OPTIONS = {
    "--launcher": "torchrun, plain, paddle, deepspeed",
    "--nproc-per-node": "processes per node, or auto",
}


def _with_run_options(fn: F) -> F:
    """``fn(c, script, args, inventory, limit, detach, env_var, **options)`` with a signature
    whose keywords after ``limit`` are :data:`_RUN_OPTIONS`' fields (their keyword, their
    default as a string: the record parses it, as it does the command's), for invoke."""
    import inspect

    from fleetctl.api.runspec import GROUPS
    from fleetctl.api.runspec_fields import keyword

    by_flag = {
        flag: f
        for cls in GROUPS.values()
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        for flag in f.metadata.get("flags") or ()
    }
    params = list(inspect.signature(fn).parameters.values())
    kept = [p for p in params if p.kind is not p.VAR_KEYWORD]
    at = [p.name for p in kept].index("limit") + 1
    options = [
        inspect.Parameter(
            keyword(f), inspect.Parameter.POSITIONAL_OR_KEYWORD, default=str(f.default)
        )
        for f in (by_flag[flag] for flag in _RUN_OPTIONS)
    ]
    fn.__signature__ = inspect.Signature([*kept[:at], *options, *kept[at:]])  # type: ignore[attr-defined]
    return fn


@task(
    help={
        **_FLEET_HELP,
        "script": "the script to run (a path, as `fleetctl run SCRIPT`)",
        "args": "the script's arguments, one string split like a shell",
        **{flag.lstrip("-"): why for flag, why in _RUN_OPTIONS.items()},
        "detach": "start the job and return its id",
        "env-var": "NAME=VALUE for every node (repeatable)",
    },
    iterable=["env_var"],
)
@_errors_exit
@_with_run_options
def run(
    c: Context,
    script: str,
    args: str = "",
    inventory: str = "",
    limit: str = "",
    detach: bool = False,
    env_var: list[str] | None = None,
    **options: str,
) -> None:
    """fleetctl run: the job on every host, its lines live; exits with the job's verdict."""
    env = {}
    for item in env_var or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise Exit(f"fleetctl: error: --env-var {item!r} is not NAME=VALUE", code=2)
        env[key] = value
    fleet = _fleet(c, inventory, limit)
    job = fleet.run(script, *shlex.split(args), env=env, detach=detach, **options)
    if detach:
        print(job.job_id)
        return
    for line in job.lines():
        print(line, flush=True)
    result = job.wait()
    print(f"fleetctl: job {result.job_id} {result.status} ({result.run_folder})")
    if not result.ok:
        raise Exit(f"fleetctl: job {result.job_id}: {result.reason}", code=result.exit_code)


@task(help={"runs-dir": "where run folders are (default: config fleetctl.runs_dir)"})
@_errors_exit
def runs(c: Context, runs_dir: str = "") -> None:
    """fleetctl runs: the jobs of the run folders, oldest first."""
    from fleetctl.api import runs as list_runs

    for r in list_runs(_setting(c, "runs_dir", runs_dir) or "fleet-runs"):
        print(f"{r.job_id}  {r.status}  {r.nodes} node(s)  {r.first_failure or '-'}")


@task(help={"job": "job id (a unique prefix)", "grace": "seconds from SIGTERM to SIGKILL"})
@_errors_exit
def stop(c: Context, job: str, runs_dir: str = "", grace: float = 5.0) -> None:
    """fleetctl stop: the job ended on every node, verified, its logs collected."""
    from fleetctl.api import Job

    handle = Job.attach(job, _setting(c, "runs_dir", runs_dir) or "fleet-runs")
    handle.stop(grace=float(grace))
    print(f"fleetctl: job {handle.job_id} stopped")


ns = Collection("fleetctl", check, push, run, runs, stop)
