"""Ansible inventories (YAML and INI) -> nodes in rank order.

Ops teams already describe their boxes for Ansible, so fleetctl reads those files as they are
instead of inventing a format. The model below follows ansible-core 2.19's own inventory rules,
re-implemented (no ansible import, it is not a runtime dependency):

* Parsing: the YAML plugin (``all:`` -> ``hosts:`` / ``vars:`` / ``children:``) and the INI
  plugin (``[g]``, ``[g:vars]``, ``[g:children]``, inline ``host k=v``, hosts before any
  section go to ``ungrouped``; values typed with ``ast.literal_eval`` like Ansible does).
  Host ranges ``gpu[01:16]``, ``node-[a:c]``, ``[1:10:2]``; ``host:port``.
* After parsing ("reconcile"): groups without a parent become children of ``all``; hosts with
  no group go to ``ungrouped``, hosts in another group leave it.
* Variables: ``all`` vars < other groups sorted by (depth, ``ansible_group_priority``, name)
  < host vars (last definition of a host var wins). Depth = longest path from ``all``.
* ``group_vars/`` and ``host_vars/`` beside the inventory file are read like Ansible's default
  vars plugin does: ``group_vars/all`` then ``group_vars/<group>`` (same group order) above all
  of the file's group vars; ``host_vars/<host>`` above the file's host vars.
* Order (= node rank): the order Ansible's ``Group.get_hosts()`` yields for the selected group,
  which is what ``ansible-inventory --list`` iterates and ``ansible --list-hosts`` prints: the
  group's own hosts, then breadth-first through its children (in declaration order), each host
  at its first appearance. ``--limit`` only filters that order, it never reorders.
  One caveat: ansible-core walks the 2nd and deeper levels of that breadth-first search over a
  Python ``set`` of groups, so when several groups on one level have child groups, Ansible's
  order between those grandchildren changes from run to run. fleetctl always takes them in
  declaration order, which is one of the orders Ansible produces (and the only stable one).
* ``--limit`` patterns as Ansible: names, globs, ``~regex``, ``a:b`` / ``a,b`` unions,
  ``&`` intersections, ``!`` exclusions, ``group[0]`` / ``group[1:3]`` subscripts, ``@file``.

Stricter than Ansible (which warns and carries on) because a silently dropped or doubled host
changes a job's world size: a ``--limit`` part that matches nothing, duplicate YAML keys,
unknown keys in a YAML group, a group that is not a mapping, a host named like a group,
reversed ranges (``[9:2]``), two remote hosts with the same address and port.

What fleetctl does *not* do: Jinja templating (a mapped value containing ``{{`` is refused),
vault decryption (encrypted values are refused where used; encrypted vars files are skipped),
dynamic inventory scripts/plugins, several ``-i`` sources.

Bad input raises :class:`~fleetctl.errors.InventoryError` (exit code 2) whose message starts
with ``file:line:`` where the file gives a line, and names the host and field.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import ipaddress
import os
import re
import shlex
import string
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetctl.errors import InventoryError
from fleetctl.node import DEFAULT_PYTHON, DEFAULT_WORKDIR, Node

__all__ = ["Inventory", "load_inventory", "local_inventory", "parse_limit"]

YAML_EXTENSIONS = (".yml", ".yaml", ".json")
SSH_CONNECTIONS = frozenset({"ssh", "smart", "paramiko", "paramiko_ssh"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --------------------------------------------------------------------------------------------
# Public result


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
            "nodes": [node_dict(rank, n) for rank, n in enumerate(self.nodes)],
            "groups": {g: list(members) for g, members in self.groups.items()},
        }


def node_dict(rank: int, node: Node) -> dict[str, Any]:
    """One node as JSON-ready dict; ``rank`` is its node rank (position in the inventory)."""
    return {
        "rank": rank,
        "host": node.name,
        "address": node.address,
        "port": node.port,
        "user": node.user,
        "key_file": node.key_file,
        "local": node.local,
        "nic": node.nic,
        "train_addr": node.train_addr,
        "gpus": node.gpus,
        "workdir": node.workdir,
        "python": node.python,
        "env": dict(node.env),
        "env_archive": node.env_archive,
        "known_hosts": node.known_hosts,
        "ssh_config": node.ssh_config,
        "groups": list(node.groups),
        "source": node.source,
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
    try:
        raw = p.read_bytes()
    except IsADirectoryError as e:
        raise InventoryError("is a directory, expected an inventory file", path=shown) from e
    except OSError as e:
        raise InventoryError(f"cannot read inventory: {e.strerror or e}", path=shown) from e
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


# --------------------------------------------------------------------------------------------
# The in-memory model (Ansible's InventoryData, reduced to what we need)


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


# --------------------------------------------------------------------------------------------
# Host patterns inside inventories: host[:port] and [x:y(:step)] ranges


_RANGE = r"\[(?:[a-zA-Z]:[a-zA-Z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_HOSTNAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.UNICODE)
_IPV4_PART = r"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9]{1,2}|\[[0-9]+:[0-9]+(?::[0-9]+)?\])"
_IPV4_RE = re.compile(rf"^(?:{_IPV4_PART}\.){{3}}{_IPV4_PART}$")
_BRACKET_PORT_RE = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOST_PORT_RE = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def _parse_address(text: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (``[v6]:port`` for IPv6) -> (host, port), or None if not an address."""
    port: int | None = None
    for rx in (_BRACKET_PORT_RE, _HOST_PORT_RE):
        m = rx.match(text)
        if m:
            text, port = m.group(1), int(m.group(2))
    if _IPV4_RE.match(text) or _is_ipv6(text) or _HOSTNAME_RE.match(text):
        return text, port
    return None


