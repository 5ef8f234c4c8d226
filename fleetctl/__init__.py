"""fleetctl: run distributed training jobs on your own GPU boxes over SSH.

The library (docs/api.md)::

    from fleetctl import Fleet
    fleet = Fleet.from_inventory("hosts.yml")
    result = fleet.run("train.py", "--epochs", "2", launcher="plain").wait()

The names in ``__all__`` are the stable API; they load on first use (module ``__getattr__``),
so ``import fleetctl`` and ``fleetctl --version`` import nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = {
    "Fleet": "fleetctl.api",
    "Job": "fleetctl.api",
    "RunResult": "fleetctl.api",
    "FirstFailure": "fleetctl.api",
    "LogLine": "fleetctl.api",
    "runs": "fleetctl.api",
    "RunRecord": "fleetctl.job.records.runs",
    "JobRecord": "fleetctl.job.records.jobrecord",
    "JobEvent": "fleetctl.job.records.result",
    "Node": "fleetctl.node",
    "CheckReport": "fleetctl.phases.check.report",
    "PushReport": "fleetctl.phases.push.report",
    "FleetctlError": "fleetctl.errors",
    "UsageError": "fleetctl.errors",
    "InventoryError": "fleetctl.errors",
    "ConnectError": "fleetctl.errors",
    "HostKeyError": "fleetctl.errors",
    "CheckError": "fleetctl.errors",
    "PushError": "fleetctl.errors",
    "FleetError": "fleetctl.errors",
    "JobFailed": "fleetctl.errors",
    "Interrupted": "fleetctl.errors",
}

__all__ = ["__version__", *sorted(_API)]

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ loads them
    from fleetctl.api import FirstFailure as FirstFailure
    from fleetctl.api import Fleet as Fleet
    from fleetctl.api import Job as Job
    from fleetctl.api import LogLine as LogLine
    from fleetctl.api import RunResult as RunResult
    from fleetctl.api import runs as runs
    from fleetctl.errors import CheckError as CheckError
    from fleetctl.errors import ConnectError as ConnectError
    from fleetctl.errors import FleetctlError as FleetctlError
    from fleetctl.errors import FleetError as FleetError
    from fleetctl.errors import HostKeyError as HostKeyError
    from fleetctl.errors import Interrupted as Interrupted
    from fleetctl.errors import InventoryError as InventoryError
    from fleetctl.errors import JobFailed as JobFailed
    from fleetctl.errors import PushError as PushError
    from fleetctl.errors import UsageError as UsageError
    from fleetctl.job.records.jobrecord import JobRecord as JobRecord
    from fleetctl.job.records.result import JobEvent as JobEvent
    from fleetctl.job.records.runs import RunRecord as RunRecord
    from fleetctl.node import Node as Node
    from fleetctl.phases.check.report import CheckReport as CheckReport
    from fleetctl.phases.push.report import PushReport as PushReport


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        if name == "tasks":  # `fleetctl.tasks`, the invoke Collection (imports invoke)
            import importlib

            return importlib.import_module("fleetctl.tasks")
        raise AttributeError(f"module 'fleetctl' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
