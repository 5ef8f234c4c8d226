"""Teardown: stop one job on every reachable node, then verify nothing of it is left.

Runs ``supervisor.py stop`` on every node in parallel: SIGTERM to the job's process group and to
every process tagged with its ``FLEET_JOB_ID`` (and node rank), a grace period, SIGKILL, then a
scan that must come back empty. A leftover is an error, named with its pid and command line.
A lost node cannot be reached: it is reported as such; its own dead-man switch stops the job.
Only this job's processes are ever signalled (by job id / recorded group, never by name).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.errors import one_line
from fleetctl.phases.frames import last_data
from fleetctl.phases.launch import supervisor_command, supervisor_path

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import NodePlan, Plan
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection


@dataclass
class NodeStop:
    """What stopping the job did on one node."""

    host: str
    rank: int
    found: list[int] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)  # still alive after the grace period
    remaining: list[dict[str, Any]] = field(default_factory=list)  # alive after SIGKILL: error
    skipped: str | None = None  # why the node was not asked (lost)
    error: str | None = None  # could not run the stop on the node
    # "supervisor": the node's supervisor scanned for the job's processes after its launcher
    # exited and reported it with the exit (no remote command); "stop command": we asked.
    checked_by: str = "stop command"

    @property
    def clean(self) -> bool:
        return not self.remaining and self.error is None and self.skipped is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "rank": self.rank,
            "found": self.found,
            "killed": self.killed,
            "remaining": self.remaining,
            "skipped": self.skipped,
            "error": self.error,
            "checked_by": self.checked_by,
        }


@dataclass
class TeardownReport:
    """Every node's outcome. ``verified`` = every node answered and nothing of the job is left."""

    nodes: list[NodeStop]
    grace: float
    seconds: float = 0.0

    @property
    def verified(self) -> bool:
        return all(n.clean for n in self.nodes)

    @property
    def leftovers(self) -> dict[str, list[dict[str, Any]]]:
        return {n.host: n.remaining for n in self.nodes if n.remaining}

    @property
    def unchecked(self) -> dict[str, str]:
        """host -> why its end is not verified (the stop failed, the runtime hung); a node
        not asked (lost, left behind by an elastic job) is not one: its entry says so."""
        return {n.host: n.error for n in self.nodes if n.error is not None}

    def to_dict(self) -> dict[str, Any]:
        return {
            "grace": self.grace,
            "seconds": round(self.seconds, 3),
            "verified": self.verified,
            "nodes": [n.to_dict() for n in self.nodes],
        }


def stop_on_node(
    node: Node,
    conn: Connection,
    *,
    job_id: str,
    run_dir: str,
    rank: int,
    grace: float,
    python: str,
) -> NodeStop:
    """Run the supervisor's stop mode on one node and read what it found and left."""
    sup = supervisor_path(conn.expand(node.workdir))
    argv = supervisor_command(
        conn.expand(python),
        sup,
        "stop",
        job_id=job_id,
        run_dir=conn.expand(run_dir),
        rank=rank,
        grace=grace,
    )
    # Without the supervisor file (never launched there) the job cannot have processes there
    # either; `test -d` keeps this one round trip and says so instead of failing.
    line = f"test -d {_q(sup)} || {{ echo 'D {{\"absent\": true}}'; exit 0; }}; " + _join(argv)
    result = conn.run(line, timeout=grace + 20.0)
    out = NodeStop(host=node.name, rank=rank)
    data = last_data(result.stdout)
    if result.exit_code != 0 or not isinstance(data, dict):
        msg = (result.stderr or result.stdout).strip().splitlines()
        out.error = f"stop exited {result.exit_code}" + (f": {msg[-1]}" if msg else "")
        return out
    out.found = list(data.get("found") or [])
    out.killed = list(data.get("killed") or [])
    out.remaining = list(data.get("remaining") or [])
    return out


