"""``plan.json``'s shape, owned by the plan that makes it: the plan-wide keys in the file's
order with the types its record checks (:data:`PLAN_KEYS`: the run folder's ``PlanRecord``,
``job/records/plan.py``, is made of them), the Plan written as that document
(:func:`plan_document`, also ``--dry-run --json``'s) and read back from one
(:func:`plan_values`), and the Plan's answers to the file's names (:class:`FileNames`).

The file keeps the run options' names (``master_port``, ``nproc_per_node``) where the Plan
says what the values are (``rdzv_port``: the port claimed; ``procs``: resolved, no ``auto``).
Pure: no I/O; the nodes' part of the document is ``NodePlan``'s own (``rankplan.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetctl.plan.launchers.base import PYTHON

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan, Plan

PLAN_VERSION = 1
REQUIRED = ...  # a key the file must have (no default)

# key -> (the type as the record checks it, its default when the file lacks it), in file order;
# ``nodes`` (``NodePlan.to_dict`` each) and the compact form's ``shared`` follow
PLAN_KEYS: dict[str, tuple[str, Any]] = {
    "version": ("int", PLAN_VERSION),
    "job_id": ("str", REQUIRED),
    "created": ("str | None", None),
    "launcher": ("str", ""),
    "script": ("str", ""),
    "kind": ("str | None", None),  # what ``script`` is, when not a Python file (else absent)
    "folder": ("str | None", None),  # where in the code the job runs (absent: its root)
    "args": ("list[str]", []),
    "master_addr": ("str", ""),
    "master_port": ("int", 0),
    "ips": ("list[str]", []),
    "nnodes": ("int", 0),
    "nproc_per_node": ("int", 1),
    "gpus_per_node": ("int", 0),
    "world_size": ("int", 0),
    "backend": ("str | None", None),
    "user_env": ("dict[str, str]", {}),
}
OPTIONAL_KEYS = ("kind", "folder")  # written only when the plan has them


def plan_document(plan: Plan) -> dict[str, Any]:
    """``plan.json``'s object (``Plan.to_dict``)."""
    return {
        "version": plan.version,
        "job_id": plan.job_id,
        "created": plan.created,
        "launcher": plan.launcher,
        "script": plan.script,
        **({"kind": plan.kind} if plan.kind != PYTHON else {}),
        **({"folder": plan.folder} if plan.folder else {}),
        "args": list(plan.args),
        "master_addr": plan.master_addr,
        "master_port": plan.rdzv_port,
        "ips": list(plan.ips),
        "nnodes": plan.nnodes,
        "nproc_per_node": plan.procs,
        "gpus_per_node": plan.gpus_per_node,
        "world_size": plan.world_size,
        "backend": plan.backend,
        "user_env": dict(plan.user_env),
        "nodes": [n.to_dict() for n in plan.nodes],
    }


def plan_values(d: Mapping[str, Any], nodes: tuple[NodePlan, ...]) -> dict[str, Any]:
    """The Plan's fields of an expanded document ``d`` whose ``nodes`` were read (older plans
    lack keys: the first node's env or the nodes say them). TypeError/ValueError/
    AttributeError on a malformed value (``Plan.from_dict`` makes them one PlanError)."""
    first_env = nodes[0].env if nodes else {}
    return {
        "job_id": str(d["job_id"]),
        "launcher": d.get("launcher", ""),
        "script": d.get("script", ""),
        "args": tuple(d.get("args") or ()),
        "master_addr": d.get("master_addr") or first_env.get("MASTER_ADDR", ""),
        "rdzv_port": int(d.get("master_port") or first_env.get("MASTER_PORT") or 0),
        "ips": tuple(d.get("ips") or (n.train_addr for n in nodes)),
        "nnodes": int(d.get("nnodes") or len(nodes)),
        "procs": int(d.get("nproc_per_node") or 1),
        "gpus_per_node": int(d.get("gpus_per_node") or 0),
        "world_size": int(d.get("world_size") or len(nodes)),
        "nodes": nodes,
        "user_env": dict(d.get("user_env") or {}),
        "backend": d.get("backend"),
        "created": d.get("created"),
        "version": int(d.get("version") or PLAN_VERSION),
        "kind": d.get("kind") or PYTHON,
        "folder": d.get("folder") or "",
    }


class FileNames:
    """The Plan's values under plan.json's names (a dry run's Plan, as library callers read
    it): the resolved port and processes per node."""

    rdzv_port: int
    procs: int

    @property
    def master_port(self) -> int:
        """plan.json's name for ``Plan.rdzv_port``."""
        return self.rdzv_port

    @property
    def nproc_per_node(self) -> int:
        """plan.json's name for ``Plan.procs``."""
        return self.procs
