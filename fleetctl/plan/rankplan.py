"""The rank plan: nodes + job options (+ what the check phase learned) → one plan for every node.

Pure on purpose — no I/O, no network, no clock: the job id and any timestamp come in through
``JobSpec``. The same inputs always give the same plan, which is what the golden tests pin and
what ``plan.json`` in the run folder records.

Per-node env precedence (later wins): fleetctl's own variables, the launcher's (``plain`` adds
``RANK``…), the inventory's ``fleetctl_env``, then the user's ``--env-var``. Only
``FLEET_JOB_ID`` and ``FLEET_NODE_RANK`` cannot be overridden: teardown finds a job's
processes by them.

What it refuses before building anything is in :mod:`fleetctl.plan.plan_checks`.

``WORLD_SIZE`` in the node env is the job's total process count (``nnodes * procs``).
Under torchrun/paddle/deepspeed the launcher sets each worker's own ``RANK``/``WORLD_SIZE``;
under ``plain`` (one process per node) the script is rank ``NODE_RANK`` of ``NNODES``.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetctl.api.runspec import Container
from fleetctl.errors import PlanError, UsageError
from fleetctl.node import DEFAULT_PYTHON, Node
from fleetctl.plan.flight_recorder import FR_BUFFER_NAMES, nccl_trace_env
from fleetctl.plan.launchers import LAUNCHER_NAMES, LaunchContext, check_program, get_launcher
from fleetctl.plan.launchers.base import MODULE, PYTHON, kind_of, path_from
from fleetctl.plan.names import node_folder_name
from fleetctl.plan.nproc import processes_per_node
from fleetctl.plan.plan_checks import (
    BACKENDS,
    ENV_KEY_RE,
    check_launcher_args,
    check_loopback_mix,
    check_relpath,
    check_spec,
    check_unique_names,
    checked_env,
    where,
)
from fleetctl.plan.planfile import PLAN_VERSION, FileNames, plan_document, plan_values
from fleetctl.plan.shared import expand_shared, share_values

DEFAULT_MASTER_PORT = 29500
PENDING_DIGEST = "<code-digest>"  # code_dir placeholder before push has computed the digest


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """What the user asked for: script (relative to the code dir), its args, launcher options.

    ``args`` are kept exactly as given (spaces, quotes, ``;``): they become separate argv
    entries, never a shell string. ``env`` is the user's ``--env-var K=V`` set. ``kind``: what
    ``script`` is (``python``, ``module``: a module name run as ``-m``, ``shell``; None: by its
    name). ``folder``: where in the code the job runs (relative to the code dir; ``""``: its
    top): ``fleetctl run`` passes the script's own folder, as ``python sub/train.py`` from
    ``sub/`` would see it.
    """

    script: str
    job_id: str
    args: tuple[str, ...] = ()
    launcher: str = "torchrun"
    procs: int | str = "auto"  # processes per node asked (auto: per GPU); Plan.procs: resolved
    rdzv_port: int = DEFAULT_MASTER_PORT  # the port tried first; then the one claimed on node 0
    rdzv_port_fixed: bool = False  # given by the user: that port or a clear refusal
    launcher_args: tuple[str, ...] = ()  # passed to the launcher after fleetctl's own flags
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    backend: str | None = None
    created: str | None = None  # ISO-8601 time the job layer stamped, recorded in plan.json
    # The job an attempt belongs to (None: this job id): every attempt of a job runs in the
    # same work folder, so what the script writes to relative paths survives a retry.
    work_id: str | None = None
    kind: str | None = None
    folder: str = ""
    # --image, --container-runtime, --runtime-timeout: RunSpec's group whole (over the inventory's)
    container: Container = field(default_factory=Container)
    elastic: str | None = None  # run --elastic: the node range MIN:MAX (None: a static world)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        object.__setattr__(self, "launcher_args", tuple(str(a) for a in self.launcher_args))
        object.__setattr__(self, "env", {str(k): str(v) for k, v in dict(self.env).items()})

    def part(self, **program: Any) -> JobSpec:
        """The same job running another program (a role's, a parameter-server job's): its id,
        stamp, work folder and image kept, the rest from ``program`` (script, args, launcher,
        processes, port, env, backend) or the defaults."""
        return JobSpec(
            job_id=self.job_id,
            created=self.created,
            work_id=self.work_id,
            container=self.container,
            **program,
        )

    def in_image_of(self, source: Any) -> JobSpec:
        """In ``source``'s image and runtime (a role job file's) where it names none."""
        return replace(self, container=self.container.filled(source))


@dataclass(frozen=True)
class NodeFacts:
    """What the check phase learned about one node; every field optional (None = unknown).

    ``train_addr`` is the IPv4 address of the node's ``fleetctl_nic``; ``python`` the
    interpreter push prepared (e.g. an unpacked conda-pack env), overriding ``fleetctl_python``.
    """

    train_addr: str | None = None
    nic: str | None = None
    gpu_count: int | None = None
    gpu_names: tuple[str, ...] = ()
    python: str | None = None
    torch: str | None = None  # the node python's torch version (the launcher import)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeFacts:
        return cls(
            train_addr=data.get("train_addr"),
            nic=data.get("nic"),
            gpu_count=data.get("gpu_count"),
            gpu_names=tuple(data.get("gpu_names") or ()),
            python=data.get("python"),
            torch=data.get("torch"),
        )


@dataclass(frozen=True)
class NodePlan:
    """One node's part of the plan: where it runs, its rank, and the exact command and env.

    The run phase writes ``files`` (path relative to ``run_dir`` → content) into the node run
    folder, then starts ``argv`` (no shell) with ``env`` added to the node's environment and
    ``cwd`` as working directory. ``cwd``/``run_dir``/``code_dir`` may start with ``~/`` (the
    inventory's workdir); argv never relies on ``~`` expansion (see launchers.base).
    """

    host: str
    address: str
    node_rank: int
    train_addr: str
    nic: str | None
    python: str
    workdir: str
    code_dir: str
    run_dir: str
    cwd: str
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict, hash=False)
    files: dict[str, str] = field(default_factory=dict, hash=False)
    # The GPUs this node's job may use (indices or UUIDs, CUDA_VISIBLE_DEVICES order); empty:
    # all of the node's GPUs.
    gpus: tuple[str, ...] = ()
    # The job's work folder when ``cwd`` is a folder inside it (the script's); empty: ``cwd``.
    work_dir: str = ""
    # --image: {"image", "runtime" (None: the check's pick), "gpus"}; the supervisor runs argv
    # in one container of it (docs/containers.md). None: on the node's own Python.
    container: dict[str, Any] | None = field(default=None, hash=False)

    def to_dict(self) -> dict[str, Any]:
        d = self._fields()
        if self.gpus:
            d["gpus"] = list(self.gpus)
        if self.work_dir:
            d["work_dir"] = self.work_dir
        if self.container:
            d["container"] = dict(self.container)
        return d

    def _fields(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "address": self.address,
            "node_rank": self.node_rank,
            "nic": self.nic,
            "train_addr": self.train_addr,
            "python": self.python,
            "workdir": self.workdir,
            "code_dir": self.code_dir,
            "run_dir": self.run_dir,
            "cwd": self.cwd,
            "argv": list(self.argv),
            "env": dict(self.env),
            "files": dict(self.files),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodePlan:
        d = _require(data, "node", ("host", "address", "node_rank", "argv", "env"))
        run_dir = d.get("run_dir", "")
        return cls(
            host=d["host"],
            address=d["address"],
            node_rank=int(d["node_rank"]),
            train_addr=d.get("train_addr") or d["address"],
            nic=d.get("nic"),
            python=d.get("python", ""),
            workdir=d.get("workdir", ""),
            code_dir=d.get("code_dir", ""),
            run_dir=run_dir,
            cwd=d.get("cwd", run_dir),
            argv=tuple(d["argv"]),
            env=dict(d["env"]),
            files=dict(d.get("files") or {}),
            gpus=tuple(str(g) for g in d.get("gpus") or ()),
            work_dir=d.get("work_dir") or "",
            container=dict(d["container"]) if d.get("container") else None,
        )


def _container(n: Node, spec: JobSpec, gpus: bool) -> dict[str, Any] | None:
    """The node's container (``--image`` over ``fleetctl_image``), or None: no image."""
    box = spec.container
    image = box.image or n.vars.get("fleetctl_image")
    if not image:
        return None
    rt = box.runtime_for(n)
    if rt is not None:
        from fleetctl.plan.runtimes import runtime

        try:
            runtime(rt)
        except UsageError as e:
            raise PlanError(f"{where(n)}{e}") from None
    said: dict[str, Any] = {"image": str(image), "runtime": rt}
    said["gpus"] = gpus
    said["timeout"] = float(box.runtime_timeout)
    return said


def container_python(n: Node) -> str:
    """The job's Python in an image: ``fleetctl_image_python`` (a path inside it), else the
    image's ``python3``; never ``fleetctl_python``, the host's (the supervisor's) interpreter."""
    return str(n.vars.get("fleetctl_image_python") or DEFAULT_PYTHON)


@dataclass(frozen=True)
class Plan(FileNames):
    """The whole job: identical plan-wide values plus one ``NodePlan`` per node in rank order.

    ``to_dict()`` is ``plan.json`` and ``--dry-run --json --full``: ``{"job_id", "nodes": [{"host",
    "address", "node_rank", "nic", "argv", "env", …}]}`` (extra keys allowed; the shape is
    ``plan/planfile.py``'s, which also answers the file's names); a plain ``--dry-run --json``
    prints ``to_json(compact=True)``.
    """

    job_id: str
    launcher: str
    script: str
    args: tuple[str, ...]
    master_addr: str
    rdzv_port: int  # the rendezvous port claimed for the job
    ips: tuple[str, ...]
    nnodes: int
    procs: int  # processes per node, resolved
    gpus_per_node: int
    world_size: int
    nodes: tuple[NodePlan, ...]
    user_env: dict[str, str] = field(default_factory=dict, hash=False)
    backend: str | None = None
    created: str | None = None
    version: int = PLAN_VERSION
    kind: str = PYTHON  # what ``script`` is (launchers.base.SCRIPT_KINDS)
    folder: str = ""  # where in the code the job runs

    @property
    def context(self) -> LaunchContext:
        """The plan-wide values the launcher adapters build argv from."""
        return LaunchContext(
            job_id=self.job_id,
            launcher=self.launcher,
            script=self.script,
            args=self.args,
            master_addr=self.master_addr,
            rdzv_port=self.rdzv_port,
            ips=self.ips,
            nnodes=self.nnodes,
            procs=self.procs,
            gpus_per_node=self.gpus_per_node,
            kind=self.kind,
        )

    @property
    def spec(self) -> JobSpec:
        """The JobSpec this plan was made from (for re-planning a retry from plan.json)."""
        return JobSpec(
            script=self.script,
            job_id=self.job_id,
            args=self.args,
            launcher=self.launcher,
            procs=self.procs,
            rdzv_port=self.rdzv_port,
            env=self.user_env,
            backend=self.backend,
            created=self.created,
            kind=self.kind,
            folder=self.folder,
        )

    def node(self, host: str) -> NodePlan:
        """The NodePlan of inventory host ``host``."""
        for n in self.nodes:
            if n.host == host:
                return n
        raise KeyError(host)

    def to_dict(self) -> dict[str, Any]:
        return plan_document(self)

    def to_json(self, indent: int | None = 2, *, compact: bool = False) -> str:
        """``compact``: fleet-wide values written once (``fleetctl.plan.shared``), not per node."""
        d = self.to_dict()
        return json.dumps(share_values(d) if compact else d, indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Reload a plan (``plan.json``, full or compact). PlanError on a malformed document."""
        d = expand_shared(_require(data, "plan", ("job_id", "nodes")))
        try:
            return cls(**plan_values(d, tuple(NodePlan.from_dict(n) for n in d["nodes"])))
        except (TypeError, ValueError, AttributeError) as e:
            raise PlanError(f"malformed plan: {e}") from e

    @classmethod
    def from_json(cls, text: str) -> Plan:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise PlanError(f"plan is not valid JSON: {e}") from e
        return cls.from_dict(data)


def _require(data: Any, what: str, keys: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise PlanError(f"malformed plan: {what} is not an object")
    missing = [k for k in keys if k not in data]
    if missing:
        raise PlanError(f"malformed plan: {what} lacks {', '.join(missing)}")
    return data


def make_plan(
    nodes: Sequence[Node],
    spec: JobSpec,
    facts: Mapping[str, NodeFacts] | None = None,
    code_dir: str | None = None,
    code_digest: str | None = None,
) -> Plan:
    """Rank plan for ``nodes`` (already in rank order: node_rank = position).

    ``facts`` (by host name) come from the check phase and win over inventory values.
    ``code_dir`` is one remote code path for all nodes; otherwise each node uses
    ``<workdir>/code/<code_digest>`` (a placeholder digest before push has run).
    Raises PlanError (exit 2) for anything that cannot work, naming the host.
    """
    nodes = tuple(nodes)
    facts = facts or {}
    if not nodes:
        raise PlanError("no nodes to run on")
    launcher = get_launcher(spec.launcher)
    check_spec(spec)
    check_unique_names(nodes)
    kind = spec.kind or kind_of(spec.script)
    check_program(launcher.name, kind, spec.script)
    folder = "" if spec.folder in ("", ".") else posixpath.normpath(spec.folder)
    script = spec.script if kind == MODULE else posixpath.normpath(spec.script)
    spec = replace(spec, script=script, kind=kind, folder=folder)

    addrs: dict[str, str] = {}
    nics: dict[str, str | None] = {}
    gpus: dict[str, int] = {}
    visible: dict[str, tuple[str, ...]] = {}
    for n in nodes:
        f = facts.get(n.name) or NodeFacts()
        addrs[n.name] = f.train_addr or n.train_addr or n.address
        nics[n.name] = f.nic or n.nic
        visible[n.name] = _visible_gpus(n, spec)
        count = f.gpu_count if f.gpu_count is not None else n.gpus
        gpus[n.name] = len(visible[n.name]) if visible[n.name] else int(count or 0)
    check_loopback_mix(addrs)

    nproc, gpus_per_node = processes_per_node(
        spec, gpus, one_per_node=launcher.one_process_per_node
    )
    ips = tuple(addrs[n.name] for n in nodes)
    ctx = LaunchContext(
        job_id=spec.job_id,
        launcher=launcher.name,
        script=spec.script,
        args=spec.args,
        master_addr=ips[0],
        rdzv_port=spec.rdzv_port,
        ips=ips,
        nnodes=len(nodes),
        procs=nproc,
        gpus_per_node=gpus_per_node,
        extra_argv=spec.launcher_args,
        gpu_lists=tuple(visible[n.name] for n in nodes) if any(visible.values()) else (),
        kind=kind,
        elastic=spec.elastic,
    )
    check_launcher_args(launcher, spec.launcher_args)
    launcher.validate(ctx, addrs)

    plans = []
    for rank, n in enumerate(nodes):
        f = facts.get(n.name) or NodeFacts()
        workdir = n.workdir.rstrip("/") or "/"
        # one folder per node even when nodes share the workdir (an NFS home): the same
        # <rank>-<host> name as the node's folder in the controller's run folder
        run_dir = posixpath.join(workdir, "runs", spec.job_id, node_folder_name(rank, n.name))
        work_dir = posixpath.join(workdir, WORK_DIR, spec.work_id or spec.job_id)
        node_code = code_dir or posixpath.join(workdir, "code", code_digest or PENDING_DIGEST)
        container = _container(n, spec, bool(visible[n.name]) or gpus.get(n.name, 0) > 0)
        slot = NodePlan(
            host=n.name,
            address=n.address,
            node_rank=rank,
            train_addr=addrs[n.name],
            nic=nics[n.name],
            python=container_python(n) if container else f.python or n.python,
            workdir=workdir,
            code_dir=node_code,
            run_dir=run_dir,
            cwd=posixpath.join(work_dir, folder) if folder else work_dir,
            gpus=visible[n.name],
            work_dir=work_dir if folder else "",
            container=container,
        )
        env = _node_env(ctx, slot, spec, torch=f.torch)
        if slot.gpus and not launcher.sets_visible_devices:  # deepspeed: from --include
            env[CUDA_VISIBLE] = ",".join(slot.gpus)
        env.update(launcher.env(ctx, slot))
        own = checked_env(n.env, f"{where(n)}fleetctl_env")
        env.update(own)
        env.update(spec.env)
        job_set = own.keys() | spec.env.keys()
        for name, alias in FR_BUFFER_NAMES:  # the job's value, under either name, wins
            if alias in job_set and name not in job_set:
                env.pop(name, None)
        files = launcher.files(ctx, slot)
        for rel in files:
            check_relpath(rel, f"{launcher.name} file")
        plans.append(replace(slot, argv=tuple(launcher.argv(ctx, slot)), env=env, files=files))

    return Plan(
        job_id=spec.job_id,
        launcher=launcher.name,
        script=spec.script,
        args=spec.args,
        master_addr=ctx.master_addr,
        rdzv_port=spec.rdzv_port,
        ips=ips,
        nnodes=ctx.nnodes,
        procs=nproc,
        gpus_per_node=gpus_per_node,
        world_size=ctx.nnodes * nproc,
        nodes=tuple(plans),
        user_env=dict(spec.env),
        backend=spec.backend,
        created=spec.created,
        kind=kind,
        folder=folder,
    )


CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"


# Under the node workdir: ``work/<job>`` is the job's working directory, a copy of the code
# snapshot the node's supervisor makes once per job (remote/supervisor.seed_work_folder).
WORK_DIR = "work"


def _visible_gpus(node: Node, spec: JobSpec) -> tuple[str, ...]:
    """The node's GPU list: the inventory's ``fleetctl_gpus`` list, else a CUDA_VISIBLE_DEVICES
    the user set (--env-var, fleetctl_env); PlanError when the two disagree."""
    user = spec.env.get(CUDA_VISIBLE) or node.env.get(CUDA_VISIBLE)
    said = tuple(x.strip() for x in str(user).split(",") if x.strip()) if user else ()
    if node.gpu_ids and said and said != node.gpu_ids:
        raise PlanError(
            f"{where(node)}fleetctl_gpus lists {','.join(node.gpu_ids)} but "
            f"{CUDA_VISIBLE}={user} is set too; say the GPUs once (fleetctl_gpus)"
        )
    return node.gpu_ids or said


def _node_env(
    ctx: LaunchContext, node: NodePlan, spec: JobSpec, *, torch: str | None = None
) -> dict[str, str]:
    env = {
        "MASTER_ADDR": ctx.master_addr,
        "MASTER_PORT": str(ctx.rdzv_port),
        "WORLD_SIZE": str(ctx.nnodes * ctx.procs),
        "NODE_RANK": str(node.node_rank),
        "NNODES": str(ctx.nnodes),
        "FLEET_JOB_ID": ctx.job_id,
        "FLEET_NODE_RANK": str(node.node_rank),
        "FLEET_NUM_NODES": str(ctx.nnodes),
        "FLEET_NODE_IPS": ctx.ips_csv,
        "FLEET_NPROC_PER_NODE": str(ctx.procs),
        "FLEET_HOST": node.host,
        "FLEET_LAUNCHER": ctx.launcher,
        "FLEET_CODE_DIR": path_from(node.cwd, node.code_dir),
        "PYTHONUNBUFFERED": "1",
    }
    if node.nic:
        env["NCCL_SOCKET_IFNAME"] = node.nic
        env["GLOO_SOCKET_IFNAME"] = node.nic
    if spec.backend:
        env["FLEET_BACKEND"] = spec.backend
    if spec.backend == "nccl" or ctx.gpus_per_node:
        env.update(nccl_trace_env(path_from(node.cwd, node.run_dir), torch=torch))
    return env


__all__ = [
    "BACKENDS",
    "DEFAULT_MASTER_PORT",
    "ENV_KEY_RE",
    "LAUNCHER_NAMES",
    "JobSpec",
    "NodeFacts",
    "NodePlan",
    "Plan",
    "check_launcher_args",
    "make_plan",
]
