"""Variables: ``group_vars/`` and ``host_vars/`` beside the inventory file (Ansible's
host_group_vars plugin), and the precedence that merges them with the file's own vars."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory.yaml_source import _Map, _read_yaml
from fleetctl.plan.userinput import read_user_file

if TYPE_CHECKING:
    from fleetctl.plan.inventory.model import _Group, _Host, _Model, _Origin

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
    content = read_user_file(file, "vars file", lambda msg: InventoryError(msg, path=shown))
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
