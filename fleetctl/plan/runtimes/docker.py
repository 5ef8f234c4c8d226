"""docker: podman's argv (the CLIs agree on every flag used) with ``--gpus all``.

Untested here: docker is not installed on the CI machines; only the golden argv is checked."""

from __future__ import annotations

from fleetctl.plan.runtimes.podman import Podman


class Docker(Podman):
    name = "docker"
    gpu_flags = ("--gpus", "all")


DOCKER = Docker()
