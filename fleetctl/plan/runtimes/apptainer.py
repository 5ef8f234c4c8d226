"""apptainer: the launcher as a process of the supervisor in the image (``apptainer exec``).

apptainer shares the host's network, IPC and pid namespaces and passes the environment through
by default, so the plan's env needs no flags. There are no labels: the container is the
supervisor's child process, and the supervisor's ordinary stop of the job's processes ends it.
Untested: apptainer is not installable here (not in Debian bookworm nor on PyPI); only the
golden argv is checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.plan.runtimes.base import ContainerSpec, Runtime, mount_flags


class Apptainer(Runtime):
    name = "apptainer"
    labels = False

    def run_argv(self, spec: ContainerSpec, argv: Sequence[str]) -> list[str]:
        return [
            self.name,
            "exec",
            *mount_flags("--bind", spec.mounts),
            "--pwd",
            spec.cwd,
            *(("--nv",) if spec.gpus else ()),
            spec.image,
            *argv,
        ]

    def exec_argv(self, image: str, argv: Sequence[str], gpus: bool = False) -> list[str]:
        return [self.name, "exec", *(("--nv",) if gpus else ()), image, *argv]

    def image_id_argv(self, image: str) -> list[str]:
        # a SIF image is one file: its content hash is its id
        return ["sha256sum", image]


APPTAINER = Apptainer()
