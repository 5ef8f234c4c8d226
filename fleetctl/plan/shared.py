"""The compact plan document: fleet-wide values written once, not once per node.

Every node's env holds ``FLEET_NODE_IPS`` (all training addresses), paddle's argv holds
``--ips=…``, deepspeed writes the same hostfile on every node: printed per node, a plan grows
with nodes² (5,000 hosts: 285 MB of ``--dry-run --json``). The compact form writes such a
value once, in the top-level ``shared`` object, and puts a marker in its place on every node::

    "shared": {"env.FLEET_NODE_IPS": "10.0.0.1,10.0.0.2,…", "argv.3": "--ips=10.0.0.1,…"},
    "nodes": [{"env": {"FLEET_NODE_IPS": {"shared": "env.FLEET_NODE_IPS"}, …},
               "argv": ["python3", "-m", "paddle.distributed.launch", {"shared": "argv.3"}, …]}]

A value is shared when it sits at the same place on every node (same env name, same argv
position, same file name), is the same string there, and is at least ``SHARED_MIN_CHARS``
long; every key stays where it was, only the value is replaced.

A role job's env also holds one short variable per task of the job, the same on every node
(OpenPAI's ``PAI_HOST_IP_worker_17``, ``FLEET_PORT_server_0_http``): nodes² again, in many
short values. Such a *family* — names that differ only in their numbers, at least
``FAMILY_MIN`` of them, each the same on every node — is written once as an object, and each
node's env holds one key for it, the family's pattern (digits as ``#``, never an env name)::

    "shared": {"envs.PAI_HOST_IP_worker_#": {"PAI_HOST_IP_worker_0": "10.0.0.5", …}},
    "nodes": [{"env": {"PAI_HOST_IP_worker_#": {"shared": "envs.PAI_HOST_IP_worker_#"}, …}}]
 With one node, or fleets
small enough that no such value is that long, the compact form is the full form. The marker
is a JSON object where the full form has a string, so it cannot be mistaken for a value.
:func:`expand_shared` undoes it exactly (``Plan.from_dict`` reads both forms).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from fleetctl.errors import PlanError

SHARED_MIN_CHARS = 128  # shorter values stay in place: per node at most this much per value
SHARED = "shared"  # the top-level object, and the marker's only key
FAMILY_MIN = 16  # fewer per-task variables than this stay in place
_DIGITS = re.compile(r"\d+")


def share_values(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The full plan document (``Plan.to_dict()``) with its fleet-wide values written once."""
    nodes: list[Mapping[str, Any]] = list(plan["nodes"])
    out = dict(plan)
    if len(nodes) < 2:
        return out
    shared: dict[str, Any] = {}
    env_names = _shared_keys([n["env"] for n in nodes])
    families = _families([n["env"] for n in nodes], set(env_names))
    for pattern, names in families.items():
        shared[f"envs.{pattern}"] = {k: nodes[0]["env"][k] for k in names}
    file_names = _shared_keys([n.get("files") or {} for n in nodes])
    positions = shared_positions([n["argv"] for n in nodes])
    for name in env_names:
        shared[f"env.{name}"] = nodes[0]["env"][name]
    for i in positions:
        shared[f"argv.{i}"] = nodes[0]["argv"][i]
    for name in file_names:
        shared[f"files.{name}"] = nodes[0]["files"][name]
    if not shared:
        return out
    out[SHARED] = shared
    out["nodes"] = [_marked(n, env_names, positions, file_names, families) for n in nodes]
    return out


