"""The namespace lab: real SSH hosts in Linux namespaces on this machine (needs root).

``Lab.up(3, networks=2, gpus=2)`` gives three hosts with their own sshd, hostname, workdir and
network stack; ``lab.down()`` removes everything. See docs/lab.md.
"""

from __future__ import annotations

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab.constants import DEFAULT_PARENT, WORKDIR
from fleetctl.lab.core import Lab, require_root
from fleetctl.lab.hosts import LabHost

__all__ = [
    "DEFAULT_PARENT",
    "WORKDIR",
    "Lab",
    "LabError",
    "LabHost",
    "LabInputError",
    "require_root",
]
