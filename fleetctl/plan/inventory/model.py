"""The in-memory inventory model: groups, hosts and their vars (Ansible's InventoryData,
reduced to what fleetctl needs)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleetctl.errors import InventoryError

_Origin = tuple[str, "int | None"]  # (file, line) a variable was set at


class _Group:
    __slots__ = (
        "children",
        "depth",
        "dir_src",
        "dir_vars",
        "hosts",
        "line",
        "members",
        "name",
        "parents",
        "priority",
        "var_src",
        "vars",
    )

    def __init__(self, name: str, line: int | None) -> None:
        self.name = name
        self.line = line
        self.hosts: list[_Host] = []  # direct hosts, in the order they were added
        self.members: set[str] = set()  # their names, for O(1) membership
        self.children: list[_Group] = []
        self.parents: list[_Group] = []
        self.vars: dict[str, Any] = {}  # from the inventory file
        self.var_src: dict[str, _Origin] = {}
        self.dir_vars: dict[str, Any] = {}  # from group_vars/<name>[.yml] next to the file
        self.dir_src: dict[str, _Origin] = {}
        self.priority = 1
        self.depth = 0

    def ancestors(self) -> set[_Group]:
        seen: set[_Group] = set()
        todo = list(self.parents)
        while todo:
            g = todo.pop()
            if g not in seen:
                seen.add(g)
                todo.extend(g.parents)
        return seen


class _Host:
    __slots__ = ("dir_src", "dir_vars", "line", "name", "var_src", "vars")

    def __init__(self, name: str, line: int | None) -> None:
        self.name = name
        self.line = line
        self.vars: dict[str, Any] = {}  # from the inventory file
        self.var_src: dict[str, _Origin] = {}
        self.dir_vars: dict[str, Any] = {}  # from host_vars/<name>[.yml] next to the file
        self.dir_src: dict[str, _Origin] = {}


class _Model:
    """Hosts and groups in creation order; mirrors Ansible's add_host/add_child/set_variable."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.groups: dict[str, _Group] = {}
        self.hosts: dict[str, _Host] = {}
        self._memberships: dict[str, set[_Group]] | None = None  # filled after reconcile()
        self.add_group("all", None)
        self.add_group("ungrouped", None)
        self.add_child("all", "ungrouped", None)

    def error(self, message: str, line: int | None, **kw: Any) -> InventoryError:
        return InventoryError(message, path=self.path, line=line, **kw)

    def add_group(self, name: Any, line: int | None) -> str:
        if not isinstance(name, str) or not name:
            raise self.error(f"invalid group name {name!r}: must be a non-empty string", line)
        if name in self.hosts:
            raise self.error(f"{name!r} is already a host; a group cannot share its name", line)
        if name not in self.groups:
            self.groups[name] = _Group(name, line)
        return name

    def add_host(self, name: str, group: str | None, port: int | None, line: int | None) -> None:
        if name in self.groups:
            raise self.error(f"host {name!r} has the same name as a group", line, host=name)
        host = self.hosts.get(name)
        if host is None:
            host = self.hosts[name] = _Host(name, line)
            if port:  # Ansible applies a pattern's :port only when it creates the host
                host.vars["ansible_port"] = port
                host.var_src["ansible_port"] = (self.path, line)
        if group is not None:
            g = self.groups[group]
            if name not in g.members:
                g.hosts.append(host)
                g.members.add(name)

    def add_child(self, parent: str, child: str, line: int | None) -> None:
        p, c = self.groups[parent], self.groups[child]
        if p is c or p in _descendants(c):
            raise self.error(f"group {child!r} as child of {parent!r} makes a loop", line)
        if c in p.children:
            return
        p.children.append(c)
        if p not in c.parents:
            c.parents.append(p)

    def set_group_var(self, group: str, key: Any, value: Any, line: int | None) -> None:
        g = self.groups[group]
        key = self._var_name(key, line)
        if key == "ansible_group_priority":
            try:
                if isinstance(value, bool):
                    raise ValueError
                g.priority = int(value)
            except (TypeError, ValueError) as e:
                raise self.error(
                    f"group {group}: ansible_group_priority must be an integer, got {value!r}",
                    line,
                    field=key,
                ) from e
            return
        g.vars[key] = value
        g.var_src[key] = (self.path, line)

    def set_host_var(self, host: str, key: Any, value: Any, line: int | None) -> None:
        h = self.hosts[host]
        key = self._var_name(key, line)
        h.vars[key] = value
        h.var_src[key] = (self.path, line)

    def _var_name(self, key: Any, line: int | None) -> str:
        if not isinstance(key, str) or not key:
            raise self.error(f"invalid variable name {key!r}", line)
        return key

    def reconcile(self) -> None:
        """Ansible's reconcile_inventory: orphan groups under ``all``, ungrouped bookkeeping."""
        all_g, ungrouped = self.groups["all"], self.groups["ungrouped"]
        for g in list(self.groups.values()):
            if g is not all_g and not g.parents:
                self.add_child("all", g.name, None)
        for name, host in self.hosts.items():
            mine = self.host_groups(host)
            if ungrouped in mine:
                if mine - {all_g, ungrouped}:
                    ungrouped.hosts.remove(host)
                    ungrouped.members.discard(name)
            elif not (mine - {all_g}):
                ungrouped.hosts.append(host)
                ungrouped.members.add(name)
        # depth = longest path from all (Ansible keeps it as max(parent.depth + 1)).
        depth: dict[_Group, int] = {all_g: 0}

        def depth_of(g: _Group) -> int:
            if g not in depth:
                depth[g] = 1 + max(depth_of(p) for p in g.parents)
            return depth[g]

        for g in self.groups.values():
            g.depth = depth_of(g)
        # The model is final now: index memberships once (large fleets ask per host, often).
        ancestors = {g: g.ancestors() for g in self.groups.values()}
        memberships: dict[str, set[_Group]] = {name: set() for name in self.hosts}
        for g in self.groups.values():
            for h in g.hosts:
                memberships[h.name] |= {g} | ancestors[g]
        self._memberships = memberships

    def host_groups(self, host: _Host) -> set[_Group]:
        """Every group the host belongs to, directly or through a child group."""
        if self._memberships is not None:
            return self._memberships[host.name]
        return _with_ancestors(g for g in self.groups.values() if host.name in g.members)


def _descendants(g: _Group) -> set[_Group]:
    seen: set[_Group] = set()
    todo = list(g.children)
    while todo:
        c = todo.pop()
        if c not in seen:
            seen.add(c)
            todo.extend(c.children)
    return seen


def _with_ancestors(groups: Iterable[_Group]) -> set[_Group]:
    out: set[_Group] = set()
    for g in groups:
        out.add(g)
        out |= g.ancestors()
    return out


def _group_hosts(group: _Group) -> list[_Host]:
    """Ansible's Group.get_hosts(): own hosts, then breadth-first through child groups."""
    ordered = [group]
    seen = {group}
    level = [group]
    while level:
        nxt: list[_Group] = []
        for g in level:
            for c in g.children:
                if c not in seen:
                    seen.add(c)
                    ordered.append(c)
                    nxt.append(c)
        level = nxt
    out: list[_Host] = []
    have: set[str] = set()
    for g in ordered:
        for h in g.hosts:
            if h.name not in have:
                have.add(h.name)
                out.append(h)
    return out