def expand_shared(plan: Mapping[str, Any]) -> Mapping[str, Any]:
    """The full form of a plan document: every marker replaced by its ``shared`` value.

    A document without ``shared`` is returned as it is. PlanError for a marker naming no
    shared value, or a ``shared`` that is not an object of strings.
    """
    if SHARED not in plan:
        return plan
    shared = plan[SHARED]
    if not isinstance(shared, Mapping) or not all(
        isinstance(v, str)
        or (
            str(k).startswith("envs.")
            and isinstance(v, Mapping)
            and all(isinstance(x, str) for x in v.values())
        )
        for k, v in shared.items()
    ):
        raise PlanError("malformed plan: shared is not an object of strings")
    nodes = plan.get("nodes")
    if not isinstance(nodes, list):
        return plan  # Plan.from_dict names what is wrong
    out = {k: v for k, v in plan.items() if k != SHARED}
    out["nodes"] = [_expanded(n, shared) for n in nodes]
    return out


def _shared_keys(maps: list[Mapping[str, Any]]) -> list[str]:
    first, rest = maps[0], maps[1:]
    return [
        k
        for k, v in first.items()
        if isinstance(v, str) and len(v) >= SHARED_MIN_CHARS and all(m.get(k) == v for m in rest)
    ]


def _families(envs: list[Mapping[str, Any]], taken: set[str]) -> dict[str, list[str]]:
    """Per-task variables: pattern (digits as ``#``) -> its names, for families of at least
    ``FAMILY_MIN`` short values each the same on every node."""
    first, rest = envs[0], envs[1:]
    found: dict[str, list[str]] = {}
    for k, v in first.items():
        if k in taken or not isinstance(v, str) or not _DIGITS.search(k):
            continue
        if all(m.get(k) == v for m in rest):
            found.setdefault(_DIGITS.sub("#", k), []).append(k)
    return {p: names for p, names in found.items() if len(names) >= FAMILY_MIN and p not in first}


def shared_positions(argvs: Sequence[Sequence[Any]]) -> list[int]:
    """The argv positions holding the same long string on every node (paddle's ``--ips=…``)."""
    if len(argvs) < 2:
        return []
    first, rest = argvs[0], argvs[1:]
    return [
        i
        for i, v in enumerate(first)
        if isinstance(v, str)
        and len(v) >= SHARED_MIN_CHARS
        and all(len(a) > i and a[i] == v for a in rest)
    ]


def _marker(name: str) -> dict[str, str]:
    return {SHARED: name}


def _marked(
    node: Mapping[str, Any],
    env_names: list[str],
    positions: list[int],
    file_names: list[str],
    families: Mapping[str, list[str]],
) -> dict[str, Any]:
    n = dict(node)
    if env_names:
        n["env"] = {**node["env"], **{k: _marker(f"env.{k}") for k in env_names}}
    if families:
        member = {k: p for p, names in families.items() for k in names}
        env: dict[str, Any] = {}
        for k, v in n["env"].items():
            p = member.get(k)
            if p is None:
                env[k] = v
            elif p not in env:  # the family's one key, where its first member was
                env[p] = _marker(f"envs.{p}")
        n["env"] = env
    if positions:
        argv = list(node["argv"])
        for i in positions:
            argv[i] = _marker(f"argv.{i}")
        n["argv"] = argv
    if file_names:
        n["files"] = {**node["files"], **{k: _marker(f"files.{k}") for k in file_names}}
    return n


def _expanded(node: Any, shared: Mapping[str, str]) -> Any:
    if not isinstance(node, Mapping):
        return node  # Plan.from_dict names what is wrong

    def value(v: Any) -> Any:
        if not isinstance(v, Mapping):
            return v
        name = v.get(SHARED) if len(v) == 1 else None
        if not isinstance(name, str) or name not in shared:
            raise PlanError(f"malformed plan: node {node.get('host')}: {v!r} names no shared value")
        return shared[name]

    n = dict(node)
    if isinstance(node.get("env"), Mapping):
        env: dict[str, Any] = {}
        for k, v in node["env"].items():
            got = value(v)
            if isinstance(got, Mapping):  # a family of per-task variables
                env.update(got)
            else:
                env[k] = got
        n["env"] = env
    if isinstance(node.get("argv"), list):
        n["argv"] = [value(a) for a in node["argv"]]
    if isinstance(node.get("files"), Mapping):
        n["files"] = {k: value(v) for k, v in node["files"].items()}
    return n
