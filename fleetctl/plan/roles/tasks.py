"""Task layout: which host runs which task of which role, and the ports each task reserves."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetctl.errors import PlanError
from fleetctl.plan.roles.jobfile import GLOO_LABEL, PADDLE_LABEL, PADDLE_SERVER_ROLES, JobFile

if TYPE_CHECKING:
    from fleetctl.node import Node

PORT_LO, PORT_HI = 20000, 32767  # below the default ephemeral range (32768-60999)


@dataclass(frozen=True)
class Task:
    """One task: ``role`` index ``index`` on ``node``; ``rank`` is its place in the job."""

    role: str
    index: int
    node: Node
    rank: int


def assign_tasks(
    job: JobFile, nodes: Sequence[Node], groups: Mapping[str, Sequence[str]]
) -> list[Task]:
    """Hosts for every role, in role order then group order; one task per host.

    A role takes the first ``instances`` hosts of its group (default: the role's name when that
    is a group, else ``all``) that no earlier role took. PlanError if a group is short.
    """
    by_name = {n.name: n for n in nodes}
    used: set[str] = set()
    tasks: list[Task] = []
    for role in job.roles:
        group = role.group or (role.name if role.name in groups else "all")
        if group == "all" and "all" not in groups:
            members: Sequence[str] = [n.name for n in nodes]
        elif group not in groups:
            known = ", ".join(sorted(g for g in groups if g != "ungrouped"))
            raise PlanError(
                f"{role.where}: role {role.name!r}: no inventory group {group!r} in the "
                f"selection (groups: {known})"
            )
        else:
            members = groups[group]
        free = [h for h in members if h in by_name and h not in used]
        want = role.instances if role.instances is not None else len(free)
        if want == 0 or len(free) < want:
            taken = [h for h in members if h in used]
            extra = f"; {', '.join(taken)} already run other roles" if taken else ""
            raise PlanError(
                f"{role.where}: role {role.name!r} needs {want or 1} host(s) of group "
                f"{group!r} but {len(free)} are free{extra} (one task per host)"
            )
        for i, host in enumerate(free[:want]):
            used.add(host)
            tasks.append(Task(role.name, i, by_name[host], len(tasks)))
    if job.launcher != "paddle-ps":
        for role in job.roles:
            if role.min_succeeded is not None:
                n = sum(1 for t in tasks if t.role == role.name)
                if role.min_succeeded > n:
                    raise PlanError(
                        f"{role.where}: min_succeeded {role.min_succeeded} > {n} task(s) of "
                        f"role {role.name!r}"
                    )
    return tasks


def role_nodes(tasks: Sequence[Task]) -> list[Node]:
    """The job's node list (rank order = task order)."""
    return [t.node for t in tasks]


# ------------------------------------------------------------------------------------ ports


def port_needs(job: JobFile, tasks: Sequence[Task]) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """(role, index) -> [(label, count)] every task must reserve (paddle-ps labels added)."""
    needs: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for t in tasks:
        labels = list(job.role(t.role).ports)
        if job.launcher == "paddle-ps":
            if PADDLE_LABEL not in dict(labels):
                labels.append((PADDLE_LABEL, 1))
            if t.role in PADDLE_SERVER_ROLES and t.index == 0 and GLOO_LABEL not in dict(labels):
                labels.append((GLOO_LABEL, 1))
        needs[(t.role, t.index)] = labels
    return needs


def ports_per_host(
    tasks: Sequence[Task], needs: Mapping[tuple[str, int], Sequence[tuple[str, int]]]
) -> dict[str, int]:
    """How many free ports each host must find."""
    out: dict[str, int] = {}
    for t in tasks:
        out[t.node.name] = out.get(t.node.name, 0) + sum(n for _, n in needs[(t.role, t.index)])
    return out


def candidate_ports(job_id: str, host: str, count: int, *, spare: int = 16) -> list[int]:
    """``count + spare`` distinct ports to try on ``host``: a window starting at a point hashed
    from (job id, host) inside [PORT_LO, PORT_HI], wrapping. Deterministic, spreads jobs apart."""
    span = PORT_HI - PORT_LO + 1
    n = min(span, max(0, count) + spare)
    start = int.from_bytes(hashlib.sha256(f"{job_id}\0{host}".encode()).digest()[:4], "big")
    return [PORT_LO + (start + i) % span for i in range(n)]


def assign_ports(
    tasks: Sequence[Task],
    needs: Mapping[tuple[str, int], Sequence[tuple[str, int]]],
    free: Mapping[str, Sequence[int]],
) -> dict[tuple[str, int], dict[str, list[int]]]:
    """Hand each task its labelled ports from its host's free list, in task order.

    Tasks sharing a host never get the same port. PlanError naming the host when short.
    """
    left = {h: list(dict.fromkeys(ports)) for h, ports in free.items()}
    out: dict[tuple[str, int], dict[str, list[int]]] = {}
    for t in tasks:
        got: dict[str, list[int]] = {}
        pool = left.get(t.node.name, [])
        for label, n in needs[(t.role, t.index)]:
            if len(pool) < n:
                raise PlanError(
                    f"{t.node.name}: not enough free ports for {t.role}[{t.index}] "
                    f"label {label!r} (needed {n})"
                )
            got[label], pool[:] = pool[:n], pool[n:]
        out[(t.role, t.index)] = got
    return out
