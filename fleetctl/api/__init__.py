"""fleetctl as a library: the fleet, its jobs, their results (see docs/api.md).

``from fleetctl import Fleet`` is the way in; these names are also ``fleetctl.__all__``. Only
what is listed here is stable; everything else under ``fleetctl`` is internal. Nothing here
prints: progress arrives through an ``on_event`` callback, failures as ``FleetctlError``
subclasses. Importing this package is cheap: SSH, the job core and fabric load when used.
"""

from __future__ import annotations

from fleetctl.api.fleet import Fleet
from fleetctl.api.job import Job
from fleetctl.api.result import FirstFailure, LogLine, RunResult
from fleetctl.api.runs import runs

__all__ = ["FirstFailure", "Fleet", "Job", "LogLine", "RunResult", "runs"]
