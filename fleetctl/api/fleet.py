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
from typing import TYPE_CHECKING, Any, Literal, overload

from fleetctl.errors import UsageError

if TYPE_CHECKING:
    import fabric

    from fleetctl.api.job import Job
    from fleetctl.api.runspec import Container, RunSpec
    from fleetctl.job.records.result import JobEvent
    from fleetctl.node import Node
    from fleetctl.phases.check.report import CheckReport
    from fleetctl.phases.collect import CollectOptions
    from fleetctl.phases.push.image import ImagePushReport
    from fleetctl.phases.push.report import PushEvent, PushReport
    from fleetctl.plan.collective import CollectiveOptions
    from fleetctl.plan.rankplan import Plan
    from fleetctl.plan.userinput import OnSlow
    from fleetctl.ssh.execute import ExecResult, NodeRun
    from fleetctl.transport.connection import SSHSettings

DEFAULT_RUNS_DIR = "fleet-runs"
DEFAULT_FANOUT = 64  # as fleetctl.ssh.fanout.DEFAULT_FANOUT (not imported: no SSH code yet)


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
        groups: Mapping[str, Sequence[str]] | None = None,
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
        names = tuple(n.name for n in self._nodes)
        # the inventory's groups, its selected members (a role job's ``hosts:`` name them)
        self.groups: dict[str, tuple[str, ...]] = (
            {g: tuple(m) for g, m in groups.items()}
            if groups is not None
            else {"all": names, "ungrouped": names}
        )

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
        return cls(inv.nodes, inventory=inv.path, limit=limit, groups=inv.groups, **options)

    @classmethod
    def local(cls, **options: Any) -> Fleet:
        """This machine alone, without SSH (the commands' default without ``-i``)."""
        from fleetctl.plan.inventory import local_inventory

        inv = local_inventory()
        return cls(inv.nodes, groups=inv.groups, **options)

    @staticmethod
    def in_slurm(env: Mapping[str, str] | None = None) -> str | None:
        """The Slurm job id of the allocation this process runs in (``SLURM_JOB_ID``; ``env``:
        instead of ``os.environ``); None outside one."""
        from fleetctl.slurm import allocation

        return allocation.job_id(os.environ if env is None else env)

    @classmethod
    def from_environment(
        cls,
        inventory: str | os.PathLike[str] | None = None,
        limit: str | None = None,
        *,
        slurm: bool = True,
        **options: Any,
    ) -> Fleet:
        """The fleet ``fleetctl run`` would use here: inside a Slurm allocation (and
        ``slurm``) its nodes (:meth:`slurm`), else the inventory's hosts
        (:meth:`from_inventory`), else this machine (:meth:`local`). ``slurm=False`` is
        ``--no-slurm``."""
        if slurm and cls.in_slurm() is not None:
            return cls.slurm(inventory, limit, **options)
        if inventory is not None:
            return cls.from_inventory(inventory, limit, **options)
        if limit:
            raise UsageError(
                "--limit needs an inventory (-i FILE); without one the fleet is this machine alone"
            )
        return cls.local(**options)

    @classmethod
    def slurm(
        cls,
        inventory: str | os.PathLike[str] | None = None,
        limit: str | None = None,
        **options: Any,
    ) -> Fleet:
        """The Slurm allocation this process runs in (``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``)
        as a fleet: every command an ``srun`` step on its node, as ``fleetctl run`` does
        inside ``salloc``/``sbatch``. With ``inventory``: its hosts of the allocation (their
        vars kept). UsageError outside an allocation. Submitting from outside one:
        ``fleetctl.api.slurm.submit``."""
        from fleetctl.plan.inventory import load_inventory, local_inventory
        from fleetctl.slurm import allocation

        if allocation.from_env(os.environ) is None:
            raise UsageError("not inside a Slurm allocation (SLURM_JOB_ID is not set)")
        if inventory is None and limit:
            raise UsageError(
                "--limit needs an inventory (-i FILE); without one the fleet is this machine alone"
            )
        inv = (
            local_inventory()
            if inventory is None
            else load_inventory(os.fspath(inventory), limit=limit)
        )
        inv = allocation.apply(inv, has_inventory=inventory is not None)
        return cls(inv.nodes, inventory=inv.path, limit=limit, groups=inv.groups, **options)

    @property
    def nodes(self) -> list[Node]:
        """The hosts, node 0 first (``Node``: name, address, port, user, …)."""
        return list(self._nodes)

    @property
    def settings(self) -> SSHSettings:
        from fleetctl.transport.connection import SSHSettings

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
        probe_timeout: float = 30.0,
        dcgm: bool = False,
    ) -> CheckReport:
        """``fleetctl check``: SSH, ping, NICs, the mesh, GPUs, ports, disk, tools on every
        host. Never raises for a failing host: ``report.ok``, ``report.failures`` (host,
        check, why), ``report.hosts[name].checks``; ``report.to_dict()`` is ``--json``.
        ``collective``: then the torch.distributed benchmark (``check --collective``).
        ``probe_timeout``: seconds each host's python has to answer (``--probe-timeout``).
        ``dcgm``: DCGM's level-1 diagnostics too, where ``dcgmi`` is installed (``--dcgm``)."""
        import dataclasses

        from fleetctl.api.runspec import Hosts
        from fleetctl.job.run.prepare import launcher_module
        from fleetctl.phases.check.preflight import GiB, check_fleet
        from fleetctl.plan.launchers import get_launcher

        # run's Hosts group: the same check of each value (UsageError, the command's words)
        hosts = Hosts(allow_busy_gpus=allow_busy_gpus, probe_timeout=probe_timeout)
        if mesh not in ("auto", "full", "sparse", "off"):
            raise UsageError(f"mesh must be auto, full, sparse or off, not {mesh!r}")
        options = hosts.check_options(
            rdzv_port=master_port,
            backend=backend,
            uniform_gpus=launcher is not None and not get_launcher(launcher).one_process_per_node,
            launcher_module=launcher_module(launcher) if launcher else None,
            min_free_bytes=int(min_free_gib * GiB),
            recheck=recheck,
            mesh=mesh != "off",
            mesh_mode=mesh if mesh != "off" else "auto",
            collective=collective,
            dcgm=dcgm,
        )
        if dcgm:  # level 1 takes minutes
            options = dataclasses.replace(options, probe_timeout=options.probe_timeout + 150.0)
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
        code: str | os.PathLike[str] | None = None,
        peer: bool | None = None,
        peer_min: int = 4,
        on_event: Callable[[PushEvent], None] | None = None,
    ) -> PushReport:
        """``fleetctl push``: the code snapshot of ``path`` (the git work tree holding it,
        else the folder; None: no code) and conda-pack archive ``env`` to every host,
        verified there. ``code``: this folder as it is instead (``push --code``). ``peer``:
        hosts fetch the archive from each other (None: from ``peer_min`` hosts on).
        ``on_event`` gets each host's ``PushEvent`` (``node``, ``stage``, bytes, ``message``)
        from the worker threads. PushError (``.result`` per host, ``.report``) if any host
        failed."""
        from fleetctl.phases.push import PushOptions, PushRequest, push
        from fleetctl.plan.script_arg import default_code_dir

        if code is not None:
            shipped: str | Path | None = os.fspath(code)
        else:
            shipped = None if path is None else default_code_dir(os.fspath(path))
        options = PushOptions(
            keep_snapshots=keep,
            require_nccl=backend == "nccl",
            check_torch=check_torch,
            peer=peer,
            peer_min_nodes=peer_min,
        )
        # what `run` pushes too (RunSpec's Program.push_request): code, archive, policy
        what = PushRequest(shipped, None if env is None else os.fspath(env), tuple(allow_secrets))
        with self._ssh() as fleet:
            return push(fleet, what, options=options, progress=on_event)

    def push_image(
        self,
        image: str | Container,
        *,
        container_runtime: str | None = None,
        peer: bool | None = None,
    ) -> ImagePushReport:
        """``fleetctl push --image``: this machine's image to every host that lacks it, the id
        checked there. ``image``: RunSpec's ``Container`` group (its image and runtime: podman
        here unless named), or the image's name with ``container_runtime`` beside it. UsageError
        (no host dialled) for a bad value or an image this machine lacks; PushError
        (``.result`` per host, ``.report``) if a host failed."""
        from fleetctl.api.runspec import Container
        from fleetctl.phases.push.image import local_image_id, push_image, runtime_here

        if not isinstance(image, Container):
            image = Container(image=image, container_runtime=container_runtime)
        elif container_runtime is not None:
            raise UsageError("push_image: a Container group carries its runtime: give it there")
        if image.image is None:
            raise UsageError("push_image: the Container group names no image")
        image_id = local_image_id(image.image, runtime_here(image))
        with self._ssh() as fleet:
            return push_image(fleet, image, peer=peer, image_id=image_id)

    # -- exec ---------------------------------------------------------------------------------
    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float = 60.0,
        on_result: Callable[[NodeRun], None] | None = None,
    ) -> ExecResult:
        """``fleetctl exec``: ``command`` on every host at once (a string: a remote shell line;
        a sequence: quoted one by one, reaching the program literally), stopped there with
        everything it started after ``timeout`` s. Never raises for a failing host: the
        result's ``runs`` (rank order: ``node``, ``stdout``, ``stderr``, ``exit_code``,
        ``status``), ``ok``, ``failed`` (host → ``exit 7``), ``exit_code`` (``max_rc``:
        ``-S``'s), ``gathered()`` (clush ``-b``).
        ``on_result`` gets each host's run as it finishes, in a worker thread. Loads only the
        SSH layer (``fleetctl exec`` starts fast)."""
        from fleetctl.ssh.execute import command_line, execute

        line = command_line((command,) if isinstance(command, str) else tuple(command))
        with self._ssh() as fleet:
            return execute(fleet, line, timeout=timeout, on_result=on_result)

    # -- run ----------------------------------------------------------------------------------
    # what a type checker sees: a dry run is the plan, every other run the job (the options are
    # those of the implementation below)
    @overload
    def run(
        self, script: str | None = None, *args: str, dry_run: Literal[True], **options: Any
    ) -> Plan: ...
    @overload
    def run(
        self, script: str | None = None, *args: str, dry_run: Literal[False] = False, **options: Any
    ) -> Job: ...
    def run(  # type: ignore[misc]  # the overloads name the options as **options
        self,
        script: str | None = None,
        *args: str,
        launcher: str = "torchrun",
        nproc_per_node: int | str = "auto",
        env: Mapping[str, str] | None = None,
        stall_timeout: float | None = None,
        startup_timeout: float | None = None,
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
        deadman: float = 10.0,
        max_retries: int | None = None,
        retry_on: Sequence[str] = (),
        no_retry_on: Sequence[str] = (),
        retry_backoff: float | None = None,
        reboot_timeout: float = 300.0,
        allow_secrets: Sequence[str] = (),
        allow_busy_gpus: bool = False,
        before: str | Callable[[Sequence[Node], SSHSettings | None], None] | None = None,
        job_file: str | os.PathLike[str] | None = None,
        env_style: str | None = None,
        nodes: int | None = None,
        elastic: bool = False,
        min_nodes: int | None = None,
        checkpoint_dir: str | None = None,
        resume: str | None = None,
        image: str | None = None,
        container_runtime: str | None = None,
        runtime_timeout: float = 30.0,
        collective: CollectiveOptions | None = None,
        collect: CollectOptions | None = None,
        monitor: bool = True,
        monitor_lost_timeout: float | None = None,
        probe_timeout: float = 30.0,
        report: bool = True,
        metrics_addr: str | None = None,
        metrics_textfile: str | None = None,
        on_failure: str | None = None,
        on_end: str | None = None,
        hook_timeout: float = 60.0,
        on_slow: OnSlow = "warn",
        slow_rounds: int = 4,
        progress_regex: str | None = None,
        post_mortem: bool = True,
        post_mortem_timeout: float = 30.0,
        dry_run: bool = False,
        foreground: bool = False,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> Job | Plan:
        """``fleetctl run SCRIPT ARGS…``: check → push → launch → watch → first-failure
        teardown → collect, into ``runs_dir/<job id>/``. Returns at once with the
        :class:`Job` (its ``lines()``, ``wait()``, ``stop()``); ``detach=True`` returns once
        the job runs on every node under its supervisors and a monitor (``monitor=False``:
        none). ``foreground=True`` runs it in the calling thread (Ctrl-C stops it there, as
        the command's) and returns the ended job (``job.details``: the full result).

        ``script`` as the command takes it (``-m`` then a module in ``args``); ``code``: the
        folder shipped (default: the git work tree holding the script). ``job_file``: a
        role job instead of ``script`` (``--job``; ``env_style``: its variables' names).
        ``nodes``: run on that many hosts that pass the check, the others spares for retries
        (``max_retries``, ``retry_on``, ``no_retry_on``, ``retry_backoff``; ``reboot_timeout``: how
        long a retry waits for a lost host to answer SSH again). ``resume``: an
        earlier job's id (or ``"last"``) whose checkpoint files every node gets before launch
        (``checkpoint_dir``: which folder). ``report=False``: no ``report.html`` written into
        the run folder at the end (``Job.report()`` makes one later). ``post_mortem=False``:
        no collective among the reachable hosts to prove the culprit after a stall, a lost
        node or a collective timeout (``post_mortem_timeout``: its limit in s).
        ``progress_regex``: a job whose nodes progress independently is judged by the count
        this regex's group reads from the ranks' lines, in place of the shapes recognised
        (docs/health.md). ``before``: a Fabric task as ``"fabfile.py:prepare"`` (needs an
        inventory), or a callable
        ``(nodes, settings)``, run after the check and push, before the launch. ``image``:
        each node's launcher in a container (``container_runtime``; ``runtime_timeout``: each
        runtime call's bound at a node's teardown). ``collective``: the
        collective benchmark in the check. ``metrics_addr``/``metrics_textfile``: Prometheus
        metrics while the run lasts; ``on_failure``/``on_end``: local commands run once it
        ended (``hook_timeout``; docs/metrics.md). ``dry_run=True``: no host reached; returns the
        ``Plan`` (``plan.to_json()`` is ``--dry-run --json``). ``on_event`` gets every
        ``JobEvent`` (phases, output lines, node ends, the failure), in the job's thread.
        Bad arguments raise UsageError here; what blocks the launch (CheckError, PushError,
        …) is raised by ``wait()`` (``detach=True`` or ``foreground=True``: here). The
        keywords make one ``RunSpec`` (checked: a bad value is the command's one-line
        UsageError), run by :meth:`run_spec`."""
        from fleetctl.api.runspec import RunSpec

        spec = RunSpec.build(
            script,
            *args,
            launcher=launcher,
            nproc_per_node=nproc_per_node,
            env=env,
            stall_timeout=stall_timeout,
            on_slow=on_slow,
            slow_rounds=slow_rounds,
            progress_regex=progress_regex,
            post_mortem=post_mortem,
            post_mortem_timeout=post_mortem_timeout,
            startup_timeout=startup_timeout,
            timeout=timeout,
            detach=detach,
            code=code,
            env_archive=env_archive,
            check=check,
            master_port=master_port,
            launcher_args=launcher_args,
            backend=backend,
            grace=grace,
            lost_timeout=lost_timeout,
            deadman=deadman,
            max_retries=max_retries,
            retry_on=retry_on,
            no_retry_on=no_retry_on,
            retry_backoff=retry_backoff,
            reboot_timeout=reboot_timeout,
            allow_secrets=allow_secrets,
            allow_busy_gpus=allow_busy_gpus,
            before=before,
            job_file=job_file,
            env_style=env_style,
            nodes=nodes,
            elastic=elastic,
            min_nodes=min_nodes,
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            image=image,
            container_runtime=container_runtime,
            runtime_timeout=runtime_timeout,
            collective=collective,
            collect=collect,
            monitor=monitor,
            monitor_lost_timeout=monitor_lost_timeout,
            probe_timeout=probe_timeout,
            report=report,
            metrics_addr=metrics_addr,
            metrics_textfile=metrics_textfile,
            on_failure=on_failure,
            on_end=on_end,
            hook_timeout=hook_timeout,
        )
        return self.run_spec(spec, dry_run=dry_run, foreground=foreground, on_event=on_event)

    @overload
    def run_spec(
        self,
        spec: RunSpec,
        *,
        dry_run: Literal[True],
        foreground: bool = False,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> Plan: ...
    @overload
    def run_spec(
        self,
        spec: RunSpec,
        *,
        dry_run: Literal[False] = False,
        foreground: bool = False,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> Job: ...
    @overload
    def run_spec(
        self,
        spec: RunSpec,
        *,
        dry_run: bool,
        foreground: bool = False,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> Job | Plan: ...
    def run_spec(
        self,
        spec: RunSpec,
        *,
        dry_run: bool = False,
        foreground: bool = False,
        on_event: Callable[[JobEvent], None] | None = None,
    ) -> Job | Plan:
        """:meth:`run` of a whole run record (``RunSpec.build(script, *args, **keywords)``,
        checked when it was made): the same job, dry run, foreground run or detached job.
        ``fleetctl run`` builds the record from its options and calls this."""
        from fleetctl.api.job import Job
        from fleetctl.api.runrequest import prepare

        ready = prepare(
            spec,
            nodes=self._nodes,
            groups=self.groups,
            settings=self.settings,
            runs_dir=self.runs_dir,
            inventory=self.inventory,
            limit=self.limit,
            dry_run=dry_run,
        )
        if ready.plan is not None:
            return ready.plan
        assert ready.request is not None
        if foreground:
            return Job._run_here(ready.request, on_event=on_event)
        if not spec.monitor.detach:
            return Job._start(ready.request, on_event=on_event, before=ready.before)
        from fleetctl.job.run.submit import submit

        done = submit(ready.request, on_event=on_event or (lambda ev: None))
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
        from fleetctl.ssh.fanout import FanOut

        return FanOut(self._nodes, self.settings, fanout=self.fanout)
