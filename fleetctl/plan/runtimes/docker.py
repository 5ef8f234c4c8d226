"""docker: podman's argv (the CLIs agree on every flag used) with ``--gpus all``.

Tested end to end with Debian's dockerd 20.10, one per lab host
(tests/lab/test_containers_docker.py): run, label listing, stop, rm and the pid all as podman."""

from __future__ import annotations

from fleetctl.plan.runtimes.podman import Podman


class Docker(Podman):
    name = "docker"
    gpu_flags = ("--gpus", "all")
    pidfile = False  # no ``run --pidfile``: the pid is asked with ``inspect``


DOCKER = Docker()
