"""The job file's YAML with its lines kept (each mapping and list knows its source line, each
key its own) and the typed readers of one key (string, bounded integer, seconds, argv list, env
mapping) whose errors name ``file:line: key``. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fleetctl.errors import UsageError
from fleetctl.plan.plan_checks import ENV_KEY_RE
from fleetctl.plan.userinput import MAX_COUNT, MAX_SECONDS


class LocatedMap(dict):
    """A YAML mapping that remembers its line and each key's line (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class LocatedList(list):
    line: int = 0
    item_lines: list[int]


def load_located(text: str, path: str) -> Any:
    """YAML → Python values whose mappings/lists know their source lines. Raises UsageError."""
    import yaml

    from fleetctl.plan.userinput import YamlTooBig, check_yaml_size

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        check_yaml_size(root)  # the inventory's alias-bomb guard: conv() below expands aliases
    except YamlTooBig as e:
        raise UsageError(f"{path}:{e.line}: {e}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{path}:{line}: invalid YAML: {problem}") from e
    if root is None:
        raise UsageError(f"{path}:1: job file is empty")
    constructor = yaml.SafeLoader("")

    def conv(node: Any) -> Any:
        if isinstance(node, yaml.MappingNode):
            out = LocatedMap()
            out.line = node.start_mark.line + 1
            out.key_lines = {}
            for k, v in node.value:
                key = conv(k)
                if isinstance(key, (dict, list)):
                    raise UsageError(f"{path}:{k.start_mark.line + 1}: keys must be plain")
                if key in out:
                    raise UsageError(f"{path}:{k.start_mark.line + 1}: duplicate key {key!r}")
                out[key] = conv(v)
                out.key_lines[key] = k.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            lst = LocatedList(conv(v) for v in node.value)
            lst.line = node.start_mark.line + 1
            lst.item_lines = [v.start_mark.line + 1 for v in node.value]
            return lst
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            raise UsageError(f"{path}:{node.start_mark.line + 1}: {e}") from e

    return conv(root)


def get_seconds(
    data: LocatedMap, key: str, at: Any, *, low: float = 1.0, high: float = MAX_SECONDS
) -> float | None:
    """A duration key: a finite number of seconds in ``low..high`` (the command line's
    bounds: ``--timeout``'s a year), or absent."""
    import math

    v = data.get(key)
    if v is None:
        return None
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or not low <= v <= high:
        bounds = f"{low:.10g}..{high:.10g}"
        raise UsageError(f"{at(data, key)}: {key} must be a number of seconds {bounds}")
    return float(v)


def known(keys: Iterable[str]) -> str:
    return ", ".join(sorted(keys))


def get_str(
    m: LocatedMap, key: str, at: Any, *, default: str | None, plain: bool = False
) -> str | None:
    """A non-empty string; ``plain``: a name or path (an image, a script) that reaches an argv
    on the node, so no control character and no leading ``-`` (it would read as a flag)."""
    if key not in m or m[key] is None:
        return default
    v = m[key]
    if not isinstance(v, str) or not v.strip():
        raise UsageError(f"{at(m, key)}: {key} must be a non-empty string")
    if plain and (_CONTROL.search(v.strip()) or v.strip().startswith("-")):
        raise UsageError(
            f"{at(m, key)}: {key} {v!r} must be a plain name (no control character, no leading '-')"
        )
    return v.strip()


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def get_int(
    m: LocatedMap,
    key: str,
    at: Any,
    *,
    default: int | None,
    low: int,
    null_ok: bool,
    high: int = MAX_COUNT,
) -> Any:
    if key not in m:
        return default
    v = m[key]
    if v is None or (null_ok and v == -1):
        if null_ok:
            return None
        raise UsageError(f"{at(m, key)}: {key} must be an integer")
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        raise UsageError(f"{at(m, key)}: {key} must be an integer {low}..{high}, got {v!r}")
    return v


def get_args(m: LocatedMap, key: str, at: Any) -> tuple[str, ...]:
    v = m.get(key)
    if v is None:
        return ()
    if not isinstance(v, list):
        raise UsageError(f"{at(m, key)}: {key} must be a list (each item one argument)")
    for item in v:
        if isinstance(item, (dict, list)):
            raise UsageError(f"{at(m, key)}: {key} items must be plain values")
    return tuple("" if a is None else str(a).lower() if isinstance(a, bool) else str(a) for a in v)


def get_env(m: LocatedMap, key: str, at: Any) -> dict[str, str]:
    v = m.get(key)
    if v is None:
        return {}
    if not isinstance(v, LocatedMap):
        raise UsageError(f"{at(m, key)}: {key} must map NAME: value")
    out: dict[str, str] = {}
    for k, val in v.items():
        where = f"{at(v, k)}"
        if not isinstance(k, str) or not ENV_KEY_RE.match(k):
            raise UsageError(f"{where}: invalid environment variable name {k!r}")
        if k.startswith(("FLEET_", "PAI_")):
            raise UsageError(f"{where}: {k}: FLEET_* and PAI_* are set by fleetctl")
        if isinstance(val, (dict, list)):
            raise UsageError(f"{where}: value of {k} must be a plain value")
        out[k] = "" if val is None else str(val)
    return out
