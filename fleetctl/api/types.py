"""The types the API's calls take and return, by one public path: what a caller annotates
with and what the CLI's renderers read (``tests/pure/test_cli_layering.py`` holds ``cli/`` to
this path). Each name loads its module on first use (module ``__getattr__``): importing this
module costs nothing, and no name here connects anywhere.

Stable for reading (their attributes and ``to_dict()``); build them through the API."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    # exec, check, push
    "ExecResult": "fleetctl.ssh.execute",
    "NodeRun": "fleetctl.ssh.execute",
    "CheckReport": "fleetctl.phases.check.report",
    "PushEvent": "fleetctl.phases.push.report",
    "PushReport": "fleetctl.phases.push.report",
    "CollectiveOptions": "fleetctl.plan.collective",
    "CollectiveReport": "fleetctl.phases.check.collective_judge",
    # a run: its plan, events, result, collection, monitor, stacks
    "Plan": "fleetctl.plan.rankplan",
    "JobEvent": "fleetctl.job.records.result",
    "EventKind": "fleetctl.job.records.result",
    "JobPhase": "fleetctl.job.records.result",
    "JobResult": "fleetctl.job.records.result",
    "NodeOutcome": "fleetctl.job.records.result",
    "NodeCollect": "fleetctl.phases.collect",
    "CollectOptions": "fleetctl.phases.collect",
    "SpawnedMonitor": "fleetctl.job.monitor.process",
    "StackGroup": "fleetctl.job.diagnose.stacks",
    # Slurm, inventories, SSH settings
    "SlurmEvent": "fleetctl.slurm.submit",
    "Inventory": "fleetctl.plan.inventory",
    "SSHSettings": "fleetctl.transport.connection",
}

__all__ = sorted(_NAMES)

if TYPE_CHECKING:
    from fleetctl.api.lifecycle import CollectReport, StatusReport, StopReport
    from fleetctl.api.result import RunResult
    from fleetctl.job.diagnose.stacks import StackGroup as StackGroup
    from fleetctl.job.monitor.process import SpawnedMonitor as SpawnedMonitor
    from fleetctl.job.records.result import EventKind as EventKind
    from fleetctl.job.records.result import JobEvent as JobEvent
    from fleetctl.job.records.result import JobPhase as JobPhase
    from fleetctl.job.records.result import JobResult as JobResult
    from fleetctl.job.records.result import NodeOutcome as NodeOutcome
    from fleetctl.phases.check.collective_judge import CollectiveReport as CollectiveReport
    from fleetctl.phases.check.report import CheckReport as CheckReport
    from fleetctl.phases.collect import CollectOptions as CollectOptions
    from fleetctl.phases.collect import NodeCollect as NodeCollect
    from fleetctl.phases.push.report import PushEvent as PushEvent
    from fleetctl.phases.push.report import PushReport as PushReport
    from fleetctl.plan.collective import CollectiveOptions as CollectiveOptions
    from fleetctl.plan.inventory import Inventory as Inventory
    from fleetctl.plan.rankplan import Plan as Plan
    from fleetctl.results import FleetResult, Outcome
    from fleetctl.slurm.submit import SlurmEvent as SlurmEvent
    from fleetctl.ssh.execute import ExecResult as ExecResult
    from fleetctl.ssh.execute import NodeRun as NodeRun
    from fleetctl.transport.connection import SSHSettings as SSHSettings

    def _outcomes(
        e: ExecResult,
        c: CheckReport,
        r: RunResult,
        f: FleetResult[Any],
        st: StatusReport,
        sp: StopReport,
        co: CollectReport,
    ) -> tuple[Outcome, ...]:
        """For mypy only: each result the calls return answers the one result protocol."""
        return (e, c, r, f, st, sp, co)


def __getattr__(name: str) -> Any:
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'fleetctl.api.types' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_NAMES})