def teardown(
    fleet: FanOut,
    plan: Plan,
    *,
    grace: float,
    pythons: Mapping[str, str],
    lost: Iterable[str] = (),
    timeout: float | None = None,
    reported: Mapping[str, Mapping[str, Any]] | None = None,
    lost_note: str = "lost: cannot be reached; its dead-man switch stops the job",
) -> TeardownReport:
    """Stop the job on every node of the plan except lost ones, in parallel; verify each.

    ``reported``: per host, the leftover scan its supervisor sent with the job's exit (see
    ``launch.exit_report_of``). That scan is the one ``stop`` mode would do, made after the
    launcher was gone, so those nodes need no remote command: only the others are asked.
    ``lost_note``: what a lost node's entry says (who stops the job there, if anyone).
    """
    import time

    t0 = time.monotonic()
    lost = set(lost)
    reported = reported or {}
    by_name = {n.name: n for n in fleet.nodes}
    ranks = {np.host: np.node_rank for np in plan.nodes}
    run_dirs = {np.host: np.run_dir for np in plan.nodes}
    todo = [
        by_name[np.host] for np in plan.nodes if np.host not in lost and np.host not in reported
    ]

    def one(node: Node, conn: Connection) -> NodeStop:
        return stop_on_node(
            node,
            conn,
            job_id=plan.job_id,
            run_dir=run_dirs[node.name],
            rank=ranks[node.name],
            grace=grace,
            python=pythons[node.name],
        )

    # Every node at once, not --fanout at a time: each waits up to the grace period for its
    # job to end, and waves would stretch the whole teardown to several grace periods.
    results = (
        fleet.map(one, timeout=timeout or grace + 30.0, nodes=todo, width=max(len(todo), 1))
        if todo
        else None
    )
    stops: list[NodeStop] = []
    for np in plan.nodes:
        if np.host in lost:
            stops.append(NodeStop(np.host, np.node_rank, skipped=lost_note))
            continue
        if np.host in reported:
            rep = reported[np.host]
            stops.append(
                NodeStop(
                    np.host,
                    np.node_rank,
                    found=list(rep.get("found") or []),
                    killed=list(rep.get("killed") or []),
                    remaining=list(rep.get("remaining") or []),
                    error=containers_left(rep.get("containers"), plan.job_id, np),
                    checked_by="supervisor",
                )
            )
            continue
        outcome = results[np.host] if results is not None else None
        if isinstance(outcome, NodeStop):
            stops.append(outcome)
        else:
            stops.append(NodeStop(np.host, np.node_rank, error=one_line(outcome)))
    return TeardownReport(stops, grace, time.monotonic() - t0)


def containers_left(said: Any, job_id: str, np: NodePlan) -> str | None:
    """``--image``: the supervisor's word that its end of the job's container is not verified
    (``said``: the exit report's ``containers``), as one line for the operator: what failed
    (a hung runtime names the call, ``podman stop: no answer within 30s``) and the container
    that may be left, by name and label, with the command that removes it. None: verified."""
    if not isinstance(said, dict) or not said.get("problem"):
        return None
    from fleetctl.plan.runtimes import LABEL_JOB
    from fleetctl.plan.runtimes.base import container_name

    rt = str((np.container or {}).get("runtime") or "podman")
    name = container_name(job_id, np.node_rank)
    why = " (the container runtime hangs)" if said.get("hung") else ""
    return (
        f"container not verified gone: {said['problem']}{why}; {name} (label "
        f"{LABEL_JOB}={job_id}) may be left: remove it with `{rt} rm -f {name}`"
    )


def containers_wait(plan: Plan, grace: float) -> float:
    """Seconds a supervisor may spend ending its container after its job's stop, when the
    runtime hangs (the node's ``containers.end_bound``): the teardown waits this much longer
    for its exit report, which says whether the container is gone. 0 without ``--image``."""
    from fleetctl.remote.kit.containers import CALL_TIMEOUT, end_bound

    bounds = [
        end_bound(grace, float(np.container.get("timeout") or CALL_TIMEOUT))
        for np in plan.nodes
        if np.container
    ]
    return max(bounds, default=0.0)


def _q(s: str) -> str:
    import shlex

    return shlex.quote(s)


def _join(argv: list[str]) -> str:
    import shlex

    return shlex.join(argv)