def _expand_range(pattern: str) -> list[str]:
    """``gpu[01:03]`` -> gpu01 gpu02 gpu03 (zero padding kept, letters, steps, several ranges)."""
    if "[" not in pattern:
        return [pattern]
    head, sep, rest = pattern.partition("[")
    body, sep2, tail = rest.partition("]")
    if not sep or not sep2:
        raise ValueError("unbalanced '[' in host range")
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError("must be begin:end or begin:end:step")
    beg, end = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise ValueError("no end value")
    if not step_text.isdigit() or int(step_text) < 1:
        raise ValueError("step must be a positive integer")
    step = int(step_text)
    width = len(beg) if beg[0] == "0" and len(beg) > 1 else 0
    if width and width != len(end):
        raise ValueError("zero-padded begin and end must have equal length")
    letters = string.ascii_letters
    if beg in letters and end in letters and len(beg) == len(end) == 1:
        i, j = letters.index(beg), letters.index(end)
        if i > j:
            raise ValueError("begins after it ends")
        seq = list(letters[i : j + 1 : step])
    elif beg.isdigit() and end.isdigit():
        if int(beg) > int(end):
            raise ValueError("begins after it ends")
        seq = [str(v).zfill(width) for v in range(int(beg), int(end) + 1, step)]
    else:
        raise ValueError("must be numbers or single letters")
    out: list[str] = []
    for item in seq:
        out.extend(_expand_range(f"{head}{item}{tail}"))
    return out


def _expand_hostpattern(
    model: _Model, pattern: str, line: int | None
) -> tuple[list[str], int | None]:
    parsed = _parse_address(pattern)
    name, port = parsed if parsed else (pattern, None)
    try:
        names = _expand_range(name)
    except ValueError as e:
        raise model.error(f"bad host range {pattern!r}: {e}", line, host=pattern) from e
    for n in names:
        if not n or n.strip() != n:
            raise model.error(f"invalid host name {n!r}", line, host=n)
    if port is not None and not 0 < port < 65536:
        raise model.error(
            f"host {pattern!r}: port {port} out of range", line, host=pattern, field="ansible_port"
        )
    return names, port


# --------------------------------------------------------------------------------------------
# Parsers


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


_UNDECODABLE = re.compile("[\udc80-\udcff]")


