"""Role jobs (``fleetctl run --job job.yml``) around the pure layout: reading the job file
against the inventory, free-port probing on the nodes, and the role planner ``run_job`` calls
after check/push.

Pure decisions live in ``fleetctl.plan.roles`` (layout, env, completion); this module reads
files and talks to nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl import remote
from fleetctl.errors import FleetError, PlanError, UsageError
from fleetctl.phases.frames import last_data
from fleetctl.plan.roles import (
    CompletionPolicy,
    JobFile,
    RoleLayout,
    Task,
    assign_ports,
    assign_tasks,
    candidate_ports,
    make_role_plan,
    port_needs,
    ports_per_host,
)

if TYPE_CHECKING:
    from fleetctl.api.runspec import Program
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec, NodeFacts, Plan
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection

PORT_PROBE_TIMEOUT = 20.0

PORT_PROBE = remote.inline("port_probe.py")  # answers D {"free": [...]}


def probe_free_ports(
    fleet: FanOut, job_id: str, counts: Mapping[str, int], *, spare: int = 16
) -> dict[str, list[int]]:
    """Ask each host which of its candidate ports bind now (one remote command per host)."""
    by_name = {n.name: n for n in fleet.nodes}
    todo = [by_name[h] for h, c in counts.items() if c > 0]

    def one(node: Node, conn: Connection) -> list[int]:
        need = counts[node.name]
        cands = candidate_ports(job_id, node.name, need, spare=spare)
        # claimed for this job (host-local O_EXCL files) so a job planned at the same instant
        # cannot take them too; each host's supervisor of the job frees them when it ends
        arg = json.dumps({"candidates": cands, "need": need, "claim": {"job": job_id}})
        res = conn.run(
            [conn.expand(node.python), remote.NO_SITE, "-c", PORT_PROBE, arg],
            timeout=PORT_PROBE_TIMEOUT,
        )
        data: object = None
        with contextlib.suppress(ValueError, KeyError, TypeError):
            data = last_data(res.stdout)
            return [int(p) for p in data["free"]]  # type: ignore[index]
        if isinstance(data, dict) and isinstance(data.get("error"), str):
            # the probe's own words: e.g. a claim folder that is not ours
            raise PlanError(f"{node.name}: {data['error']}")
        raise PlanError(
            f"{node.name}: free-port probe failed (exit {res.exit_code}): "
            + " ".join((res.stderr or res.stdout).split())[-200:]
        )

    if not todo:
        return {}
    res = fleet.map(one, timeout=PORT_PROBE_TIMEOUT + 10, nodes=todo, width=max(len(todo), 1))
    if res.failed:
        err = next(iter(res.failed.values()))
        raise FleetError(f"cannot reserve ports on {len(res.failed)} node(s): {err}", res)
    return {h: list(v) for h, v in res.succeeded.items()}


@dataclass
class RolePlanner:
    """Plans a role job once check/push are done: probes free ports, then the pure plan.

    Construct with :func:`prepare_roles`; pass as ``RunOptions.planner``; ``policy`` is the
    completion policy for ``RunOptions.completion``. Each :meth:`plan` returns the layout with
    the plan (recorded in ``roles.json``); the planner itself never changes.
    """

    job: JobFile
    tasks: list[Task]
    names: str = "fleet"  # the role env's names, resolved (JobFile.env_names)
    user: str = ""

    @property
    def nodes(self) -> list[Node]:
        return [t.node for t in self.tasks]

    @property
    def policy(self) -> CompletionPolicy:
        return CompletionPolicy(
            roles=tuple(t.role for t in self.tasks),
            min_failed={r.name: r.min_failed for r in self.job.roles},
            min_succeeded={r.name: r.min_succeeded for r in self.job.roles},
        )

    def plan(
        self,
        nodes: Sequence[Node],
        spec: JobSpec,
        facts: Mapping[str, NodeFacts] | None,
        code_digest: str | None,
        fleet: FanOut,
    ) -> tuple[Plan, RoleLayout]:
        # Retried attempts keep the hosts but get fresh ports (the old ones may linger).
        by_name = {n.name: n for n in nodes}
        tasks = [dataclasses.replace(t, node=by_name.get(t.node.name, t.node)) for t in self.tasks]
        needs = port_needs(self.job, tasks)
        free = probe_free_ports(fleet, spec.job_id, ports_per_host(tasks, needs))
        spec = self._claim_plain_masters(fleet, tasks, spec)
        ports = assign_ports(tasks, needs, free)
        plan = make_role_plan(
            self.job,
            tasks,
            spec,
            ports,
            facts=facts,
            code_digest=code_digest,
            names=self.names,
            user=self.user,
        )
        return plan, RoleLayout(self.job, tuple(tasks), ports)

    def _claim_plain_masters(self, fleet: FanOut, tasks: Sequence[Task], spec: JobSpec) -> JobSpec:
        """A plain role's tasks meet at MASTER_ADDR:MASTER_PORT (``init_process_group``) on
        its first task's host: claim that port there for this job, like torchrun's (without
        --master-port the first free one; every plain role then uses it)."""
        from fleetctl.job.run.ports import reserve_master_port
        from fleetctl.plan.launchers import launcher_for

        for role in self.job.roles:
            mine = [t for t in tasks if t.role == role.name]
            if launcher_for(role.launcher).one_process_per_node and len(mine) > 1:
                port = reserve_master_port(fleet, mine[0].node, spec)
                spec = dataclasses.replace(spec, rdzv_port=port, rdzv_port_fixed=True)
        return spec

    def dry_plan(self, spec: JobSpec) -> Plan:
        """The role plan with the first candidate ports (no node asked: nothing runs)."""
        needs = port_needs(self.job, self.tasks)
        free = {
            h: candidate_ports(spec.job_id, h, c)
            for h, c in ports_per_host(self.tasks, needs).items()
        }
        ports = assign_ports(self.tasks, needs, free)
        return make_role_plan(self.job, self.tasks, spec, ports, names=self.names, user=self.user)


def prepare_roles(
    job: JobFile,
    nodes: Sequence[Node],
    groups: Mapping[str, Sequence[str]],
    *,
    env_style: str | None = None,
    user: str | None = None,
) -> RolePlanner:
    """Lay the roles out on the inventory (no network yet); ``env_style``: the command
    line's, over the job file's."""
    tasks = assign_tasks(job, nodes, groups)
    return RolePlanner(job, tasks, job.env_names(env_style), user if user is not None else _user())


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


@dataclass(frozen=True)
class RoleJob:
    """A job file laid out on the inventory: the planner (``planner.job`` is the parsed file:
    its retry, timeout and stall_timeout), the job spec, the code dir."""

    planner: RolePlanner
    spec: JobSpec
    code_dir: str


def load_role_job(
    path: str,
    program: Program,
    nodes: Sequence[Node],
    groups: Mapping[str, Sequence[str]],
    spec: JobSpec,
    *,
    code_dir: str | None = None,
    detach: bool = False,
) -> RoleJob:
    """Read the run's role job file ``path`` (its ``--job``, as the preparer found it:
    ``api/runspec_rules.role_file``), lay its roles out on the nodes (``program``: the run's
    Program group, its ``--env-style``), check its scripts exist in the code dir (default: the
    git work tree holding the job file). ``spec`` carries the job id, port, env and backend;
    its script and launcher come from the job file."""
    from fleetctl.plan.roles import load_job_file
    from fleetctl.plan.script_arg import default_code_dir

    job = load_job_file(path)
    if detach and any(r.min_succeeded is not None for r in job.roles):
        raise UsageError(f"{path}: min_succeeded needs a watching controller: no --detach")
    planner = prepare_roles(job, nodes, groups, env_style=program.env_style)
    code = code_dir if code_dir is not None else str(default_code_dir(path))
    for rel, where in [(r.script, r.where) for r in job.roles if r.script] + (
        [(job.script, path)] if job.script else []
    ):
        if not (Path(code) / str(rel)).is_file():
            raise UsageError(f"{where}: script {rel} not found in the code dir {code}")
    # the job file's image and runtime; the command line's win
    spec = dataclasses.replace(
        spec.in_image_of(job), script=Path(path).name, launcher=job.launcher, procs=1
    )
    return RoleJob(planner, spec, code)
