"""The role plan: one rank plan per role (or paddle-ps's single one) merged into the job's
:class:`~fleetctl.plan.rankplan.Plan`, plus the :class:`RoleLayout` the run phase needs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from fleetctl.errors import PlanError
from fleetctl.plan.rankplan import JobSpec, NodeFacts, NodePlan, Plan, make_plan
from fleetctl.plan.roles.env import task_env
from fleetctl.plan.roles.jobfile import (
    GLOO_LABEL,
    MASTER_LABEL,
    PADDLE_LABEL,
    PADDLE_SERVER_ROLES,
    PADDLE_TRAINER_ROLES,
    JobFile,
)

if TYPE_CHECKING:
    from fleetctl.plan.roles.tasks import Task

COMMAND_SCRIPT = "command"  # stand-in script name for command roles while planning


@dataclass(frozen=True)
class RoleLayout:
    """What the run phase needs beyond the Plan: who runs which role, and its policy."""

    job: JobFile
    tasks: tuple[Task, ...]
    ports: dict[tuple[str, int], dict[str, list[int]]] = field(hash=False)

    def role_of(self, rank: int) -> str:
        return self.tasks[rank].role


def make_role_plan(
    job: JobFile,
    tasks: Sequence[Task],
    base: JobSpec,
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    *,
    facts: Mapping[str, NodeFacts] | None = None,
    code_digest: str | None = None,
    names: str | None = None,
    user: str = "",
) -> Plan:
    """One Plan for the whole role job: each role planned as its own world, then merged.

    ``base`` carries the job id, created stamp, user ``--env-var``s and backend. Node ranks are
    global (task order), so ``FLEET_NODE_RANK`` is unique per task; within a role the launcher
    sees the role's own ranks; ``names``: the role env's names (``JobFile.env_names``;
    default: the job file's). Raises PlanError.
    """
    if not tasks:
        raise PlanError("no tasks to run")
    facts, style = facts or {}, job.env_names(names)
    addrs = {
        t.node.name: (facts.get(t.node.name) or NodeFacts()).train_addr
        or t.node.train_addr
        or t.node.address
        for t in tasks
    }
    merged: list[NodePlan | None] = [None] * len(tasks)
    all_ips = ",".join(addrs[x.node.name] for x in tasks)  # once: every task shares the string
    if job.launcher == "paddle-ps":
        role_plans = _paddle_ps_plans(job, tasks, base, ports, addrs, facts, code_digest)
    else:
        role_plans = _role_plans(job, tasks, base, ports, facts, code_digest)
    for role_tasks, plan in role_plans:
        for t, np in zip(role_tasks, plan.nodes, strict=True):
            env = dict(np.env)
            env.update(
                task_env(
                    job,
                    tasks,
                    addrs,
                    ports,
                    t,
                    names=style,
                    job_name=job.name or base.job_id,
                    user=user,
                )
            )
            env["FLEET_NODE_RANK"] = str(t.rank)
            env["FLEET_NUM_NODES"] = str(len(tasks))
            env["FLEET_NODE_IPS"] = all_ips
            env.update(job.env)
            env.update(job.role(t.role).env)
            env.update(base.env)
            np2 = replace(np, node_rank=t.rank, env=env)
            if job.role(t.role).launcher == "command":
                np2 = replace(
                    np2,
                    argv=job.role(t.role).command,
                    env={**env, "FLEET_LAUNCHER": "command"},
                )
            merged[t.rank] = np2
    nodes = tuple(n for n in merged if n is not None)
    first = role_plans[0][1]
    return Plan(
        job_id=base.job_id,
        launcher=job.launcher,
        script=job.script or job.name or "roles",
        args=job.args,
        master_addr=first.master_addr,
        rdzv_port=first.rdzv_port,
        ips=tuple(addrs[t.node.name] for t in tasks),
        nnodes=len(tasks),
        procs=max(p.procs for _, p in role_plans),
        gpus_per_node=max(p.gpus_per_node for _, p in role_plans),
        world_size=sum(p.world_size for _, p in role_plans),
        nodes=nodes,
        user_env=dict(base.env),
        backend=base.backend,
        created=base.created,
    )


def _role_plans(
    job: JobFile,
    tasks: Sequence[Task],
    base: JobSpec,
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    facts: Mapping[str, NodeFacts],
    code_digest: str | None,
) -> list[tuple[list[Task], Plan]]:
    out = []
    for role in job.roles:
        rtasks = [t for t in tasks if t.role == role.name]
        if not rtasks:
            continue
        command = role.launcher == "command"
        master = ports.get((role.name, 0), {}).get(MASTER_LABEL)
        spec = base.part(
            script=COMMAND_SCRIPT if command else str(role.script),
            args=() if command else role.args,
            launcher="plain" if command else role.launcher,
            procs=1 if command else role.procs,
            rdzv_port=int(master[0]) if master else base.rdzv_port,
            env={},
            backend=role.backend or job.backend or base.backend,
        )
        try:
            plan = make_plan([t.node for t in rtasks], spec, facts or None, code_digest=code_digest)
        except PlanError as e:
            raise PlanError(f"role {role.name!r}: {e}") from e
        out.append((rtasks, plan))
    return out


def _paddle_ps_plans(
    job: JobFile,
    tasks: Sequence[Task],
    base: JobSpec,
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    addrs: Mapping[str, str],
    facts: Mapping[str, NodeFacts],
    code_digest: str | None,
) -> list[tuple[list[Task], Plan]]:
    """Every task runs paddle's launcher in PS mode with the same --servers/--trainers lists."""
    from fleetctl.plan.launchers.base import python_path, run_path, script_path

    servers = [t for t in tasks if t.role in PADDLE_SERVER_ROLES]
    trainers = [t for t in tasks if t.role in PADDLE_TRAINER_ROLES]
    for t in tasks:
        a = addrs[t.node.name]
        if "." not in a or ":" in a:
            raise PlanError(
                f"{t.node.name}: training address {a!r} is not a dotted IPv4 address; paddle "
                "ignores --host without a dot (set fleetctl_addr or fleetctl_nic)"
            )
    # paddle picks a node's endpoints with str.startswith(node_ip): 10.0.0.1 would also claim
    # 10.0.0.12's endpoints. Refuse such address sets instead of mis-assigning roles.
    ips = sorted(set(addrs.values()))
    for a in ips:
        for b in ips:
            if a != b and b.startswith(a):
                raise PlanError(
                    f"paddle-ps: address {a} is a prefix of {b}; paddle would assign {b}'s "
                    "endpoints to the node with {a} (use addresses that are not prefixes)"
                )

    def ep(t: Task) -> str:
        return f"{addrs[t.node.name]}:{ports[(t.role, t.index)][PADDLE_LABEL][0]}"

    server_eps = ",".join(ep(t) for t in servers)
    trainer_eps = ",".join(ep(t) for t in trainers)
    gloo = ports[(servers[0].role, 0)][GLOO_LABEL][0]
    spec = base.part(
        script=str(job.script),
        args=job.args,
        launcher="plain",
        procs=1,
        rdzv_port=int(gloo),
        env={},
        backend=job.backend or base.backend,
    )
    plan = make_plan([t.node for t in tasks], spec, facts or None, code_digest=code_digest)
    nodes = []
    for t, np in zip(tasks, plan.nodes, strict=True):
        argv = (
            python_path(np),
            "-m",
            "paddle.distributed.launch",
            f"--servers={server_eps}",
            f"--trainers={trainer_eps}",
            f"--host={addrs[t.node.name]}",
            f"--gloo_port={gloo}",
            f"--job_id={base.job_id}",
            f"--log_dir={run_path(np, 'log')}",
            script_path(np, str(job.script)),
            *job.args,
        )
        env = {k: v for k, v in np.env.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        env["FLEET_LAUNCHER"] = "paddle-ps"
        nodes.append(replace(np, argv=argv, env=env))
    return [(list(tasks), replace(plan, nodes=tuple(nodes), launcher="paddle-ps"))]
