"""The I/O around role jobs and retries: free-port probing, the role planner ``run_job`` calls
after check/push, and the attempt loop behind ``--max-retries``.

Pure decisions live in ``fleetctl.plan.roles`` (layout, env, completion) and ``fleetctl.job.retry``
(classification, backoff); this module only talks to nodes and sequences attempts.

Attempts: attempt 1 is the job itself (``fleet-runs/<job>/``, job id ``<job>``); attempt k >= 2
runs as job id ``<job>.<k>`` in ``fleet-runs/<job>.<k>/`` — its own node run folders, its own
``FLEET_JOB_ID``, so a straggler of one attempt can never be mistaken for the next one.
``fleet-runs/<job>/attempts.json`` lists every attempt, how it ended and why it was (not)
retried; ``fleetctl runs`` folds attempts into their job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import FleetError, PlanError
from fleetctl.phases.frames import last_data
from fleetctl.plan.roles import (
    CompletionPolicy,
    JobFile,
    RoleLayout,
    Task,
    assign_ports,
    assign_tasks,
    candidate_ports,
    make_role_plan,
    port_needs,
    ports_per_host,
)

if TYPE_CHECKING:
    from fleetctl.job.retry import Decision, RetryPolicy
    from fleetctl.job.run import JobEvent, JobResult, RunOptions
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec, NodeFacts, Plan
    from fleetctl.ssh.connection import Connection
    from fleetctl.ssh.fleet import Fleet

PORT_PROBE_TIMEOUT = 20.0

PORT_PROBE = remote.source("port_probe.py").decode("utf-8")  # answers D {"free": [...]}


def probe_free_ports(
    fleet: Fleet, job_id: str, counts: Mapping[str, int], *, spare: int = 16
) -> dict[str, list[int]]:
    """Ask each host which of its candidate ports bind now (one remote command per host)."""
    by_name = {n.name: n for n in fleet.nodes}
    todo = [by_name[h] for h, c in counts.items() if c > 0]

    def one(node: Node, conn: Connection) -> list[int]:
        need = counts[node.name]
        cands = candidate_ports(job_id, node.name, need, spare=spare)
        arg = json.dumps({"candidates": cands, "need": need})
        res = conn.run(
            [conn.expand(node.python), "-c", PORT_PROBE, arg], timeout=PORT_PROBE_TIMEOUT
        )
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return [int(p) for p in last_data(res.stdout)["free"]]
        raise PlanError(
            f"{node.name}: free-port probe failed (exit {res.exit_code}): "
            + " ".join((res.stderr or res.stdout).split())[-200:]
        )

    if not todo:
        return {}
    res = fleet.map(one, timeout=PORT_PROBE_TIMEOUT + 10, nodes=todo, width=max(len(todo), 1))
    if res.failed:
        err = next(iter(res.failed.values()))
        raise FleetError(f"cannot reserve ports on {len(res.failed)} node(s): {err}", res)
    return {h: list(v) for h, v in res.succeeded.items()}


@dataclass
class RolePlanner:
    """Plans a role job once check/push are done: probes free ports, then the pure plan.

    Construct with :func:`prepare_roles`; pass as ``RunOptions.planner``; ``policy`` is the
    completion policy for ``RunOptions.completion``; ``layout`` is recorded in ``roles.json``.
    """

    job: JobFile
    tasks: list[Task]
    env_style: str | None = None
    user: str = ""
    layout: RoleLayout | None = None

    @property
    def nodes(self) -> list[Node]:
        return [t.node for t in self.tasks]

    @property
    def policy(self) -> CompletionPolicy:
        return CompletionPolicy(
            roles=tuple(t.role for t in self.tasks),
            min_failed={r.name: r.min_failed for r in self.job.roles},
            min_succeeded={r.name: r.min_succeeded for r in self.job.roles},
        )

    def __call__(
        self,
        nodes: Sequence[Node],
        spec: JobSpec,
        facts: Mapping[str, NodeFacts] | None,
        code_digest: str | None,
        fleet: Fleet,
    ) -> Plan:
        # Retried attempts keep the hosts but get fresh ports (the old ones may linger).
        by_name = {n.name: n for n in nodes}
        tasks = [dataclasses.replace(t, node=by_name.get(t.node.name, t.node)) for t in self.tasks]
        needs = port_needs(self.job, tasks)
        free = probe_free_ports(fleet, spec.job_id, ports_per_host(tasks, needs))
        ports = assign_ports(tasks, needs, free)
        self.layout = RoleLayout(self.job, tuple(tasks), ports)
        return make_role_plan(
            self.job,
            tasks,
            spec,
            ports,
            facts=facts,
            code_digest=code_digest,
            env_style=self.env_style,
            user=self.user,
        )


def prepare_roles(
    job: JobFile,
    nodes: Sequence[Node],
    groups: Mapping[str, Sequence[str]],
    *,
    env_style: str | None = None,
    user: str | None = None,
) -> RolePlanner:
    """Lay the roles out on the inventory (no network yet)."""
    tasks = assign_tasks(job, nodes, groups)
    return RolePlanner(job, tasks, env_style, user if user is not None else _user())


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def write_roles(folder: str | Path, planner: RolePlanner) -> None:
    """``roles.json`` in the run folder: the job file as parsed and every task's ports."""
    if planner.layout is None:
        return
    path = Path(folder) / "roles.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(planner.layout.to_dict(), f, indent=2)
        f.write("\n")


