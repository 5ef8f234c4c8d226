"""A job's node supervisors, asked from another process: make sure each node has this
fleetctl's supervisor, leave it a stop request, ask every node how the job stands there.

Each is one remote command per node, in parallel; a node that does not answer in time is
reported, never waited on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError, one_line
from fleetctl.job.records.runfolder import iso
from fleetctl.node import Node
from fleetctl.phases.frames import last_data
from fleetctl.remote.kit.records import RecordError, SupervisorState

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import Plan
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection

EXTERNAL_STOP_REASON = "stopped by `fleetctl stop`"  # supervisors relay it to an attached run
STATUS_TIMEOUT = 30.0

# ------------------------------------------------------------------------------ node side


def ensure_supervisor(fleet: FanOut, nodes: Sequence[Node] | None = None) -> dict[str, str]:
    """Make sure this fleetctl's supervisor is on every node (for status/stop/pack); returns
    node name -> its path. Uploads it (atomically) only where it is missing."""
    from fleetctl.phases.launch import install_program, supervisor_path

    def one(node: Node, conn: Connection) -> str:
        sup = supervisor_path(conn.expand(node.workdir))
        install_program(conn, conn.expand(node.python), sup, timeout=STATUS_TIMEOUT)
        return sup

    res = fleet.map(one, timeout=STATUS_TIMEOUT + 30, nodes=nodes)
    return {k: v for k, v in res.succeeded.items()}


def request_stop(
    fleet: FanOut,
    plan: Plan,
    nodes: Sequence[Node],
    *,
    reason: str = EXTERNAL_STOP_REASON,
    skip: Iterable[str] = (),
) -> None:
    """Leave ``stop-request.json`` in every node's run folder before the stop, so each
    supervisor reports why its job ended and an attached ``fleetctl run`` (in another
    terminal) counts the job as stopped, not failed. Best effort: the stop itself follows.
    ``skip``: hosts not to ask (lost: unreachable)."""
    by_name = {n.name: n for n in nodes}
    skip = set(skip)

    def one(node: Node, conn: Connection) -> None:
        from fleetctl.phases.launch import supervisor_command, supervisor_path

        np = plan.node(node.name)
        sup = supervisor_path(conn.expand(node.workdir))
        argv = supervisor_command(
            conn.expand(node.python),
            sup,
            "mark-stop",
            run_dir=conn.expand(np.run_dir),
            job_id=plan.job_id,
            reason=reason,
        )
        conn.run(argv, timeout=STATUS_TIMEOUT)

    todo = [by_name[n.host] for n in plan.nodes if n.host in by_name and n.host not in skip]
    fleet.map(one, timeout=STATUS_TIMEOUT + 10, nodes=todo)


@dataclass
class NodeReport:
    """One node's view of the job (``fleetctl status``)."""

    rank: int
    host: str
    state: str  # running, exited, stopped, lost (supervisor died), absent, unreachable
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    processes: list[int] = field(default_factory=list)
    detached: bool = False
    start_time: float | None = None
    end_time: float | None = None
    error: str | None = None
    stop_reason: str | None = None  # the supervisor's, when it stopped the job
    progress: float | None = None  # the job's last output or progress-file touch (node clock)
    begun: bool = False  # the job's start-up is over there (its first line of a rank, a touch)
    pace: dict[str, Any] | None = None  # detached: the last pace report, ``{"seq", "report"}``
    ranks_ended: dict[str, Any] | None = None  # every rank there ended: ``{"ranks", "failed"}``

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "state": self.state,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "processes": self.processes,
            "detached": self.detached,
            "start_time": iso(self.start_time),
            "end_time": iso(self.end_time),
            "error": self.error,
            "stop_reason": self.stop_reason,
        }


def node_states(
    fleet: FanOut,
    plan: Plan,
    nodes: Sequence[Node],
    *,
    ensure: bool = True,
    timeout: float = STATUS_TIMEOUT,
) -> list[NodeReport]:
    """Ask every node's supervisor (``status`` mode) about the job, in parallel.

    ``ensure`` first installs the supervisor where it is missing (one more command per node;
    a watcher polling every few seconds does that once, then passes False). ``timeout`` bounds
    each node's answer; a node that does not answer in time is ``unreachable``.
    """
    from fleetctl.phases.launch import supervisor_command, supervisor_path

    by_name = {n.name: n for n in nodes}
    if ensure:
        ensure_supervisor(fleet, [by_name[np.host] for np in plan.nodes if np.host in by_name])

    def one(node: Node, conn: Connection) -> dict[str, Any]:
        np = plan.node(node.name)
        sup = supervisor_path(conn.expand(node.workdir))
        argv = supervisor_command(
            conn.expand(node.python),
            sup,
            "status",
            job_id=plan.job_id,
            run_dir=conn.expand(np.run_dir),
        )
        res = conn.run(argv, timeout=timeout)
        data = last_data(res.stdout)
        if res.exit_code != 0 or not isinstance(data, dict):
            raise FleetctlError(f"status exited {res.exit_code}: {res.stderr.strip()[-200:]}")
        return data

    results = fleet.map(one, timeout=timeout + 10, nodes=[by_name[n.host] for n in plan.nodes])
    out = []
    for np in plan.nodes:
        r = results.get(np.host)
        if not isinstance(r, dict):
            out.append(NodeReport(np.node_rank, np.host, "unreachable", error=one_line(r)))
            continue
        try:  # supervisor.json as the status mode answers it, and what it adds
            sup = SupervisorState.from_dict(r)
        except RecordError as e:
            out.append(NodeReport(np.node_rank, np.host, "unreachable", error=str(e)))
            continue
        state = sup.state or "absent"
        if not sup.job_id and not r.get("processes"):
            state = "absent"
        out.append(
            NodeReport(
                rank=np.node_rank,
                host=np.host,
                state=state,
                pid=sup.pid,
                exit_code=sup.exit_code,
                signal=sup.signal,
                processes=list(r.get("processes") or []),
                detached=sup.detached,
                start_time=sup.start_time,
                end_time=sup.end_time,
                stop_reason=sup.stop_reason,
                progress=r.get("progress"),
                begun=r.get("begun") is True,
                pace=r.get("pace") if isinstance(r.get("pace"), dict) else None,
                ranks_ended=ended if isinstance(ended := r.get("ranks_ended"), dict) else None,
            )
        )
    return out
