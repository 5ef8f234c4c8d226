"""The fleet: the hosts of an inventory selection (or this machine), and what fleetctl does on
them — check, push, run a job, hand them to Fabric.

Each method is the call the matching command makes (``fleetctl check``/``push``/``run``),
with the command's defaults; nothing prints (``on_event`` carries a run's progress), and
errors are ``FleetctlError`` subclasses carrying the CLI's exit code.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import UsageError

if TYPE_CHECKING:
    import fabric

    from fleetctl.api.job import Job
    from fleetctl.job.result import JobEvent
    from fleetctl.node import Node
    from fleetctl.phases.check_report import CheckReport
    from fleetctl.phases.collective_judge import CollectiveOptions
    from fleetctl.phases.push.report import PushReport
    from fleetctl.phases.push_image import ImagePushReport
    from fleetctl.ssh.connection import SSHSettings

DEFAULT_RUNS_DIR = "fleet-runs"
DEFAULT_FANOUT = 64  # as fleetctl.ssh.fleet.DEFAULT_FANOUT (not imported: no SSH code yet)


class Fleet:
    """Hosts in rank order and how to reach them. Make one with :meth:`from_inventory` or
    :meth:`local`; it holds no connection between calls (each call connects and closes)."""

    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        known_hosts: str | None = None,
        accept_new: bool = False,
        connect_timeout: float = 10.0,
        fanout: int = DEFAULT_FANOUT,
        runs_dir: str | Path = DEFAULT_RUNS_DIR,
        inventory: str | None = None,
        limit: str | None = None,
    ) -> None:
        if not nodes:
            raise UsageError("a fleet needs at least one host")
        if fanout < 1:
            raise UsageError(f"fanout must be at least 1, not {fanout}")
        self._nodes = list(nodes)
        self.known_hosts, self.accept_new = known_hosts, accept_new
        self.connect_timeout = connect_timeout
        self.fanout = fanout
        self.runs_dir = Path(runs_dir)
        self.inventory, self.limit = inventory, limit

    @classmethod
    def from_inventory(
        cls, path: str | os.PathLike[str], limit: str | None = None, **options: Any
    ) -> Fleet:
        """The hosts of Ansible inventory ``path`` (YAML or INI) that ``limit`` selects
        (Ansible's patterns), in rank order. InventoryError (file:line) when it is invalid.
        ``options``: ``known_hosts``, ``accept_new``, ``connect_timeout``, ``fanout``,
        ``runs_dir``, as the commands' options."""
        from fleetctl.plan.inventory import load_inventory

        inv = load_inventory(os.fspath(path), limit=limit)
        return cls(inv.nodes, inventory=inv.path, limit=limit, **options)

    @classmethod
    def local(cls, **options: Any) -> Fleet:
        """This machine alone, without SSH (the commands' default without ``-i``)."""
        from fleetctl.plan.inventory import local_inventory

        return cls(local_inventory().nodes, **options)

    @property
    def nodes(self) -> list[Node]:
        """The hosts, node 0 first (``Node``: name, address, port, user, …)."""
        return list(self._nodes)

    @property
    def settings(self) -> SSHSettings:
        from fleetctl.ssh.connection import SSHSettings

        return SSHSettings(
            known_hosts=self.known_hosts,
            accept_new=self.accept_new,
            connect_timeout=self.connect_timeout,
        )

    def __repr__(self) -> str:
        names = ", ".join(n.name for n in self._nodes[:4])
        more = f", … {len(self._nodes)} hosts" if len(self._nodes) > 4 else ""
        return f"Fleet([{names}{more}])"

    # -- check, push --------------------------------------------------------------------------
    def check(
        self,
        *,
        master_port: int = 29500,
        launcher: str | None = None,
        backend: str | None = None,
        recheck: bool = False,
        allow_busy_gpus: bool = False,
        mesh: str = "auto",
        min_free_gib: float = 1.0,
        collective: CollectiveOptions | None = None,
    ) -> CheckReport:
        """``fleetctl check``: SSH, ping, NICs, the mesh, GPUs, ports, disk, tools on every
        host. Never raises for a failing host: ``report.ok``, ``report.failures`` (host,
        check, why), ``report.hosts[name].checks``; ``report.to_dict()`` is ``--json``.
        ``collective``: then the torch.distributed benchmark (``check --collective``)."""
        from fleetctl.job.prepare import launcher_module
        from fleetctl.phases.check import CheckOptions, GiB, check_fleet
        from fleetctl.plan.launchers import get_launcher

        if mesh not in ("auto", "full", "sparse", "off"):
            raise UsageError(f"mesh must be auto, full, sparse or off, not {mesh!r}")
        options = CheckOptions(
            master_port=master_port,
            backend=backend,
            uniform_gpus=launcher is not None and not get_launcher(launcher).one_process_per_node,
            launcher_module=launcher_module(launcher) if launcher else None,
            min_free_bytes=int(min_free_gib * GiB),
            recheck=recheck,
            allow_busy_gpus=allow_busy_gpus,
            mesh=mesh != "off",
            mesh_mode=mesh if mesh != "off" else "auto",
            collective=collective,
        )
        with self._ssh() as fleet:
            return check_fleet(fleet, options)

    def push(
        self,
        path: str | os.PathLike[str] | None = ".",
        env: str | os.PathLike[str] | None = None,
        *,
        allow_secrets: Sequence[str] = (),
        backend: str | None = None,
        check_torch: bool = False,
        keep: int = 5,
    ) -> PushReport:
        """``fleetctl push``: the code snapshot of ``path`` (the git work tree holding it,
        else the folder; None: no code) and conda-pack archive ``env`` to every host,
        verified there. PushError (``.result`` per host, ``.report``) if any host failed."""
        from fleetctl.phases.codesync import default_code_dir
        from fleetctl.phases.push import PushOptions, push

        code = None if path is None else default_code_dir(os.fspath(path))
        options = PushOptions(
            keep_snapshots=keep,
            require_nccl=backend == "nccl",
            check_torch=check_torch,
            allow_secrets=tuple(allow_secrets),
        )
        with self._ssh() as fleet:
            return push(
                fleet,
                code=code,
                env_archive=None if env is None else os.fspath(env),
                options=options,
            )

    def push_image(
        self, image: str, *, container_runtime: str | None = None, peer: bool | None = None
    ) -> ImagePushReport:
        """``fleetctl push --image``: this machine's ``image`` (podman, or ``container_runtime``)
        to every host that lacks it, the id checked there. UsageError (no host dialled) when
        this machine lacks it; PushError (``.result`` per host, ``.report``) if a host failed."""
        from fleetctl.phases.push_image import local_image_id, push_image

        image_id = local_image_id(image, container_runtime or "podman")
        with self._ssh() as fleet:
            return push_image(
                fleet, image, container_runtime=container_runtime, peer=peer, image_id=image_id
            )

    # -- run ----------------------------------------------------------------------------------
    def run(
        self,
        script: str,
        *args: str,
        launcher: str = "torchrun",
        nproc_per_node: int | str = "auto",
        env: Mapping[str, str] | None = None,
        stall_timeout: float | None = None,
        timeout: float | None = None,
        detach: bool = False,
        code: str | os.PathLike[str] | None = None,
        env_archive: str | os.PathLike[str] | None = None,
        check: bool = True,
        master_port: int | None = None,
        launcher_args: Sequence[str] = (),
        backend: str | None = None,
        grace: float = 5.0,
        lost_timeout: float = 5.0,
        max_retries: int = 0,
        allow_secrets: Sequence[str] = (),
        allow_busy_gpus: bool = False,
        before: str | Callable[[Sequence[Node], SSHSettings | None], None] | None = None,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> Job:
        """``fleetctl run SCRIPT ARGS…``: check → push → launch → watch → first-failure
        teardown → collect, into ``runs_dir/<job id>/``. Returns at once with the
        :class:`Job` (its ``lines()``, ``wait()``, ``stop()``); ``detach=True`` returns once
        the job runs on every node under its supervisors and a monitor.

        ``script`` as the command takes it (``-m`` then a module in ``args``); ``code``: the
        folder shipped (default: the git work tree holding the script). ``before``: a Fabric
        task as ``"fabfile.py:prepare"``, or a callable ``(nodes, settings)``, run after the
        check and push, before the launch. ``on_event`` gets every ``JobEvent`` (phases,
        output lines, node ends, the failure), in the job's thread. Bad arguments raise
        UsageError here; what blocks the launch (CheckError, PushError, …) is raised by
        ``wait()`` (``detach=True``: here)."""
        from datetime import datetime, timezone

        from fleetctl.api.job import Job
        from fleetctl.job.run import RunOptions
        from fleetctl.job.submit import JobRequest, RetryRequest, submit
        from fleetctl.plan.launchers import LAUNCHER_NAMES
        from fleetctl.plan.rankplan import DEFAULT_MASTER_PORT, ENV_KEY_RE, JobSpec
        from fleetctl.plan.script_arg import resolve

        if launcher not in LAUNCHER_NAMES:
            raise UsageError(f"launcher {launcher!r}: one of {', '.join(LAUNCHER_NAMES)}")
        if nproc_per_node != "auto" and not (
            isinstance(nproc_per_node, int)
            and not isinstance(nproc_per_node, bool)
            and nproc_per_node > 0
        ):
            raise UsageError(f"nproc_per_node {nproc_per_node!r}: a positive integer or 'auto'")
        env = dict(env or {})
        bad = [k for k in env if not ENV_KEY_RE.match(k)]
        if bad:
            raise UsageError(f"env: {bad[0]!r} is not a valid variable name")
        prog = resolve(
            script,
            tuple(args),
            None if code is None else os.fspath(code),
            launcher,
            tuple(launcher_args),
        )
        now = datetime.now(timezone.utc)
        spec = JobSpec(
            script=prog.script,
            job_id=_new_job_id(now),
            args=prog.args,
            launcher=launcher,
            nproc_per_node=nproc_per_node,
            master_port=master_port or DEFAULT_MASTER_PORT,
            master_port_fixed=master_port is not None,
            launcher_args=tuple(launcher_args),
            env=env,
            backend=backend,
            created=now.isoformat(timespec="seconds"),
            kind=prog.kind,
            folder=prog.folder,
        )
        hook = _before_hook(before)
        options = RunOptions(
            runs_dir=self.runs_dir,
            check=check,
            grace=grace,
            lost_timeout=lost_timeout,
            timeout=timeout,
            stall_timeout=stall_timeout,
            code=os.path.abspath(prog.code_dir),
            env_archive=None if env_archive is None else os.fspath(env_archive),
            settings=self.settings,
            detach=detach,
            inventory=self.inventory,
            limit=self.limit,
            allow_secrets=tuple(allow_secrets),
            allow_busy_gpus=allow_busy_gpus,
            before_launch=hook,
        )
        retry = RetryRequest(max_retries=max_retries or None).policy()
        request = JobRequest(spec, self.nodes, options, retry=retry)
        if not detach:
            return Job._start(request, on_event=on_event, before=hook)
        done = submit(request, on_event=on_event or (lambda ev: None))
        return Job._found(done.result.job_id, self.runs_dir, self.settings)

    # -- fabric -------------------------------------------------------------------------------
    def group(self, config: fabric.Config | None = None) -> fabric.ThreadingGroup:
        """The hosts as a ``fabric.ThreadingGroup``, in rank order: each ``Connection`` has the
        node's user, port, key and ssh_config resolution, its jump hosts as ``gateway``
        Connections, and fleetctl's host-key rules (unknown and changed keys refused with
        HostKeyError; ``accept_new`` records unknown ones). ``config``: a ``fabric.Config``
        for every Connection (default: fabric's, with no ssh_config of its own)."""
        from fleetctl.api import group

        return group.group(self._nodes, self.settings, config)

    def _ssh(self) -> Any:
        from fleetctl.ssh.fleet import Fleet as SSHFleet

        return SSHFleet(self._nodes, self.settings, fanout=self.fanout)


def _new_job_id(now: Any) -> str:
    """As ``fleetctl run``'s: ``YYYYmmdd-HHMMSS-<6 hex>`` in UTC."""
    import secrets

    from fleetctl.plan.rankplan import format_job_id

    return format_job_id(now, secrets.token_hex(3))


def _before_hook(
    before: str | Callable[[Sequence[Node], SSHSettings | None], None] | None,
) -> Callable[[Sequence[Node], SSHSettings | None], None] | None:
    if before is None or callable(before):
        return before
    from fleetctl.api.before import load_task

    return load_task(before)
