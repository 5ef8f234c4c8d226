"""podman: one container per node, GPUs by CDI (``nvidia.com/gpu=all``; nvidia-ctk writes
the spec on GPU nodes), the job found again by its label."""

from __future__ import annotations

from collections.abc import Sequence

from fleetctl.plan.runtimes.base import (
    LABEL_JOB,
    LABEL_RANK,
    ContainerSpec,
    Runtime,
    env_flags,
    grace_seconds,
    mount_flags,
)


class Podman(Runtime):
    name = "podman"
    gpu_flags: tuple[str, ...] = ("--device", "nvidia.com/gpu=all")
    pidfile = True  # ``run --pidfile``: conmon writes the main process's host pid there

    def run_argv(self, spec: ContainerSpec, argv: Sequence[str]) -> list[str]:
        return [
            self.name,
            "run",
            "--rm",
            "--name",
            spec.name,
            "--label",
            f"{LABEL_JOB}={spec.job_id}",
            "--label",
            f"{LABEL_RANK}={spec.node_rank}",
            "--network",
            "host",
            "--ipc",
            "host",
            "--pid",
            "host",
            *mount_flags("-v", spec.mounts),
            "-w",
            spec.cwd,
            *env_flags(spec.env_names),
            *(("--pidfile", spec.pidfile) if self.pidfile and spec.pidfile else ()),
            *(self.gpu_flags if spec.gpus else ()),
            spec.image,
            *argv,
        ]

    def exec_argv(self, image: str, argv: Sequence[str], gpus: bool = False) -> list[str]:
        gpu = self.gpu_flags if gpus else ()
        return [self.name, "run", "--rm", "--network", "host", *gpu, image, *argv]

    def image_id_argv(self, image: str) -> list[str]:
        return [self.name, "image", "inspect", "--format", "{{.Id}}", image]

    def list_argv(self, job_id: str, rank: int | None = None) -> list[str] | None:
        by_rank = () if rank is None else ("--filter", f"label={LABEL_RANK}={rank}")
        return [self.name, "ps", "-a", "-q", "--filter", f"label={LABEL_JOB}={job_id}", *by_rank]

    def pid_argv(self, name: str) -> list[str] | None:
        return [self.name, "inspect", "--format", "{{.State.Pid}}", name]

    def stop_argv(self, ids: Sequence[str], grace: float) -> list[str] | None:
        return [self.name, "stop", "--time", grace_seconds(grace), *ids]

    def remove_argv(self, ids: Sequence[str]) -> list[str] | None:
        return [self.name, "rm", "--force", *ids]


PODMAN = Podman()
