"""Task roles (``fleetctl run --job job.yml``): the job file, the task layout and its env.

Pure — no I/O beyond reading the job file text the caller hands in, no network, no clock. A role
job runs several *roles* (OpenPAI's task roles), each on hosts of an inventory group, with its own
command or launcher, instance count and reserved port labels. Every task is one node of the
run (one supervisor, one ``FLEET_NODE_RANK``): a host runs at most one task of a job.

The job file's keys, with an example: :mod:`fleetctl.plan.roles.jobfile`.

Env of every task (``--env-style fleet``, always set): ``FLEET_ROLE``, ``FLEET_ROLE_INDEX``,
``FLEET_ROLES`` (comma list), ``FLEET_ROLE_COUNT_<role>``, ``FLEET_TASK_INDEX`` /
``FLEET_TASK_COUNT``, ``FLEET_HOST_IP_<role>_<idx>``, ``FLEET_HOSTS_<role>`` (comma list),
``FLEET_PORT_<role>_<idx>_<label>`` (comma list when a label reserves several ports) and the
task's own ``FLEET_PORT_<label>``. Within a role, the launcher variables (``MASTER_ADDR``,
``NODE_RANK``, ``WORLD_SIZE``, ``RANK``…) describe that role's own world, so a torchrun role
is a self-contained DDP job; a torchrun/paddle/deepspeed role reserves a ``master`` port on its
task 0 for its rendezvous.

``--env-style pai`` adds OpenPAI's names (protocol v2 "environment variables and port
reservation", plus the kube-runtime ones): ``PAI_JOB_NAME``, ``PAI_USER_NAME``,
``PAI_DEFAULT_FS_URI`` (empty), ``PAI_TASK_ROLE_COUNT``, ``PAI_TASK_ROLE_LIST``,
``PAI_TASK_ROLE_TASK_COUNT_<role>``, ``PAI_HOST_IP_<role>_<idx>``,
``PAI_PORT_LIST_<role>_<idx>_<label>``, ``PAI_<role>_<idx>_<label>_PORT``,
``PAI_TASK_ROLE_<role>_HOST_LIST``, ``PAI_MIN_FAILED_TASK_COUNT_<role>``,
``PAI_MIN_SUCCEEDED_TASK_COUNT_<role>``, ``PAI_CURRENT_TASK_ROLE_NAME``,
``PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX``, ``PAI_TASK_INDEX``, ``PAI_TASK_ROLE_INDEX``.
(``PAI_RESOURCE_<role>`` is not set: fleetctl does not allocate CPU/memory.)

Completion policy (FrameworkController semantics): a role fails the job once ``min_failed`` of its
tasks failed (default 1; ``null``/-1: never); a role with ``min_succeeded`` ends the job as
succeeded once that many of its tasks succeeded — the others (servers still up) are then
stopped cleanly. Otherwise the job ends when every task ended.

Paddle parameter-server mode (``launcher: paddle-ps``): exactly two roles, ``server`` and
``worker`` (or ``trainer``); every task runs ``python -m paddle.distributed.launch
--servers=<ip:port,…> --trainers=<ip:port,…> --host=<own ip>`` with the job-level script (paddle
3.x names the worker list ``--trainers``; legacy fleetrun called it ``--workers``). Ports are
reserved per task (label ``paddle``; ``gloo`` on server 0 for paddle's gloo HTTP store).

Free ports: :func:`candidate_ports` proposes a deterministic window per host (below Linux's
ephemeral range, so the kernel never hands them to outgoing connections meanwhile), the node
answers which are bindable (a one-shot bind test, ``fleetctl.job.run.rolejob``), and
:func:`assign_ports` hands them out — tasks on one host never share a port.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Each name loads its module on first use (module ``__getattr__``): a plain run loads none of
# them (its retry policy's RetrySpec is ``plan.retryrules``'); completion, the job file, the
# layout and the port table are for role jobs.
_NAMES = {
    "CompletionPolicy": "completion",
    "Verdict": "completion",
    "JobFile": "jobfile",
    "RoleSpec": "jobfile",
    "load_job_file": "jobfile",
    "parse_job_file": "jobfile",
    "RoleLayout": "plan",
    "make_role_plan": "plan",
    "PORT_HI": "tasks",
    "PORT_LO": "tasks",
    "Task": "tasks",
    "assign_ports": "tasks",
    "assign_tasks": "tasks",
    "candidate_ports": "tasks",
    "port_needs": "tasks",
    "ports_per_host": "tasks",
}

if TYPE_CHECKING:
    from fleetctl.plan.roles.completion import CompletionPolicy as CompletionPolicy
    from fleetctl.plan.roles.completion import Verdict as Verdict
    from fleetctl.plan.roles.jobfile import JobFile as JobFile
    from fleetctl.plan.roles.jobfile import RoleSpec as RoleSpec
    from fleetctl.plan.roles.jobfile import load_job_file as load_job_file
    from fleetctl.plan.roles.jobfile import parse_job_file as parse_job_file
    from fleetctl.plan.roles.plan import RoleLayout as RoleLayout
    from fleetctl.plan.roles.plan import make_role_plan as make_role_plan
    from fleetctl.plan.roles.tasks import PORT_HI as PORT_HI
    from fleetctl.plan.roles.tasks import PORT_LO as PORT_LO
    from fleetctl.plan.roles.tasks import Task as Task
    from fleetctl.plan.roles.tasks import assign_ports as assign_ports
    from fleetctl.plan.roles.tasks import assign_tasks as assign_tasks
    from fleetctl.plan.roles.tasks import candidate_ports as candidate_ports
    from fleetctl.plan.roles.tasks import port_needs as port_needs
    from fleetctl.plan.roles.tasks import ports_per_host as ports_per_host

__all__ = [
    "PORT_HI",
    "PORT_LO",
    "CompletionPolicy",
    "JobFile",
    "RoleLayout",
    "RoleSpec",
    "Task",
    "Verdict",
    "assign_ports",
    "assign_tasks",
    "candidate_ports",
    "load_job_file",
    "make_role_plan",
    "parse_job_file",
    "port_needs",
    "ports_per_host",
]


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
