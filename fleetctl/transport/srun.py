"""A node reached by ``srun``: every command is a job step on that one node.

Why one step per node and per command, not one multi-node step: each node's supervisor then
has its own stdin/stdout, exactly like an SSH channel, so check, push, launch, watch (with
reattach), teardown and collect run unchanged; a node whose step dies is that node's loss
alone, and a teardown command on a node is one more step beside the supervisor's
(``--overlap``). ``--kill-on-bad-exit`` makes Slurm end the step when its task fails.
"""

from __future__ import annotations

import base64
import shlex
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import RemoteCommandError
from fleetctl.transport.connection import PingTarget
from fleetctl.transport.execclient import ExecConnection

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import HealthWatch, SSHSettings

FILE_TIMEOUT = 600.0  # a put/get/listdir step, file bytes included
REACH_KEY = "slurm_job"  # connect.json: the Slurm job whose steps reach the node
#: Node.vars keys that make a node a job step target instead of an SSH host
CONNECTION_VAR = "fleetctl_connection"
JOB_VAR = "fleetctl_slurm_job"


def srun_argv(job_id: str, node: str, line: str) -> list[str]:
    """One task on ``node`` of job ``job_id`` running ``line`` under /bin/sh (pure)."""
    return [
        "srun",
        f"--jobid={job_id}",
        f"--nodelist={node}",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--unbuffered",
        "--quiet",
        f"--job-name=fleetctl-{node}",
        "/bin/sh",
        "-c",
        line,
    ]


def srun_vars(job_id: str) -> dict[str, str]:
    """The vars that make a node reached by steps of Slurm job ``job_id`` (``SrunConnection``)."""
    return {CONNECTION_VAR: "srun", JOB_VAR: job_id}


def is_srun(node: Node) -> bool:
    return node.vars.get(CONNECTION_VAR) == "srun"


class SrunConnection(ExecConnection):
    """A node's commands and streams, each run as an srun step on the node (``ExecConnection``
    runs it; a step's session is killed whole at a timeout). No invoke here: paramiko may be
    importing with invoke held off in another thread (``sshconfig``)."""

    new_session = True
    can_join_elastic = False
    can_prove_post_mortem = False

    def __init__(self, node: Node, settings: SSHSettings | None = None) -> None:
        super().__init__(node)
        self.job_id = str(node.vars[JOB_VAR])
        self._home: str | None = None
        self._lock = threading.Lock()

    def argv(self, line: str) -> list[str]:
        return srun_argv(self.job_id, self.node.name, line)

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None:
        dest = self.expand(remote)
        part = f"{dest}.part"
        chmod = f" && chmod {mode:o} {shlex.quote(part)}" if mode is not None else ""
        line = (
            f"mkdir -p {shlex.quote(str(Path(dest).parent))} && cat > {shlex.quote(part)}"
            f"{chmod} && mv -f {shlex.quote(part)} {shlex.quote(dest)}"
        )
        self.run(line, timeout=FILE_TIMEOUT, stdin=Path(local).read_bytes(), check=True)

    def get(self, remote: str, local: str | Path) -> None:
        out = self.run(
            ["base64", "-w0", self.expand(remote)], timeout=FILE_TIMEOUT, check=True
        ).stdout
        Path(local).write_bytes(base64.b64decode(out))

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        argv = ["find", self.expand(remote), "-mindepth", "1", "-maxdepth", "1"]
        out = self.run([*argv, "-printf", r"%y %s %f\0"], timeout=FILE_TIMEOUT, check=True)
        entries = []
        for rec in out.stdout.split("\0"):
            if rec:
                kind, size, name = rec.split(" ", 2)
                entries.append((name, kind == "d", 0 if kind == "d" else int(size)))
        return entries

    @property
    def home(self) -> str:
        with self._lock:
            if self._home is None:
                res = self.run('printf %s "$HOME"', timeout=60.0)
                if res.exit_code != 0 or not res.stdout.startswith("/"):
                    raise RemoteCommandError(self.node.label, "echo $HOME", res)
                self._home = res.stdout
            return self._home

    def remember_home(self, home: str) -> None:
        """Record the home the check's probe reported: each ``$HOME`` lookup is a job step
        (slurmctld round trips), and ``expand`` asks it per node before the launch."""
        with self._lock:
            self._home = home

    def close(self) -> None:
        pass

    # -- capabilities -----------------------------------------------------------------------
    @classmethod
    def ping_target(cls, node: Node, settings: SSHSettings) -> PingTarget:
        """None: slurmd reaches the node, there is no SSH port to try (and resolving its
        ssh_config would import paramiko, ~40 ms of CPU, for a run that never opens SSH)."""
        return PingTarget(skip="reached by srun")

    @classmethod
    def watch_health(
        cls, names: Sequence[str], on_lost: Callable[[str, str], bool]
    ) -> HealthWatch | None:
        """Slurm's own word on its nodes (``nodestate``): one DOWN/NOT_RESPONDING is lost at
        once instead of after the heartbeats' silence."""
        from fleetctl.transport.nodestate import NodeStateWatch

        return NodeStateWatch(names, on_lost).start()

    @classmethod
    def reach_fields(cls, node: Node) -> dict[str, Any]:
        """The Slurm job: a later ``status``/``stop`` reaches the node by a step of that job."""
        return {REACH_KEY: node.vars[JOB_VAR]} if JOB_VAR in node.vars else {}

    @classmethod
    def reach_vars(cls, fields: Mapping[str, Any]) -> dict[str, str]:
        job = fields.get(REACH_KEY)
        return {} if job is None else srun_vars(str(job))
