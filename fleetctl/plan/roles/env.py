"""The env every task sees: ``FLEET_*`` always, OpenPAI's ``PAI_*`` with ``--env-style pai``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.plan.roles.jobfile import JobFile
    from fleetctl.plan.roles.tasks import Task


def task_env(
    job: JobFile,
    tasks: Sequence[Task],
    addrs: Mapping[str, str],
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    task: Task,
    *,
    names: str = "fleet",
    job_name: str = "",
    user: str = "",
) -> dict[str, str]:
    """The role variables of one task (see the module doc); ``addrs``: host -> training IP;
    ``names``: fleet, or pai for OpenPAI's too (``JobFile.env_names``)."""
    style = names
    roles = [r.name for r in job.roles]
    by_role: dict[str, list[Task]] = {r: [t for t in tasks if t.role == r] for r in roles}
    env: dict[str, str] = {
        "FLEET_ROLE": task.role,
        "FLEET_ROLE_INDEX": str(task.index),
        "FLEET_ROLES": ",".join(roles),
        "FLEET_TASK_INDEX": str(task.rank),
        "FLEET_TASK_COUNT": str(len(tasks)),
    }
    for r in roles:
        env[f"FLEET_ROLE_COUNT_{r}"] = str(len(by_role[r]))
        env[f"FLEET_HOSTS_{r}"] = ",".join(addrs[t.node.name] for t in by_role[r])
        for t in by_role[r]:
            env[f"FLEET_HOST_IP_{r}_{t.index}"] = addrs[t.node.name]
            for label, plist in ports.get((r, t.index), {}).items():
                env[f"FLEET_PORT_{r}_{t.index}_{label}"] = ",".join(str(p) for p in plist)
    for label, plist in ports.get((task.role, task.index), {}).items():
        env[f"FLEET_PORT_{label}"] = ",".join(str(p) for p in plist)
    if style == "pai":
        env.update(_pai_env(job, by_role, addrs, ports, task, job_name=job_name, user=user))
    return env


def _pai_env(
    job: JobFile,
    by_role: Mapping[str, Sequence[Task]],
    addrs: Mapping[str, str],
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    task: Task,
    *,
    job_name: str,
    user: str,
) -> dict[str, str]:
    roles = list(by_role)
    env = {
        "PAI_JOB_NAME": job_name,
        "PAI_USER_NAME": user,
        "PAI_DEFAULT_FS_URI": "",
        "PAI_TASK_ROLE_COUNT": str(len(roles)),
        "PAI_TASK_ROLE_LIST": ",".join(roles),
        "PAI_CURRENT_TASK_ROLE_NAME": task.role,
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(task.index),
        "PAI_TASK_INDEX": str(task.index),
        "PAI_TASK_ROLE_INDEX": str(roles.index(task.role)),
    }
    for r in roles:
        spec = job.role(r)
        env[f"PAI_TASK_ROLE_TASK_COUNT_{r}"] = str(len(by_role[r]))
        env[f"PAI_TASK_ROLE_{r}_HOST_LIST"] = ",".join(addrs[t.node.name] for t in by_role[r])
        env[f"PAI_MIN_FAILED_TASK_COUNT_{r}"] = str(
            spec.min_failed if spec.min_failed is not None else -1
        )
        env[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{r}"] = str(
            spec.min_succeeded if spec.min_succeeded is not None else -1
        )
        for t in by_role[r]:
            env[f"PAI_HOST_IP_{r}_{t.index}"] = addrs[t.node.name]
            for label, plist in ports.get((r, t.index), {}).items():
                joined = ",".join(str(p) for p in plist)
                env[f"PAI_PORT_LIST_{r}_{t.index}_{label}"] = joined
                env[f"PAI_{r}_{t.index}_{label}_PORT"] = joined
    return env