def _check_utf8(lines: Iterable[str], path: str, first: int = 1) -> None:
    for lineno, line in enumerate(lines, start=first):
        if _UNDECODABLE.search(line):
            raise InventoryError("not valid UTF-8", path=path, line=lineno)


# ---- YAML


class _Map(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers its line and each key's line."""

    line: int | None = None
    lines: dict[Any, int]


class _Vault(str):
    """A ``!vault`` value: kept opaque; refused if fleetctl would need to use it."""

    __slots__ = ()


class _Unsafe(str):
    """A ``!unsafe`` value: Ansible never templates it, so ``{{`` in it is literal text."""

    __slots__ = ()


class _YamlError(Exception):
    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


_BaseLoader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """SafeLoader (YAML 1.1, like Ansible's) that records line numbers and refuses duplicate
    keys, which PyYAML would otherwise drop silently."""


def _construct_mapping(loader: Any, node: yaml.MappingNode) -> _Map:
    explicit = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
    loader.flatten_mapping(node)
    merged = len(node.value) - explicit  # `<<:` keys come first; explicit keys may override
    result = _Map()
    result.line = node.start_mark.line + 1
    result.lines = {}
    own: dict[Any, int] = {}
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        kline = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError as e:
            raise _YamlError(f"unhashable mapping key {key!r}", kline) from e
        if i >= merged:
            if key in own:
                raise _YamlError(f"duplicate key {key!r} (first at line {own[key]})", kline)
            own[key] = kline
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = kline
    return result


def _construct_unsafe(loader: Any, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return _Unsafe(loader.construct_scalar(node))
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return _construct_mapping(loader, node)  # type: ignore[arg-type]


def _construct_vault(loader: Any, node: yaml.Node) -> _Vault:
    return _Vault(loader.construct_scalar(node))


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor("!unsafe", _construct_unsafe)
_Loader.add_constructor("!vault", _construct_vault)
_Loader.add_constructor("!vault-encrypted", _construct_vault)


def _read_yaml(text: str, path: str) -> Any:
    """Parse YAML; any problem becomes an InventoryError at ``path:line``."""
    try:
        return _load_yaml(text)
    except _YamlError as e:
        raise InventoryError(str(e), path=path, line=e.line) from e
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        what = " ".join(str(e.problem or e.context or "malformed YAML").split())
        line = mark.line + 1 if mark else None
        raise InventoryError(f"malformed YAML: {what}", path=path, line=line) from e
    except yaml.YAMLError as e:
        raise InventoryError(f"malformed YAML: {' '.join(str(e).split())}", path=path) from e


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


def _parse_yaml(text: str, path: str) -> _Model:
    model = _Model(path)
    data = _read_yaml(text, path)
    if data is None or data == {}:
        raise model.error("inventory is empty", None)
    if not isinstance(data, _Map):
        raise model.error(
            f"YAML inventory must be a mapping of groups (like 'all:'), got {type(data).__name__}",
            1,
        )
    if data.get("plugin"):
        raise model.error(
            "this is an inventory plugin configuration, not a YAML inventory",
            data.lines.get("plugin"),
        )
    for name, body in data.items():
        _yaml_group(model, name, body, data.lines.get(name))
    return model


def _yaml_group(model: _Model, name: Any, body: Any, line: int | None) -> str:
    if body is not None and not isinstance(body, _Map):
        raise model.error(
            f"group {name!r} must be a mapping of hosts/vars/children, got {type(body).__name__}",
            line,
        )
    group = model.add_group(name, line)
    if body is None:
        return group
    for section in ("hosts", "vars", "children"):
        value = body.get(section)
        if isinstance(value, str):  # Ansible accepts `hosts: gpu01` as one host without vars
            only, sline = value, body.lines.get(section)
            body[section] = value = _Map({only: None})
            value.line, value.lines = sline, {only: sline}
        if value is not None and not isinstance(value, _Map):
            raise model.error(
                f"group {group}: '{section}' must be a mapping, got {type(value).__name__}",
                body.lines.get(section),
                field=section,
            )
    for key, value in body.items():
        kline = body.lines.get(key)
        if key not in ("hosts", "vars", "children"):
            raise model.error(
                f"group {group}: unexpected key {key!r} (only hosts, vars, children)",
                kline,
                field=str(key),
            )
        if value is None:
            continue
        if key == "vars":
            for var, val in value.items():
                model.set_group_var(group, var, val, value.lines.get(var))
        elif key == "children":
            for child, child_body in value.items():
                cline = value.lines.get(child)
                child_name = _yaml_group(model, child, child_body, cline)
                model.add_child(group, child_name, cline)
        else:
            for pattern, host_vars in value.items():
                hline = value.lines.get(pattern)
                if not isinstance(pattern, str):
                    raise model.error(
                        f"group {group}: host {pattern!r} must be a string (quote numbers)",
                        hline,
                        host=str(pattern),
                    )
                if host_vars is not None and not isinstance(host_vars, _Map):
                    raise model.error(
                        f"host {pattern}: vars must be a mapping, got {type(host_vars).__name__}",
                        hline,
                        host=pattern,
                    )
                names, port = _expand_hostpattern(model, pattern, hline)
                for hname in names:
                    model.add_host(hname, group, port, hline)
                    for var, val in (host_vars or {}).items():
                        model.set_host_var(hname, var, val, host_vars.lines.get(var))
    return group


# ---- INI

_SECTION_RE = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUPNAME_RE = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")


def _ini_value(text: str) -> Any:
    """Type a value the way Ansible's INI plugin does: a Python literal if it is one, else str.

    ``8`` -> 8, ``True`` -> True (``true``/``yes`` stay strings), ``"8"`` -> '8' (in
    ``:vars``; inline host vars lose one level of quotes to shell-style splitting first).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return _ini_plain(value)


def _ini_plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, (list, tuple, set)):
        return [_ini_plain(v) for v in value]
    if isinstance(value, dict):
        return {_ini_plain(k): _ini_plain(v) for k, v in value.items()}
    if value is ... or isinstance(value, complex):
        return str(value) if value is not ... else "..."
    return value


def _parse_ini(text: str, path: str) -> _Model:
    model = _Model(path)
    pending: dict[str, dict[str, Any]] = {}
    group, state = "ungrouped", "hosts"

    def add_pending_children(name: str) -> None:
        for parent in pending[name]["parents"]:
            model.add_child(parent, name, pending[name]["line"])
            if parent in pending and pending[parent]["state"] == "children":
                add_pending_children(parent)
        del pending[name]

    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        _check_utf8([line], path, first=lineno)
        m = _SECTION_RE.match(line)
        if m:
            group, state = m.group(1), m.group(2) or "hosts"
            if state not in ("hosts", "children", "vars"):
                raise model.error(f"section [{group}:{state}] has unknown type {state!r}", lineno)
            if group not in model.groups:
                if state == "vars" and group not in pending:
                    pending[group] = {"line": lineno, "state": state, "name": group}
                model.add_group(group, lineno)
            elif model.groups[group].line is None and group not in ("all", "ungrouped"):
                model.groups[group].line = lineno
            if group in pending and state != "vars":
                if pending[group]["state"] == "children":
                    add_pending_children(group)
                elif pending[group]["state"] == "vars":
                    del pending[group]
            continue
        if line.startswith("[") and line.endswith("]"):
            raise model.error(f"invalid section header {line!r} (no spaces allowed)", lineno)

        if state == "hosts":
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as e:
                raise model.error(f"cannot parse host line: {e}", lineno) from e
            if not tokens:
                continue
            pattern = tokens[0]
            if pattern.endswith(":") or pattern == "---":
                why = "'---' starts YAML, not INI" if pattern == "---" else "empty port after ':'"
                raise model.error(f"invalid host {pattern!r}: {why}", lineno, host=pattern)
            names, port = _expand_hostpattern(model, pattern, lineno)
            host_vars: dict[str, Any] = {}
            for tok in tokens[1:]:
                if "=" not in tok:
                    raise model.error(
                        f"host {pattern}: expected key=value, got {tok!r}", lineno, host=pattern
                    )
                k, v = tok.split("=", 1)
                host_vars[k] = _ini_value(v)
            for name in names:
                model.add_host(name, group, port, lineno)
                for k, v in host_vars.items():
                    model.set_host_var(name, k, v, lineno)
        elif state == "vars":
            if "=" not in line:
                raise model.error(f"[{group}:vars]: expected key=value, got {line!r}", lineno)
            k, v = (part.strip() for part in line.split("=", 1))
            model.set_group_var(group, k, _ini_value(v), lineno)
        else:
            m = _GROUPNAME_RE.match(line)
            if not m:
                raise model.error(
                    f"[{group}:children]: expected a group name, got {line!r}", lineno
                )
            child = m.group(1)
            if child not in model.groups:
                if child not in pending:
                    pending[child] = {
                        "line": lineno,
                        "state": "children",
                        "name": child,
                        "parents": [group],
                    }
                else:
                    pending[child].setdefault("parents", []).append(group)
            else:
                model.add_child(group, child, lineno)

    for decl in pending.values():
        if decl["state"] == "vars":
            raise model.error(
                f"section [{decl['name']}:vars] is for undefined group {decl['name']!r}",
                decl["line"],
            )
        raise model.error(
            f"section [{decl['parents'][-1]}:children] names undefined group {decl['name']!r}",
            decl["line"],
        )
    return model


# ---- group_vars/ and host_vars/ next to the inventory file (Ansible's host_group_vars plugin)

_VARS_EXTENSIONS = ("", ".yml", ".yaml", ".json")


def _load_adjacent_vars(model: _Model, inventory: Path) -> list[tuple[str, bytes]]:
    """Fill ``dir_vars`` of groups and hosts from ``group_vars/`` and ``host_vars/`` beside the
    inventory, as Ansible does by default. Returns (file, content) pairs for the digest.

    Vault-encrypted vars files are skipped (fleetctl has no vault password); a value fleetctl
    needs must not live only in one.
    """
    base = Path(os.path.realpath(os.path.dirname(os.path.abspath(inventory))))
    shown_base = Path(model.path).parent
    loaded: list[tuple[str, bytes]] = []
    entities: list[tuple[str, Iterable[_Group | _Host]]] = [
        ("group_vars", model.groups.values()),
        ("host_vars", model.hosts.values()),
    ]
    for subdir, items in entities:
        root = base / subdir
        if not root.is_dir():
            continue
        for entity in items:
            if entity.name.startswith("/"):
                continue
            for file in _find_vars_files(root, entity.name):
                shown = str(shown_base / subdir / file.relative_to(root))
                data, content = _load_vars_file(file, shown)
                loaded.append((shown, content))
                for key, value in data.items():
                    entity.dir_vars[model._var_name(key, data.lines.get(key))] = value
                    entity.dir_src[key] = (shown, data.lines.get(key))
    return loaded


def _find_vars_files(root: Path, name: str) -> list[Path]:
    """``root/name`` (a file, or a folder read recursively in sorted order), else the first
    of ``name.yml``, ``name.yaml``, ``name.json``."""
    for ext in _VARS_EXTENSIONS:
        candidate = root / (name + ext)
        if candidate.is_dir():
            return _dir_vars_files(candidate)
        if candidate.exists():
            return [candidate]
    return []


def _dir_vars_files(folder: Path) -> list[Path]:
    found: list[Path] = []
    for entry in sorted(os.listdir(folder)):
        if entry.startswith(".") or entry.endswith("~"):
            continue
        path, ext = folder / entry, os.path.splitext(entry)[1]
        if path.is_dir() and not ext:
            found.extend(_dir_vars_files(path))
        elif path.is_file() and ext in _VARS_EXTENSIONS:
            found.append(path)
    return found


def _load_vars_file(file: Path, shown: str) -> tuple[_Map, bytes]:
    try:
        content = file.read_bytes()
    except OSError as e:
        raise InventoryError(f"cannot read vars file: {e.strerror or e}", path=shown) from e
    empty = _Map()
    empty.lines = {}
    if content.startswith(b"$ANSIBLE_VAULT"):
        return empty, content
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InventoryError("not valid UTF-8", path=shown) from e
    data = _read_yaml(text, shown)
    if data is None:
        return empty, content
    if not isinstance(data, _Map):
        raise InventoryError(
            f"vars file must be a mapping of name: value, got {type(data).__name__}",
            path=shown,
            line=1,
        )
    return data, content


# --------------------------------------------------------------------------------------------
# Patterns (--limit and the selected group)


def _split_host_pattern(pattern: str) -> list[str]:
    """Ansible's split_host_pattern: commas; else colons unless it is one host[:port]/IPv6."""
    if "," in pattern:
        parts = pattern.split(",")
    elif _parse_address(pattern.strip()) is not None:
        parts = [pattern]
    else:
        parts = re.findall(r"(?:[^\s:\[\]]|\[[^\]]*\])+", pattern)
    return [p.strip() for p in parts if p.strip()]


def _split_limit(limit: str, path: str) -> list[str]:
    out: list[str] = []
    for part in _split_host_pattern(limit):
        if part.startswith("@"):
            try:
                lines = Path(part[1:]).read_text().splitlines()
            except OSError as e:
                raise InventoryError(
                    f"--limit {part}: cannot read limit file: {e.strerror or e}",
                    path=path,
                    field="limit",
                ) from e
            out.extend(s.strip() for s in lines if s.strip())
        else:
            out.append(part)
    return out


_SUBSCRIPT_RE = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")


def _evaluate(model: _Model, patterns: list[str], what: str) -> list[_Host]:
    """Ansible's _evaluate_patterns: unions in order, then ``&`` intersections, then ``!``."""
    regular = [p for p in patterns if p and p[0] not in "!&"]
    inter = [p for p in patterns if p and p[0] == "&"]
    exclude = [p for p in patterns if p and p[0] == "!"]
    if not regular:
        regular = ["all"]
    hosts: list[_Host] = []
    for p in regular + inter + exclude:
        if p in model.hosts:
            if p not in {h.name for h in hosts}:
                hosts.append(model.hosts[p])
            continue
        that = _match_one(model, p, what)
        if p[0] == "!":
            names = {h.name for h in that}
            hosts = [h for h in hosts if h.name not in names]
        elif p[0] == "&":
            names = {h.name for h in that}
            hosts = [h for h in hosts if h.name in names]
        else:
            if not that:
                raise InventoryError(
                    f"{what} pattern {p!r} matches no hosts "
                    f"(hosts: {_preview(model.hosts)}; groups: {_preview(model.groups)})",
                    path=model.path,
                    field="limit" if what == "--limit" else "group",
                )
            have = {h.name for h in hosts}
            for h in that:
                if h.name not in have:
                    have.add(h.name)
                    hosts.append(h)
    return hosts


def _match_one(model: _Model, pattern: str, what: str) -> list[_Host]:
    if pattern[0] in "!&":
        pattern = pattern[1:]
    if not pattern:
        raise InventoryError(
            f"{what}: empty pattern after '!' or '&'", path=model.path, field="limit"
        )
    subscript: tuple[int, int | None] | None = None
    if pattern[0] != "~":
        m = _SUBSCRIPT_RE.match(pattern)
        if m:  # `group[0]`, `group[1:3]`, `group[2:]` (inclusive, like Ansible)
            pattern, idx, start, _sep, end = m.groups()
            subscript = (int(idx), None) if idx else (int(start), int(end) if end else -1)
    try:
        rx = (
            re.compile(pattern[1:]) if pattern[0] == "~" else re.compile(fnmatch.translate(pattern))
        )
    except re.error as e:
        raise InventoryError(
            f"{what}: invalid pattern {pattern!r}: {e}", path=model.path, field="limit"
        ) from e
    results: list[_Host] = []
    groups = [g for name, g in model.groups.items() if rx.match(name)]
    for g in groups:
        results.extend(_group_hosts(g))
    if not groups or pattern[0] == "~" or any(c in pattern for c in ".?*["):
        results.extend(h for name, h in model.hosts.items() if rx.match(name))
    if subscript and results:  # Ansible subscripts the raw matches, then de-duplicates
        start_i, end_i = subscript
        if end_i:
            results = results[start_i : (len(results) - 1 if end_i == -1 else end_i) + 1]
        else:
            try:
                results = [results[start_i]]
            except IndexError as e:
                raise InventoryError(
                    f"{what}: subscript out of range in {pattern!r}", path=model.path, field="limit"
                ) from e
    unique: list[_Host] = []
    seen: set[str] = set()
    for h in results:
        if h.name not in seen:
            seen.add(h.name)
            unique.append(h)
    return unique


def _preview(names: Iterable[str], limit: int = 8) -> str:
    items = list(names)
    shown = ", ".join(items[:limit])
    return shown + (f", … ({len(items)} in all)" if len(items) > limit else "")


# --------------------------------------------------------------------------------------------
# Vars -> Node


def _effective_vars(model: _Model, host: _Host) -> tuple[dict[str, Any], dict[str, _Origin]]:
    """Ansible's order, lowest first: inventory-file vars of ``all``, of the host's other groups
    sorted by (depth, priority, name); then ``group_vars/all``, ``group_vars/<group>`` in the
    same order; then the host's inventory-file vars, then ``host_vars/<host>``. Returns the
    values and the (file, line) each winning value came from."""
    all_g = model.groups["all"]
    groups = sorted(
        (g for g in model.host_groups(host) if g is not all_g),
        key=lambda g: (g.depth, g.priority, g.name),
    )
    layers = [(all_g.vars, all_g.var_src)] + [(g.vars, g.var_src) for g in groups]
    layers += [(all_g.dir_vars, all_g.dir_src)] + [(g.dir_vars, g.dir_src) for g in groups]
    layers += [(host.vars, host.var_src), (host.dir_vars, host.dir_src)]
    values: dict[str, Any] = {}
    origins: dict[str, _Origin] = {}
    for layer_vars, layer_src in layers:
        values.update(layer_vars)
        origins.update(layer_src)
    return values, origins


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, _Vault):
        return "<vault>"
    if isinstance(value, str):
        return str(value)  # plain str, not our YAML marker subclasses
    return value


class _Fields:
    """Reads one host's mapped vars, raising errors that name host, field and line."""

    def __init__(self, model: _Model, host: _Host) -> None:
        self.model, self.host = model, host
        self.values, self.origins = _effective_vars(model, host)

    def where(self, key: str | None) -> _Origin:
        """File and line that set ``key`` (else where the host was declared)."""
        path, line = self.origins.get(key, (None, None)) if key else (None, None)
        if path is None or (path == self.model.path and line is None):
            return self.model.path, self.host.line
        return path, line

    def fail(self, key: str | None, message: str) -> InventoryError:
        path, line = self.where(key)
        return InventoryError(
            f"host {self.host.name}: {message}",
            path=path,
            line=line,
            host=self.host.name,
            field=key,
        )

    def get(self, *keys: str) -> tuple[str | None, Any]:
        for k in keys:
            if k in self.values:
                return k, self.values[k]
        return None, None

    def text(self, *keys: str, default: str | None = None, required: bool = False) -> str | None:
        key, value = self.get(*keys)
        if key is None:
            return default
        if isinstance(value, _Vault):
            raise self.fail(key, f"{key} is vault-encrypted; fleetctl cannot decrypt it")
        if value is None or value == "":
            if required:
                raise self.fail(key, f"{key} is empty")
            return default
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise self.fail(key, f"{key} must be a string, got {type(value).__name__} {value!r}")
        if not isinstance(value, _Unsafe) and ("{{" in str(value) or "{%" in str(value)):
            raise self.fail(
                key,
                f"{key}={value!r} is a Jinja template; fleetctl does not "
                "template inventory values, write the value out",
            )
        return str(value)

    def integer(self, key: str, lo: int, hi: int | None, what: str) -> int | None:
        k, value = self.get(key)
        if k is None or value is None:
            return None
        ok = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
            value, ok = int(value), True
        if not ok or value < lo or (hi is not None and value > hi):
            raise self.fail(key, f"{key} must be {what}, got {value!r}")
        return value


def _build_node(model: _Model, host: _Host) -> Node:
    """Map one host's effective vars to a Node, validating the fields fleetctl uses."""
    name = host.name
    f = _Fields(model, host)
    conn = f.text("ansible_connection", default="ssh") or "ssh"
    local = conn.removeprefix("ansible.builtin.") == "local"
    if not local and conn.removeprefix("ansible.builtin.") not in SSH_CONNECTIONS:
        raise f.fail(
            "ansible_connection", f"ansible_connection {conn!r} is not supported (use ssh or local)"
        )
    addr_key, _ = f.get("ansible_host", "ansible_ssh_host")
    address = f.text("ansible_host", "ansible_ssh_host", default=name, required=True) or name
    if not local and not _is_dialable(address):
        if addr_key:
            msg = f"{addr_key} {address!r} is not a valid host name or IP address"
        else:
            msg = f"no ansible_host, and the name {address!r} is not a valid host name or IP"
        raise f.fail(addr_key, msg)
    port_key = "ansible_port" if "ansible_port" in f.values else "ansible_ssh_port"
    port = f.integer(port_key, 1, 65535, "a port number 1-65535")
    return Node(
        name=name,
        address=address,
        port=port if port is not None else 22,
        user=f.text("ansible_user", "ansible_ssh_user"),
        key_file=f.text("ansible_ssh_private_key_file", "ansible_private_key_file"),
        nic=f.text("fleetctl_nic"),
        train_addr=f.text("fleetctl_addr"),
        gpus=f.integer("fleetctl_gpus", 0, None, "a non-negative integer"),
        workdir=f.text("fleetctl_workdir", default=DEFAULT_WORKDIR) or DEFAULT_WORKDIR,
        python=f.text("fleetctl_python", default=DEFAULT_PYTHON) or DEFAULT_PYTHON,
        env=_env(f),
        env_archive=f.text("fleetctl_env_archive"),
        known_hosts=f.text("fleetctl_known_hosts"),
        ssh_config=f.text("fleetctl_ssh_config"),
        local=local,
        groups=tuple(sorted(g.name for g in model.host_groups(host) if g.name != "all")),
        vars=_plain(f.values),
        source=f"{model.path}:{host.line}" if host.line else model.path,
    )


def _is_dialable(address: str) -> bool:
    parsed = _parse_address(address)
    return parsed is not None and parsed[1] is None and "[" not in address


def _env(f: _Fields) -> dict[str, str]:
    key, value = f.get("fleetctl_env")
    if key is None or value is None:
        return {}
    if not isinstance(value, Mapping):
        raise f.fail(key, f"fleetctl_env must be a mapping of NAME: value, got {value!r}")
    env: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise f.fail(key, f"fleetctl_env: {k!r} is not a valid environment variable name")
        if isinstance(v, _Vault):
            raise f.fail(key, f"fleetctl_env.{k} is vault-encrypted; fleetctl cannot decrypt it")
        if isinstance(v, bool):
            env[k] = "true" if v else "false"
        elif v is None:
            env[k] = ""
        elif isinstance(v, (str, int, float)):
            env[k] = str(v)
        else:
            raise f.fail(key, f"fleetctl_env.{k} must be a scalar, got {type(v).__name__}")
    return env


def _check_duplicates(nodes: tuple[Node, ...], model: _Model) -> None:
    """Two remote hosts dialing the same address:port are one box counted twice."""
    seen: dict[tuple[str, int], Node] = {}
    for node in nodes:
        if node.local:
            continue
        key = (_canonical(node.address), node.port)
        other = seen.get(key)
        if other is not None:
            fields = _Fields(model, model.hosts[node.name])
            raise fields.fail(
                "ansible_host" if "ansible_host" in fields.values else None,
                f"address {node.address} port {node.port} is already host "
                f"{other.name}'s ({other.source}); one machine listed twice?",
            )
        seen[key] = node


def _canonical(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower().rstrip(".")
