"""Before launch: connect, check, push and plan one attempt (writes plan.json).

Anything that blocks the launch is raised as a ``FleetctlError``; nothing has started yet, so
nothing needs stopping.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from fleetctl.errors import CheckError, RunFolderError
from fleetctl.job.records.result import JobPhase

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetctl.job.run.context import JobContext
    from fleetctl.job.run.job import RunOptions
    from fleetctl.phases.check.preflight import CheckOptions
    from fleetctl.plan.launchers import Launcher
    from fleetctl.plan.rankplan import JobSpec, NodeFacts, Plan
    from fleetctl.ssh.fanout import FanOut


# plan.json is the full form (every node's env and argv whole, easy to read) up to this many
# nodes; larger fleets get the compact form (fleetctl.plan.shared), which Plan.from_dict reads.
FULL_PLAN_MAX_NODES = 256
# s a passing check's probe waits on its channel to become the node's supervisor (the launch
# then starts no second remote command on the node); used within half of it, else it exits.
PROBE_HOLD = 900.0


def prepare(job: JobContext, fleet: FanOut) -> None:
    """Connect, check, push and plan; writes plan.json. Raises on anything that blocks launch."""
    import dataclasses

    from fleetctl.plan.rankplan import NodeFacts, make_plan

    spec, options = job.spec, job.options
    job.emit("phase", f"connecting to {len(job.nodes)} node(s)", phase=JobPhase.CONNECT)
    facts: dict[str, NodeFacts] = {}
    known_present: frozenset[str] = frozenset()  # nodes the check saw the code snapshot on
    shared: list[list[str]] = []  # groups of nodes that share one workdir (an NFS home)
    from fleetctl.phases.check import image as cc

    # --image: the launcher runs on the image's python, asked by the image check, not the host's
    in_image = tuple(n.name for n in job.nodes if cc.image_of(n, spec.container.image))
    if options.hosts.check:
        from fleetctl.phases.check.preflight import check_fleet

        copts = check_options(spec, options, in_image)
        job.emit("phase", "checking nodes", phase=JobPhase.CHECK)
        report = check_fleet(fleet, dataclasses.replace(copts, hold=PROBE_HOLD))
        job.held, report.held = report.held, {}
        with contextlib.suppress(OSError, RunFolderError):  # the check table: never the verdict
            job.folder.write_check(report.to_dict())
        if report.collective is not None:  # the figures, whether they pass or not
            job.folder.write_collective(report.collective.to_dict())
            if job.observer is not None:
                job.observer.collective(report.collective.nodes)
        if not report.ok:
            from fleetctl.results import FleetResult

            problems = "; ".join(f"{h}: {c}: {why}" for h, c, why in report.failures[:5])
            mesh = "; ".join(str(m) for m in report.mesh_failures[:3])
            raise CheckError(
                f"preflight failed ({report.summary()}): {problems or mesh}",
                FleetResult(dict(report.hosts)),
            )
        facts = dict(report.facts)
        shared = report.shared_workdirs
        if not report.cached:  # a cached report may be minutes old: ask again
            known_present = frozenset(h for h, ok in report.code_present.items() if ok)
        for w in report.warnings:
            job.emit("warning", w)
    else:
        res = fleet.connect()
        if res.failed:
            from fleetctl.errors import FleetError

            first = next(iter(res.failed.values()))
            raise FleetError(
                f"cannot connect to {len(res.failed)} node(s): {first}", res
            ) from first
    module, python = cc.entry(spec)
    images = cc.wanted(job.nodes, spec, facts, module=module, python=python)
    runtimes: dict[str, str] = {}
    if images:  # --image: runtime, image present and the same everywhere, before any push
        job.emit("phase", "checking images", phase=JobPhase.CHECK)
        found = cc.check_images(fleet, images, recheck=options.recheck)
        runtimes = {h: f.runtime for h, f in found.items() if f.runtime}
        facts = cc.with_image_torch(facts, found)
    code_digest = None
    if options.push.asked():
        from fleetctl.phases import push as push_mod

        more = " and env" if options.push.env_given() else ""
        job.emit("phase", "pushing code" + more, phase=JobPhase.PUSH)
        popts = options.push_options or push_mod.PushOptions(
            require_nccl=spec.backend == "nccl",
            train_addrs={k: f.train_addr for k, f in facts.items() if f.train_addr},
            known_present=known_present,
            check_torch=(launcher_module(spec.launcher) or "").startswith(("torch.", "deepspeed.")),
        )
        pushed_to = push_mod.push(fleet, options.push, options=popts)
        for w in pushed_to.code_warnings:  # checkpoints or data in the code folder
            job.emit("warning", w)
        code_digest = pushed_to.code_digest
        for n in job.nodes:
            prefix = push_mod.env_path_prefix(pushed_to, n.name)
            if prefix:
                job.path_prepend[n.name] = [prefix]
                f = facts.get(n.name) or NodeFacts()
                pushed = pushed_to.nodes.get(n.name)  # the env's torch (push verified it)
                torch = (pushed.torch_version if pushed else None) or f.torch
                facts[n.name] = dataclasses.replace(f, python=prefix + "/python", torch=torch)
    if options.before_launch is not None:  # `run --before`, the API's hook: nothing runs yet
        from fleetctl.job.run.beforelog import before_output

        job.emit("phase", "before launch", phase=JobPhase.BEFORE)
        with before_output(job):  # its output: [rank host] lines, each node's before.log
            options.before_launch(job.nodes, fleet.settings)
    if options.planner is not None:  # role jobs: ports probed, roles laid out
        job.plan, layout = options.planner.plan(job.nodes, spec, facts or None, code_digest, fleet)
        job.folder.write_roles(layout)
        job.roles = {np.node_rank: layout.role_of(np.node_rank) for np in job.plan.nodes}
    else:
        from fleetctl.job.run.ports import reserve_master_port

        # planned first: a plan that cannot work claims no port, and the claim's span is the
        # plan's processes per node (paddle's endpoints: start_port + local rank, every node)
        job.plan = make_plan(job.nodes, spec, facts or None, code_digest=code_digest)
        per_rank = _launcher(spec.launcher).port_per_local_rank
        span = job.plan.procs if per_rank else 1
        others = job.nodes[1:] if per_rank else ()
        port = reserve_master_port(
            fleet, job.nodes[0], spec, span=span, others=others, held=job.held
        )
        if port != spec.rdzv_port:
            job.emit("notice", f"port {spec.rdzv_port} is taken on node 0: rendezvous on {port}")
            spec = job.spec = dataclasses.replace(spec, rdzv_port=port)
            job.plan = make_plan(job.nodes, spec, facts or None, code_digest=code_digest)
    if runtimes:
        job.plan = cc.with_runtimes(job.plan, runtimes)
    job.result.plan = job.plan
    for np in job.plan.nodes:
        job.result.nodes[np.node_rank].train_addr = np.train_addr
    job.folder.write_plan(plan_document(job.plan))
    if options.relay is not None:  # a retry: the last attempt's checkpoints on every node
        from fleetctl.job.run.checkpoints import relay_before_launch

        relay_before_launch(job, fleet, shared)


def plan_document(plan: Plan) -> dict[str, Any]:
    """plan.json: the full form, or past ``FULL_PLAN_MAX_NODES`` the compact one (in full, every
    node holds every address: nodes² bytes, 285 MB at 5,000 hosts)."""
    doc = plan.to_dict()
    if len(plan.nodes) <= FULL_PLAN_MAX_NODES:
        return doc
    from fleetctl.plan.shared import share_values

    return share_values(doc)


def host_checks(spec: JobSpec, options: RunOptions) -> CheckOptions:
    """What every check of the job's hosts asks, the launch's and a spare's (``--nodes N``):
    what the hosts' options let pass (``Hosts.check_options``), the job's port and backend,
    and whether GPU counts must agree."""
    return options.hosts.check_options(
        rdzv_port=spec.rdzv_port,
        check_rdzv_port=spec.rdzv_port_fixed,
        recheck=options.recheck,
        collective=options.collective,
        backend=spec.backend,
        # one process per node (plain): the GPU counts do not matter
        uniform_gpus=not _launcher(spec.launcher).one_process_per_node and spec.procs == "auto",
    )


def check_options(spec: JobSpec, options: RunOptions, in_image: Sequence[str]) -> CheckOptions:
    """The run's check (``--check-options`` of the API, else what the job needs of a node):
    the launch's preflight, and a spare's fresh check before it joins (run --elastic).
    ``in_image``: the hosts whose launcher runs in the job's image."""
    import dataclasses

    from fleetctl.plan.script_arg import installed_module

    env = options.push.env_given()
    copts = options.check_options or dataclasses.replace(
        host_checks(spec, options),
        # with an env pushed, the env's python runs the launcher: push verifies it there
        launcher_module=None if env else launcher_module(spec.launcher),
        # -m MODULE not in the pushed code: the node python must find it installed
        script_module=None
        if env
        else installed_module(spec.kind or "", spec.script, options.push.code, spec.folder),
        # no launcher import tells torch's version (plain): the probe looks it up
        torch_version=not env and launcher_module(spec.launcher) is None,
        container_hosts=tuple(in_image),
    )
    if options.check_options is None and options.push.code is not None:
        # the probe also looks for this snapshot, so a no-op push needs no round trip
        snap = options.push.snapshot()
        copts = dataclasses.replace(copts, code_dir=f"code/{snap.digest}")
    return copts


def launcher_module(name: str) -> str | None:
    """The module the node python must import to start launcher ``name`` (None: nothing)."""
    return _launcher(name).module


def _launcher(name: str) -> Launcher:
    from fleetctl.plan.launchers import launcher_for

    return launcher_for(name)
