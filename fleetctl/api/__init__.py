"""fleetctl as a library: the fleet, its jobs, their results (see docs/api.md).

``from fleetctl import Fleet`` is the way in; these names are also ``fleetctl.__all__``. Only
what is listed here is stable; everything else under ``fleetctl`` is internal. Nothing here
prints: progress arrives through an ``on_event`` callback, failures as ``FleetctlError``
subclasses. Importing this package is cheap: each name loads its module on first use (module
``__getattr__``), so ``fleetctl exec`` pulls only ``Fleet``; SSH, the job core and fabric
load when a call needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Loaded now: the function shares its module's name, and a later ``import fleetctl.api.runs``
# would otherwise leave the module where the function belongs (it costs only pathlib).
from fleetctl.api.runs import runs

_NAMES = {
    "Fleet": "fleetctl.api.fleet",
    "Job": "fleetctl.api.job",
    "FirstFailure": "fleetctl.api.result",
    "LogLine": "fleetctl.api.result",
    "RunResult": "fleetctl.api.result",
}

__all__ = ["FirstFailure", "Fleet", "Job", "LogLine", "RunResult", "runs"]

if TYPE_CHECKING:
    from fleetctl.api.fleet import Fleet as Fleet
    from fleetctl.api.job import Job as Job
    from fleetctl.api.result import FirstFailure as FirstFailure
    from fleetctl.api.result import LogLine as LogLine
    from fleetctl.api.result import RunResult as RunResult


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetctl.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
