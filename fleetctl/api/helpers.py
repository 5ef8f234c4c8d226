"""What the commands' option parsers and renderers share with the library: its limits,
sizes in words, the check table's columns, an inventory's selection. Each name loads its
module on first use (module ``__getattr__``), so an option parser pays only for what it
reads."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    # limits of user input (a year of seconds, a million of anything), the default fan-out
    "MAX_COUNT": ("fleetctl.plan.userinput", "MAX_COUNT"),
    "MAX_SECONDS": ("fleetctl.plan.userinput", "MAX_SECONDS"),
    "DEFAULT_FANOUT": ("fleetctl.api.fleet", "DEFAULT_FANOUT"),
    # inventories: a file's selection, or this machine
    "load_inventory": ("fleetctl.plan.inventory", "load_inventory"),
    "local_inventory": ("fleetctl.plan.inventory", "local_inventory"),
    # sizes and the collection's words
    "human_bytes": ("fleetctl.phases.envpack", "human_bytes"),
    "format_size": ("fleetctl.phases.collect", "format_size"),
    "parse_size": ("fleetctl.phases.collect", "parse_size"),
    "not_collected_line": ("fleetctl.phases.collect", "not_collected_line"),
    "INCOMPLETE_REASONS": ("fleetctl.phases.collect", "INCOMPLETE_REASONS"),
    "STREAMED_CONSOLE": ("fleetctl.job.records.runfolder", "STREAMED_CONSOLE"),
    "MiB": ("fleetctl.phases.check.collective_judge", "MiB"),
    # the check table's columns, a plan's shared argv positions, a failed rank in words
    "CHECKS": ("fleetctl.phases.check.report", "CHECKS"),
    "PROBE_TIMEOUT": ("fleetctl.plan.userinput", "PROBE_TIMEOUT"),
    "PROBE_TIMEOUT_MAX": ("fleetctl.plan.userinput", "PROBE_TIMEOUT_MAX"),
    "shared_positions": ("fleetctl.plan.shared", "shared_positions"),
    "describe_rank": ("fleetctl.job.diagnose.ranks", "describe"),
}

__all__ = sorted(_NAMES)

if TYPE_CHECKING:
    from fleetctl.api.fleet import DEFAULT_FANOUT as DEFAULT_FANOUT
    from fleetctl.job.records.runfolder import STREAMED_CONSOLE as STREAMED_CONSOLE
    from fleetctl.phases.check.collective_judge import MiB as MiB
    from fleetctl.phases.check.report import CHECKS as CHECKS
    from fleetctl.phases.collect import INCOMPLETE_REASONS as INCOMPLETE_REASONS
    from fleetctl.phases.collect import format_size as format_size
    from fleetctl.phases.collect import not_collected_line as not_collected_line
    from fleetctl.phases.collect import parse_size as parse_size
    from fleetctl.phases.envpack import human_bytes as human_bytes
    from fleetctl.plan.inventory import load_inventory as load_inventory
    from fleetctl.plan.inventory import local_inventory as local_inventory
    from fleetctl.plan.shared import shared_positions as shared_positions
    from fleetctl.plan.userinput import MAX_COUNT as MAX_COUNT
    from fleetctl.plan.userinput import MAX_SECONDS as MAX_SECONDS
    from fleetctl.plan.userinput import PROBE_TIMEOUT as PROBE_TIMEOUT
    from fleetctl.plan.userinput import PROBE_TIMEOUT_MAX as PROBE_TIMEOUT_MAX


def __getattr__(name: str) -> Any:
    where = _NAMES.get(name)
    if where is None:
        raise AttributeError(f"module 'fleetctl.api.helpers' has no attribute {name!r}")
    value = getattr(importlib.import_module(where[0]), where[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
