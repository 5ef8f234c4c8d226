"""The YAML inventory source: a SafeLoader that keeps line numbers and refuses duplicate
keys, and the ``all:`` -> ``hosts``/``vars``/``children`` walk."""

from __future__ import annotations

from typing import Any

import yaml

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory.model import _Model
from fleetctl.plan.inventory.ranges import _expand_hostpattern
from fleetctl.plan.userinput import YamlTooBig, check_yaml_size


class _Map(dict[Any, Any]):
    """A YAML mapping that remembers its line and each key's line."""

    line: int | None = None
    lines: dict[Any, int | None]


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


class _Loader(_BaseLoader):
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
    loader = _Loader(text)  # a SafeLoader subclass: no arbitrary objects
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            check_yaml_size(node)  # the alias-bomb guard job files share
        except YamlTooBig as e:
            raise _YamlError(str(e), e.line) from e
        return loader.construct_document(node)
    finally:
        loader.dispose()


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
                    if host_vars is None:
                        continue
                    for var, val in host_vars.items():
                        model.set_host_var(hname, var, val, host_vars.lines.get(var))
    return group
