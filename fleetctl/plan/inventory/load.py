"""Reading an inventory file: the :class:`Inventory` result and :func:`load_inventory`,
which parses, selects and maps hosts to nodes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetctl.errors import InventoryError
from fleetctl.node import Node
from fleetctl.plan.inventory.ini_source import _check_utf8, _parse_ini
from fleetctl.plan.inventory.model import _group_hosts, _Model
from fleetctl.plan.inventory.nodes import _build_node, _check_duplicates
from fleetctl.plan.inventory.patterns import _evaluate, _preview, _split_host_pattern, _split_limit
from fleetctl.plan.inventory.vars import _load_adjacent_vars
from fleetctl.plan.inventory.yaml_source import _load_yaml, _parse_yaml, _YamlError
from fleetctl.plan.userinput import read_user_file

YAML_EXTENSIONS = (".yml", ".yaml", ".json")


@dataclass(frozen=True)
class Inventory:
    """The selected fleet: nodes in rank order plus group membership, for one file + limit.

    ``groups`` maps every group of the file to its selected member hosts (Ansible's ``groups``
    magic variable, restricted to the selection). ``digest`` changes whenever the file content,
    the limit or the group changes, so check results can be cached per digest.
    """

    path: str | None
    nodes: tuple[Node, ...]
    groups: dict[str, tuple[str, ...]] = field(hash=False, compare=False)
    digest: str
    limit: str | None = None
    group: str = "all"

    @property
    def names(self) -> tuple[str, ...]:
        """Host names in rank order."""
        return tuple(n.name for n in self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready view (``fleetctl inventory --json``)."""
        return {
            "inventory": self.path,
            "limit": self.limit,
            "group": self.group,
            "digest": self.digest,
            "nodes": [n.to_dict(rank) for rank, n in enumerate(self.nodes)],
            "groups": {g: list(members) for g, members in self.groups.items()},
        }


def local_inventory() -> Inventory:
    """The embedded default when no inventory is given: this machine alone, no SSH."""
    node = Node.localhost()
    digest = hashlib.sha256(f"fleetctl-local\0{node.name}\0{node.python}".encode()).hexdigest()
    return Inventory(
        path=None,
        nodes=(node,),
        groups={"all": (node.name,), "ungrouped": (node.name,)},
        digest=digest,
    )


def load_inventory(path: str | Path, limit: str | None = None, group: str = "all") -> Inventory:
    """Read an Ansible YAML or INI inventory and return the selected nodes in rank order.

    ``group`` is the Ansible host pattern whose order gives the ranks (default ``all``);
    ``limit`` (``--limit``) filters it. Raises InventoryError on any bad input.
    """
    shown = str(path)
    p = Path(path)
    raw = read_user_file(p, "inventory", lambda msg: InventoryError(msg, path=shown))
    if raw.startswith(b"$ANSIBLE_VAULT"):
        raise InventoryError("vault-encrypted inventories are not supported", path=shown)
    # Undecodable bytes become surrogates: INI tolerates them in comments (like Ansible), any
    # other place reports the line.
    text = raw.decode("utf-8", "surrogateescape")
    model = _parse(text, shown, p.suffix.lower())
    model.reconcile()
    if not model.hosts:
        raise InventoryError("inventory has no hosts", path=shown)
    vars_files = _load_adjacent_vars(model, p)

    order = _evaluate(model, _split_host_pattern(group), what="group")
    if limit is not None and limit.strip():
        subset = {h.name for h in _evaluate(model, _split_limit(limit, shown), what="--limit")}
        selected = [h for h in order if h.name in subset]
    else:
        selected = order
    if not selected:
        if limit:
            msg = f"--limit {limit!r} matches no hosts in {group!r}"
        else:
            msg = f"{group!r} matches no hosts"
        raise InventoryError(f"{msg} (hosts: {_preview(model.hosts)})", path=shown, field="limit")

    nodes = tuple(_build_node(model, h) for h in selected)
    _check_duplicates(nodes, model)
    chosen = {h.name for h in selected}
    groups = {
        g.name: tuple(h.name for h in _group_hosts(g) if h.name in chosen)
        for g in model.groups.values()
    }
    h = hashlib.sha256(raw + b"\0limit=" + (limit or "").encode() + b"\0group=" + group.encode())
    for name, content in vars_files:
        h.update(b"\0" + name.encode() + b"\0" + content)
    digest = h.hexdigest()
    return Inventory(
        path=shown, nodes=nodes, groups=groups, digest=digest, limit=limit, group=group
    )


def parse_limit(limit: str) -> list[str]:
    """Split a ``--limit`` string into Ansible's single patterns (``a:b,!c`` -> 3 patterns)."""
    return _split_host_pattern(limit)


def _parse(text: str, path: str, suffix: str) -> _Model:
    """YAML for .yml/.yaml/.json; INI for anything else, except that a file with no extension
    that parses as a YAML mapping is YAML (Ansible tries its yaml plugin first for those)."""
    if suffix in YAML_EXTENSIONS:
        _check_utf8(text.splitlines(), path)
        return _parse_yaml(text, path)
    if suffix == "":
        try:
            data = _load_yaml(text)
        except (yaml.YAMLError, _YamlError, UnicodeError):
            data = None
        if isinstance(data, dict) and data:
            _check_utf8(text.splitlines(), path)
            return _parse_yaml(text, path)
    return _parse_ini(text, path)