# ---------------------------------------------------------------------------------- retries


@dataclass
class Attempt:
    """One attempt of a job and what became of it."""

    attempt: int
    job_id: str
    folder: str
    status: str
    ended_by: str | None  # the first failure, in words
    decision: str | None  # why it was (not) retried
    retried: bool = False
    backoff: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class AttemptsResult:
    results: list[JobResult] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def final(self) -> JobResult:
        return self.results[-1]


def attempt_job_id(base: str, attempt: int) -> str:
    return base if attempt == 1 else f"{base}.{attempt}"


def run_attempts(
    spec: JobSpec,
    nodes: Sequence[Node],
    options: RunOptions,
    policy: RetryPolicy,
    *,
    on_event: Callable[[JobEvent], None] | None = None,
    on_result: Callable[[JobResult], None] | None = None,
    fleet: Fleet | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> AttemptsResult:
    """``run_job`` up to ``1 + policy.max_retries`` times, retrying only classified failures.

    ``on_result`` sees every attempt's result (the CLI prints its summary). Errors before a
    launch (check, push, plan) propagate as usual; Ctrl-C is never retried.
    """
    from fleetctl.job.retry import Failure
    from fleetctl.job.run import JobEvent, run_job
    from fleetctl.ssh.fleet import Fleet

    emit = on_event or (lambda e: None)
    rng = rng or random.Random()
    own = fleet is None
    fleet = fleet or Fleet(nodes, options.settings)
    out = AttemptsResult()
    base = spec.job_id
    base_folder = Path(options.runs_dir) / base
    try:
        for k in range(1, policy.max_retries + 2):
            aspec = dataclasses.replace(spec, job_id=attempt_job_id(base, k))
            aopts = dataclasses.replace(options, attempt=k)
            if k > 1:
                emit(
                    JobEvent(
                        "phase", f"attempt {k} of {policy.max_retries + 1}: job {aspec.job_id}"
                    )
                )
            result = run_job(aspec, nodes, aopts, on_event=on_event, fleet=fleet)
            out.results.append(result)
            if on_result is not None:
                on_result(result)
            ff = result.failed_node
            att = Attempt(
                attempt=k,
                job_id=aspec.job_id,
                folder=str(result.folder),
                status=result.status,
                ended_by=None if ff is None else f"node {ff.rank} ({ff.host}): {ff.how()}",
                decision=None,
            )
            out.attempts.append(att)
            decision: Decision | None = None
            if result.status == "failed" and ff is not None:
                failure = Failure.from_node(ff, result.log_tail(ff.rank, 50))
                decision = policy.decide(failure, k)
            elif result.status == "interrupted":
                decision = policy.decide(Failure("interrupted"), k)
            if decision is not None:
                att.decision = ("retry: " if decision.retry else "not retried: ") + decision.reason
                att.retried = decision.retry
                if decision.retry:
                    att.backoff = policy.delay(k, rng.random())
            _write_attempts(base_folder, out.attempts)
            if decision is None or not decision.retry:
                if decision is not None and policy.max_retries > 0:
                    emit(JobEvent("notice", f"attempt {k} {result.status}; {att.decision}"))
                break
            emit(
                JobEvent(
                    "notice",
                    f"attempt {k} failed ({att.ended_by}); {att.decision}; "
                    f"next attempt in {att.backoff:.1f}s",
                )
            )
            sleep(att.backoff or 0.0)
    finally:
        if own:
            fleet.close()
    if out.results:
        out.final.attempts = [a.to_dict() for a in out.attempts]
    return out


def _write_attempts(folder: Path, attempts: Sequence[Attempt]) -> None:
    with contextlib.suppress(OSError):
        tmp = folder / f".attempts.json.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"attempts": [a.to_dict() for a in attempts]}, f, indent=2)
            f.write("\n")
        os.replace(tmp, folder / "attempts.json")
