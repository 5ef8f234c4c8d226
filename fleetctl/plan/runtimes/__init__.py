"""Container runtimes: the argv that runs one node's launcher inside an image, and the argv
that finds, stops and removes the job's containers by label (one module per runtime).

Pure: nothing here touches the network. The launch puts these argv in the supervisor's spec;
the supervisor runs them as given (node code is stdlib only and cannot import this package).
podman and docker are tested end to end (tests/lab/test_containers*.py); apptainer only as
golden argv (``tests/pure/test_runtimes.py``).
"""

from __future__ import annotations

from fleetctl.errors import UsageError
from fleetctl.plan.runtimes.base import LABEL_JOB, LABEL_RANK, ContainerSpec, Runtime

ORDER = ("podman", "docker", "apptainer")  # the first found on a node, when none is named


def runtime(name: str) -> Runtime:
    """The runtime called ``name`` (``--container-runtime``, ``fleetctl_container_runtime``)."""
    if name == "podman":
        from fleetctl.plan.runtimes.podman import PODMAN

        return PODMAN
    if name == "docker":
        from fleetctl.plan.runtimes.docker import DOCKER

        return DOCKER
    if name == "apptainer":
        from fleetctl.plan.runtimes.apptainer import APPTAINER

        return APPTAINER
    raise UsageError(f"unknown container runtime {name!r} (known: {', '.join(ORDER)})")


__all__ = [
    "LABEL_JOB",
    "LABEL_RANK",
    "ORDER",
    "ContainerSpec",
    "Runtime",
    "runtime",
]
