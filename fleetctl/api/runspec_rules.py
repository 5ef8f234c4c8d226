"""The rules of a run request across its groups (``RunSpec``'s own fields are checked by
their group): one line each (``UsageError``, exit 2), before any host is reached, for the
library and the command alike; and what a run runs (:func:`role_file`), which its preparers
(``api/runrequest``, ``run --slurm``'s ``api/slurm``) ask once the record is whole."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from fleetctl.api.runspec import Program, RunSpec


def check(spec: RunSpec) -> None:
    """Refuses what the groups allow one by one but not together."""
    p = spec.program
    if p.env_style is not None and p.job_file is None:
        raise UsageError("--env-style names role env variables: it needs a role job (--job FILE)")
    if p.job_file is not None and p.launcher_args:
        raise UsageError(
            "--launcher-arg applies to SCRIPT's launcher; a role job (--job) sets "
            "each role's command in the job file"
        )
    if p.job_file is not None and p.script is not None:
        raise UsageError(f"--job {p.job_file} replaces SCRIPT; got {p.script!r} too")
    _check_elastic(spec)


def role_file(p: Program) -> str | None:
    """The role job file the run runs instead of SCRIPT (``--job``), else None: SCRIPT, which
    is then needed (``missing SCRIPT (or --job FILE)``: a record may lack both until run)."""
    if p.job_file is None and p.script is None:
        raise UsageError("missing SCRIPT (or --job FILE)")
    return p.job_file


def _check_elastic(spec: RunSpec) -> None:
    """What ``--elastic`` cannot do (yet), and ``--min-nodes`` only with it, at most
    ``--nodes``: one line each (exit 2), before any host is reached."""
    p, rt, wanted = spec.program, spec.retry, spec.hosts.nodes
    if rt.min_nodes is not None and not rt.elastic:
        raise UsageError(
            f"--min-nodes {rt.min_nodes} needs --elastic (a job without it ends when a node "
            "is lost)"
        )
    if not rt.elastic:
        return
    from fleetctl.plan.launchers import launcher_for

    if p.job_file is not None:
        raise UsageError("--elastic: not with a role job (--job): one torchrun world only")
    if not launcher_for(p.launcher).elastic:
        raise UsageError(
            f"--elastic: launcher {p.launcher} has no elastic rendezvous (torchrun only)"
        )
    if spec.monitor.detach:
        raise UsageError(
            "--elastic: not with --detach yet (the job monitor does not replace a lost node)"
        )
    if wanted is None:
        raise UsageError("--elastic needs --nodes N (the hosts past N are the spares)")
    if wanted < 2:
        raise UsageError(
            "--elastic needs --nodes 2 or more (node 0 holds the rendezvous: its loss ends the job)"
        )
    if rt.min_nodes is not None and rt.min_nodes > wanted:
        raise UsageError(f"--min-nodes {rt.min_nodes} is more than --nodes {wanted}")
