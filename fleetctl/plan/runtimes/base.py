"""What every container runtime builds from: one node's container (``ContainerSpec``), and
the interface each runtime module fills (``Runtime``).

Decisions every runtime shares, and why:
- host network and IPC: rendezvous, NCCL and ``--ips`` see the node's own addresses and NICs;
  NCCL's shared-memory transport and DataLoader workers get the host's IPC and its whole
  ``/dev/shm`` (podman refuses ``--shm-size`` with host IPC: the host's size is the size).
- host pid namespace where the runtime has one: the supervisor's rank pids (``ranks.json``),
  its after-exit scan of the job's processes and py-spy stack dumps all read the host's /proc.
- env by name only (``-e NAME``): the runtime takes each value from its own environment, which
  the supervisor sets; values (tokens) never appear in a process's argv.
- GPUs: all of the node's GPUs are passed into the container; ``fleetctl_gpus`` keeps
  selecting through ``CUDA_VISIBLE_DEVICES`` exactly as without an image (host indices or
  UUIDs, unchanged launcher argv: paddle ``--devices``, deepspeed ``--include``). Passing only
  the listed devices would renumber them from 0 inside the container and break those.
- the code folder, work folder and node run folder are mounted at the same paths, so every
  path in the launcher's argv and env means the same inside.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

LABEL_JOB = "fleetctl.job"
LABEL_RANK = "fleetctl.rank"


@dataclass(frozen=True)
class ContainerSpec:
    """One node's container: which image, whose job, what is mounted and passed in."""

    image: str
    job_id: str
    node_rank: int
    cwd: str  # absolute: the launcher's cwd inside, the same path as on the host
    mounts: tuple[str, ...] = ()  # absolute host paths, each mounted at the same path
    env_names: tuple[str, ...] = ()  # passed by name; values come from the runtime's env
    gpus: bool = False  # the node has GPUs for this job: pass them in
    # absolute host path where the runtime writes the main process's host pid (podman's
    # ``--pidfile``): the supervisor reads a file instead of asking the runtime again and again
    pidfile: str | None = None

    @property
    def name(self) -> str:
        """The container's name (``podman ps`` shows it); teardown never goes by it."""
        return container_name(self.job_id, self.node_rank)

    @property
    def label_filter(self) -> str:
        return f"label={LABEL_JOB}={self.job_id}"


class Runtime:
    """One runtime's argv. ``labels`` is False where containers are plain processes of the
    supervisor (apptainer): its ordinary process stop ends them, there is nothing to list."""

    name = ""
    labels = True
    pidfile = False  # ``ContainerSpec.pidfile`` is written by this runtime (podman)

    def run_argv(self, spec: ContainerSpec, argv: Sequence[str]) -> list[str]:
        """The launcher's ``argv`` run inside the container ``spec`` describes."""
        raise NotImplementedError

    def exec_argv(self, image: str, argv: Sequence[str], gpus: bool = False) -> list[str]:
        """``argv`` in a throwaway container of ``image`` (the check's probes); ``gpus``: with
        the launch's GPU flags, so a node whose runtime cannot hand its GPUs to a container
        fails the check, not the launch."""
        raise NotImplementedError

    def probe_argv(self, image: str, gpus: bool = False) -> list[str]:
        """A trivial container of ``image``: the runtime works on this node (the check)."""
        return self.exec_argv(image, ["true"], gpus)

    def image_id_argv(self, image: str) -> list[str]:
        """Prints the image's id: compared across the nodes by the check."""
        raise NotImplementedError

    def list_argv(self, job_id: str, rank: int | None = None) -> list[str] | None:
        """Prints the ids of every container of the job (of its node ``rank`` only, when
        given), running or not (None: no labels). By rank, because nodes that share one
        image store (the lab's hosts; any shared ``graphroot``) see each other's containers
        and each node ends its own."""
        return None

    def pid_argv(self, name: str) -> list[str] | None:
        """Prints the host pid of the container's main process (0 until it runs): the
        supervisor finds the ranks under it, not under the runtime's client (None: the
        container is the supervisor's own child)."""
        return None

    def stop_argv(self, ids: Sequence[str], grace: float) -> list[str] | None:
        """Stops the containers ``ids``: SIGTERM, SIGKILL after ``grace`` seconds."""
        return None

    def remove_argv(self, ids: Sequence[str]) -> list[str] | None:
        """Removes the containers ``ids``, killing any still running."""
        return None


def container_name(job_id: str, node_rank: int) -> str:
    """The name of the job's container on node ``node_rank``: what an operator removes by hand
    when the runtime did not end it (the teardown's report names it)."""
    return f"fleet-{job_id}-{node_rank}"


def env_flags(names: Sequence[str]) -> list[str]:
    """``-e NAME`` per variable, sorted so the argv is the same for the same env."""
    return [x for n in sorted(set(names)) for x in ("-e", n)]


def mount_flags(flag: str, paths: Sequence[str]) -> list[str]:
    """``-v P:P`` per distinct path, in the order given (the code folder first)."""
    seen: list[str] = []
    for p in paths:
        if p not in seen:
            seen.append(p)
    return [x for p in seen for x in (flag, f"{p}:{p}")]


def grace_seconds(grace: float) -> str:
    """Runtimes take whole seconds: round up, so a stop never waits less than asked."""
    whole = int(grace)
    return str(whole + 1 if grace > whole else max(whole, 0))
