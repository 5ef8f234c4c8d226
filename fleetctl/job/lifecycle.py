"""Coming back to a job: run records, live status, logs (collected or streamed), stop, collect.

Everything works from the controller run folder ``fleet-runs/<job-id>/`` alone, from any
terminal: ``plan.json`` says what runs where, ``connect.json`` how to reach the nodes again (the
node list with address, port, user, key file, known_hosts, ssh_config, workdir, python — never
env values or secrets — plus the inventory path and ``--limit`` for people), ``job.json`` what
happened. Retry attempts live next to it as ``<job-id>.<k>/`` and are listed under the job.

Library code: raises ``FleetctlError`` subclasses, never prints. Node-side work is one remote
command per node per action: the installed supervisor's ``status``/``stop``/``pack`` modes (it
is installed first when a newer fleetctl finds it missing), or a small stdlib follower for logs.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError, RunFolderError, UsageError
from fleetctl.job.runfolder import RunFolder, iso, list_runs, load_run
from fleetctl.node import Node
from fleetctl.phases.frames import FOLLOW_KINDS, FrameReader, last_data

if TYPE_CHECKING:
    from fleetctl.phases.collect import NodeCollect
    from fleetctl.phases.teardown import NodeStop, TeardownReport
    from fleetctl.plan.rankplan import Plan
    from fleetctl.ssh.connection import Connection, SSHSettings
    from fleetctl.ssh.fleet import Fleet

CONNECT_FILE = "connect.json"
EXTERNAL_STOP_REASON = "stopped by `fleetctl stop`"  # supervisors relay it to an attached run
ATTEMPTS_FILE = "attempts.json"
LIVE_STATES = frozenset({"starting", "running", "detached"})
ATTEMPT_RE = re.compile(r"^(?P<base>.+)\.(?P<k>[0-9]+)$")
STATUS_TIMEOUT = 30.0
_NODE_FIELDS = (
    "name",
    "address",
    "port",
    "user",
    "key_file",
    "nic",
    "train_addr",
    "gpus",
    "workdir",
    "python",
    "known_hosts",
    "ssh_config",
    "local",
    "groups",
)


# ------------------------------------------------------------------------------ reconnect


def write_connect(
    folder: str | Path,
    nodes: Sequence[Node],
    *,
    inventory: str | None = None,
    limit: str | None = None,
) -> None:
    """Record how to reach the job's nodes again (no env values, no secrets)."""
    data = {
        "inventory": os.path.abspath(inventory) if inventory else None,
        "limit": limit,
        "nodes": [
            {k: list(v) if isinstance(v, tuple) else v for k, v in _node_fields(n).items()}
            for n in nodes
        ],
    }
    path = Path(folder) / CONNECT_FILE
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _node_fields(n: Node) -> dict[str, Any]:
    return {k: getattr(n, k) for k in _NODE_FIELDS}


def load_nodes(folder: RunFolder) -> list[Node]:
    """The job's nodes in rank order: ``connect.json``, else what ``plan.json`` knows."""
    path = folder.path / CONNECT_FILE
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            nodes = []
            for d in data["nodes"]:
                d = {k: v for k, v in d.items() if k in _NODE_FIELDS}
                d["groups"] = tuple(d.get("groups") or ())
                nodes.append(Node(**d))
            return nodes
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise RunFolderError(f"{path}: unreadable: {e}") from e
    try:
        plan = folder.load_plan()
    except RunFolderError:
        return []  # never launched: nothing to reach
    return [
        Node(
            name=n["host"],
            address=n["address"],
            workdir=n.get("workdir") or "~/.fleetctl",
            python=n.get("python") or "python3",
        )
        for n in plan.get("nodes", [])
    ]


def load_plan(folder: RunFolder) -> Plan:
    from fleetctl.plan.rankplan import Plan

    return Plan.from_dict(folder.load_plan())


# ---------------------------------------------------------------------------- run records


@dataclass
class RunRecord:
    """One line of ``fleetctl runs``."""

    job_id: str
    launcher: str | None
    nodes: int
    status: str
    started: str | None
    duration: float | None
    first_failure: str | None
    attempts: int = 1
    detached: bool = False
    folder: str = ""
    roles: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "launcher": self.launcher,
            "nodes": self.nodes,
            "status": self.status,
            "started": self.started,
            "duration": self.duration,
            "first_failure": self.first_failure,
            "attempts": self.attempts,
            "detached": self.detached,
            "folder": self.folder,
        }


def describe_failure(ff: dict[str, Any] | None) -> str | None:
    """``node 1 (node2): exit code 1 after 3.2 s`` from job.json's ``first_failure``."""
    if not ff:
        return None
    if ff.get("state") == "lost":
        how = "lost" + (f" ({ff['reason']})" if ff.get("reason") else "")
    elif ff.get("state") == "start_failed":
        how = "could not start" + (f" ({ff['reason']})" if ff.get("reason") else "")
    elif ff.get("signal") is not None:
        from fleetctl.job.retry import signal_name

        how = f"signal {ff['signal']} ({signal_name(int(ff['signal']))})"
    else:
        how = f"exit code {ff.get('exit_code')}"
    after = f" after {ff['after']:.1f} s" if isinstance(ff.get("after"), (int, float)) else ""
    return f"node {ff.get('rank')} ({ff.get('host')}): {how}{after}"


def list_records(runs_dir: str | Path) -> list[RunRecord]:
    """Every job under ``runs_dir``, oldest first; retry attempts fold into their job."""
    jobs = list_runs(runs_dir)
    by_id = {j.get("job_id"): j for j in jobs if j.get("job_id")}
    latest: dict[str, tuple[int, dict[str, Any]]] = {}
    order: list[str] = []
    for j in jobs:
        jid = str(j.get("job_id") or "")
        m = ATTEMPT_RE.match(jid)
        base, k = (
            (m.group("base"), int(m.group("k")))
            if m and m.group("base") in by_id
            else (
                jid,
                int(j.get("attempt") or 1),
            )
        )
        if base not in latest:
            order.append(base)
        if base not in latest or k >= latest[base][0]:
            latest[base] = (k, j)
    out = []
    for base in order:
        k, j = latest[base]
        first = by_id.get(base, j)
        status = str(j.get("status") or "?")
        if j.get("detached") and status in LIVE_STATES:
            status = "detached"
        out.append(
            RunRecord(
                job_id=base,
                launcher=j.get("launcher"),
                nodes=len(j.get("nodes") or []),
                status=status,
                started=first.get("started"),
                duration=_duration(first.get("started"), j.get("ended")),
                first_failure=describe_failure(j.get("first_failure")),
                attempts=k,
                detached=bool(j.get("detached")),
                folder=str(j.get("folder") or Path(runs_dir) / base),
            )
        )
    return out


def _parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    import calendar

    try:
        main, _, frac = text.rstrip("Z").partition(".")
        t = calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S"))
        return t + (int(frac) / 10 ** len(frac) if frac.isdigit() else 0.0)
    except ValueError:
        return None


def _duration(started: str | None, ended: str | None) -> float | None:
    a, b = _parse_iso(started), _parse_iso(ended)
    return None if a is None or b is None else round(b - a, 3)


def latest_attempt(runs_dir: str | Path, job_id: str) -> RunFolder:
    """The folder of a job's latest attempt (``<job>.<k>`` with the highest k, else the job)."""
    try:
        folder = load_run(runs_dir, job_id)
    except RunFolderError:
        # A prefix matching a job and its own attempts (<job>.<k>) still names one job.
        root = Path(runs_dir)
        names = {p.name for p in root.glob(f"{job_id}*") if p.is_dir()} if root.is_dir() else set()
        bases = {
            m.group("base") if (m := ATTEMPT_RE.match(n)) and m.group("base") in names else n
            for n in names
        }
        if len(bases) != 1:
            raise
        folder = RunFolder(root / bases.pop())
    base = folder.path.name
    best, best_k = folder, 1
    root = folder.path.parent
    for p in root.glob(f"{base}.*"):
        m = ATTEMPT_RE.match(p.name)
        if m and m.group("base") == base and p.is_dir() and int(m.group("k")) > best_k:
            best, best_k = RunFolder(p), int(m.group("k"))
    return best


# ------------------------------------------------------------------------------ node side


def ensure_supervisor(fleet: Fleet, nodes: Sequence[Node] | None = None) -> dict[str, str]:
    """Make sure this fleetctl's supervisor is on every node (for status/stop/pack); returns
    node name -> its path. Uploads it (atomically) only where it is missing."""
    from fleetctl.phases.launch import SUPERVISOR_FILE, supervisor_path

    def one(node: Node, conn: Connection) -> str:
        sup = supervisor_path(conn.expand(node.workdir))
        res = conn.run(f"test -f {shlex.quote(sup)}", timeout=STATUS_TIMEOUT)
        if res.exit_code != 0:
            conn.run(["mkdir", "-p", "-m", "700", os.path.dirname(sup)], timeout=STATUS_TIMEOUT)
            conn.put(SUPERVISOR_FILE, sup, mode=0o700)
        return sup

    res = fleet.map(one, timeout=STATUS_TIMEOUT + 30, nodes=nodes)
    return {k: v for k, v in res.succeeded.items()}


def request_stop(
    fleet: Fleet,
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
class NodeState:
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
    fleet: Fleet,
    plan: Plan,
    nodes: Sequence[Node],
    *,
    ensure: bool = True,
    timeout: float = STATUS_TIMEOUT,
) -> list[NodeState]:
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
            out.append(NodeState(np.node_rank, np.host, "unreachable", error=_one_line(r)))
            continue
        state = r.get("state") or "absent"
        if not r.get("job_id") and not r.get("processes"):
            state = "absent"
        out.append(
            NodeState(
                rank=np.node_rank,
                host=np.host,
                state=state,
                pid=r.get("pid"),
                exit_code=r.get("exit_code"),
                signal=r.get("signal"),
                processes=list(r.get("processes") or []),
                detached=bool(r.get("detached")),
                start_time=r.get("start_time"),
                end_time=r.get("end_time"),
                stop_reason=r.get("stop_reason"),
            )
        )
    return out


def _one_line(e: object) -> str:
    text = getattr(e, "one_line", None)
    return text() if callable(text) else " ".join(str(e).split()) or type(e).__name__


# ------------------------------------------------------------------------------- the job


class JobHandle:
    """A job found by id in a runs folder, with a lazily opened fleet to its nodes."""

    def __init__(
        self, runs_dir: str | Path, job_id: str, settings: SSHSettings | None = None
    ) -> None:
        self.folder = latest_attempt(runs_dir, job_id)
        self.job = self.folder.load_job()
        self.nodes = load_nodes(self.folder)
        self._plan: Plan | None = None
        self.stop_time: float | None = None
        self.settings = settings
        self._fleet: Fleet | None = None

    @property
    def job_id(self) -> str:
        return str(self.job.get("job_id") or self.folder.job_id)

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            try:
                self._plan = load_plan(self.folder)
            except RunFolderError as e:
                raise RunFolderError(
                    f"job {self.job_id} has no plan.json: it never launched ({e})"
                ) from e
        return self._plan

    @property
    def live(self) -> bool:
        """job.json says the job may still run (a crashed controller leaves 'running')."""
        return str(self.job.get("status")) in LIVE_STATES

    @property
    def fleet(self) -> Fleet:
        if self._fleet is None:
            from fleetctl.ssh.fleet import Fleet

            self._fleet = Fleet(self.nodes, self.settings)
        return self._fleet

    def close(self) -> None:
        if self._fleet is not None:
            self._fleet.close()
            self._fleet = None

    def __enter__(self) -> JobHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pythons(self) -> dict[str, str]:
        return {n.name: n.python for n in self.nodes}

    def node_folder(self, rank: int, host: str) -> Path:
        return self.folder.node_folder(rank, host)

    def select(self, node: str | None) -> list[tuple[int, str]]:
        """(rank, host) of the job's nodes, or of the one named by rank or host name."""
        ranks = [(int(n["rank"]), str(n["host"])) for n in self.job.get("nodes") or []]
        if not ranks:
            ranks = [(np.node_rank, np.host) for np in self.plan.nodes]
        if node is None:
            return ranks
        chosen = [(r, h) for r, h in ranks if str(r) == node or h == node]
        if not chosen:
            names = ", ".join(f"{r} {h}" for r, h in ranks)
            raise UsageError(f"job {self.job_id} has no node {node!r} (nodes: {names})")
        return chosen

    # -- actions ------------------------------------------------------------------------
    def status(self) -> list[NodeState]:
        """Per-node state: the supervisors' answers when live, else job.json's record."""
        if self.live:
            return node_states(self.fleet, self.plan, self.nodes)
        out = []
        for n in self.job.get("nodes") or []:
            out.append(
                NodeState(
                    rank=int(n["rank"]),
                    host=str(n["host"]),
                    state=str(n.get("state")),
                    exit_code=n.get("exit_code"),
                    signal=n.get("signal"),
                    start_time=_parse_iso(n.get("start_time")),
                    end_time=_parse_iso(n.get("end_time")),
                    error=n.get("reason"),
                )
            )
        return out

    def stop(self, grace: float = 5.0) -> TeardownReport:
        """Stop the job on every node (same teardown + verification as after a failure)."""
        from fleetctl.phases.teardown import teardown

        ensure_supervisor(self.fleet, self.nodes)
        request_stop(self.fleet, self.plan, self.nodes)
        self.stop_time = time.time()
        report = teardown(self.fleet, self.plan, grace=grace, pythons=self.pythons())
        self._event(
            f"stop requested from a terminal: "
            f"{'verified clean' if report.verified else 'NOT verified'} ({report.seconds:.1f}s)"
        )
        return report

    def collect(self, *, stopped: bool = False) -> list[NodeCollect]:
        """Bring every node's run folder home and finalise job.json from the nodes' records
        (``stopped``: after :meth:`stop`, jobs that ended then count as stopped)."""
        from fleetctl.phases.collect import collect

        ensure_supervisor(self.fleet, self.nodes)
        results = collect(self.fleet, self.plan, self.folder.path, pythons=self.pythons())
        if not stopped:  # after a stop, mark_stopped finalises with the teardown's verdict
            with self.folder.locked():
                self._finalise(results)
        return results

    def _event(self, text: str) -> None:
        with contextlib.suppress(OSError):
            self.folder.event(text)

    def _finalise(
        self,
        results: Iterable[NodeCollect],
        stopped: bool = False,
        *,
        status: str | None = None,
        failed_first: dict[str, Any] | None = None,
        verified: Iterable[str] | None = None,
    ) -> bool:
        """Update job.json from each collected ``supervisor.json`` (a detached job's only
        record of how it ended). The job stays live while any node still runs.

        ``status`` (with ``failed_first`` for "failed"): the job monitor decided how the job
        ended and tore the rest down; the node that failed first keeps its own state, peers
        the teardown stopped are "stopped" nodes of a failed job, and ``verified`` (hosts the
        teardown verified clean) tells which nodes with no record back are surely not running.
        Returns True when this call wrote the job's final status.

        Call with ``self.folder.locked()`` held: it starts from job.json as it is *now*, since
        an attached run may have written its own final record meanwhile (that one stands).
        """
        with contextlib.suppress(RunFolderError):
            self.job = self.folder.load_job()
        job = dict(self.job)
        nodes = [dict(n) for n in job.get("nodes") or []]
        by_rank = {int(n["rank"]): n for n in nodes}
        collected = {c.rank: c for c in results}
        first_rank = None if failed_first is None else failed_first.get("rank")
        still = False
        for rank, c in collected.items():
            node = by_rank.get(rank)
            if node is None:
                continue
            node["folder"] = c.folder
            node["collected"] = c.error is None and c.skipped is None
            sup = _read_json(Path(c.folder) / "supervisor.json")
            if not sup:
                continue
            st = sup.get("state")
            if st == "running":
                still = True
                continue
            node["exit_code"], node["signal"] = sup.get("exit_code"), sup.get("signal")
            node["end_time"] = iso(sup.get("end_time"))
            node["start_time"] = node.get("start_time") or iso(sup.get("start_time"))
            ended = sup.get("end_time")
            by_stop = (
                (stopped or failed_first is not None)  # ended by our teardown
                and self.stop_time is not None
                and isinstance(ended, (int, float))
                and ended >= self.stop_time - 1.0
            )
            if rank == first_rank:
                continue  # set from the monitor's record below
            if st == "stopped" or by_stop:
                node["state"] = "stopped"
                node["reason"] = sup.get("stop_reason")
            else:
                node["state"] = "succeeded" if sup.get("exit_code") == 0 else "failed"
        if failed_first is not None and first_rank in by_rank:
            node = by_rank[first_rank]
            node["state"] = failed_first.get("state") or "failed"
            for k in ("exit_code", "signal", "reason"):
                if failed_first.get(k) is not None or k == "reason":
                    node[k] = failed_first.get(k)
            node["end_time"] = node.get("end_time") or failed_first.get("time")
        if stopped:  # nodes whose record did not come back were stopped all the same
            for node in nodes:
                if node.get("state") in ("running", "pending"):
                    node["state"] = "stopped"
        elif status is not None:
            clean = set(verified or ())
            for node in nodes:
                if node.get("state") in ("running", "pending"):
                    if node.get("host") in clean:
                        node["state"] = "stopped"
                    else:
                        node["state"] = "lost"
                        node["reason"] = "not reachable: the teardown could not verify it"
        # A node whose record did not come back (unreachable) may still run: the job stays live.
        still = still or any(n.get("state") in ("running", "pending") for n in nodes)
        job["nodes"] = nodes
        job["collected"] = [c.to_dict() for c in collected.values()]
        final = False
        if str(job.get("status")) in LIVE_STATES and (not still or status is not None):
            final = True
            states = [n.get("state") for n in nodes]
            failed = [n for n in nodes if n.get("state") in ("failed", "lost", "start_failed")]
            if status is not None:
                job["status"] = status
                if failed_first is not None:
                    ff = dict(failed_first)
                    where = by_rank.get(first_rank) or {}
                    ff.setdefault("address", where.get("train_addr") or where.get("address"))
                    job["first_failure"] = _with_after(ff, job.get("started"))
            elif stopped or ("stopped" in states and not failed):
                job["status"] = "stopped"
            elif all(s == "succeeded" for s in states):
                job["status"] = "succeeded"
            else:
                job["status"] = "failed"
            if job["status"] == "failed" and failed and not job.get("first_failure"):
                first = min(failed, key=lambda n: n.get("end_time") or "")
                job["first_failure"] = {
                    k: first.get(k)
                    for k in ("rank", "host", "state", "exit_code", "signal", "reason")
                } | {
                    "address": first.get("train_addr") or first.get("address"),
                    "time": first.get("end_time"),
                }
            ends = [n.get("end_time") for n in nodes if n.get("end_time")]
            job["ended"] = max(ends) if ends and status is None else iso(time.time())
            if job.get("started") and job.get("ended"):
                job["duration"] = _duration(job["started"], job["ended"])
        self.folder.write_job(job)
        self.job = job
        return final

    def mark_ended(
        self,
        status: str,
        report: TeardownReport,
        results: Iterable[NodeCollect],
        *,
        failed_first: dict[str, Any] | None = None,
    ) -> bool:
        """The job monitor's verdict: job.json says ``status`` (with who failed first), with
        the teardown report. A job that ended meanwhile (``fleetctl stop`` or ``collect`` from
        another terminal) keeps its own record. True when this verdict is the final record."""
        with self.folder.locked():
            final = self._finalise(
                results,
                status=status,
                failed_first=failed_first,
                verified={n.host for n in report.nodes if n.clean},
            )
            job = dict(self.job)
            if final:
                job["teardown"] = report.to_dict()
            self.folder.write_job(job)
            self.job = job
        return final

    def record_late_stop(self, stop: NodeStop, results: Iterable[NodeCollect]) -> None:
        """A lost node reached again after the job ended: its teardown outcome and collected
        logs join job.json's record (the job's status and first failure stand)."""
        with self.folder.locked():
            with contextlib.suppress(RunFolderError):
                self.job = self.folder.load_job()
            job = dict(self.job)
            td = dict(job.get("teardown") or {"nodes": []})
            td_nodes = [n for n in td.get("nodes") or [] if n.get("host") != stop.host]
            td["nodes"] = sorted([*td_nodes, stop.to_dict()], key=lambda n: n.get("rank", 0))
            td["verified"] = all(
                not n.get("remaining") and not n.get("error") and not n.get("skipped")
                for n in td["nodes"]
            )
            job["teardown"] = td
            nodes = [dict(n) for n in job.get("nodes") or []]
            collected = [dict(c) for c in job.get("collected") or []]
            for c in results:
                collected = [x for x in collected if x.get("rank") != c.rank] + [c.to_dict()]
                for n in nodes:
                    if n.get("rank") == c.rank:
                        n["folder"] = c.folder
                        n["collected"] = c.error is None and c.skipped is None
            for n in nodes:
                if n.get("host") == stop.host and stop.clean:
                    n["reason"] = f"{n.get('reason') or 'lost'}; stopped when it answered again"
            job["nodes"] = nodes
            job["collected"] = sorted(collected, key=lambda c: c.get("rank", 0))
            self.folder.write_job(job)
            self.job = job

    def mark_stopped(self, report: TeardownReport, results: Iterable[NodeCollect]) -> None:
        """After ``stop`` + ``collect``: job.json says stopped, with the teardown report.

        A stop that could not verify every node leaves the job live (a later ``stop`` retries).
        """
        with self.folder.locked():
            self._finalise(results, stopped=report.verified)
            job = dict(self.job)
            job["teardown"] = report.to_dict()
            if report.verified and str(job.get("status")) in LIVE_STATES:
                job["status"] = "stopped"
                job["ended"] = iso(time.time())
            self.folder.write_job(job)
            self.job = job

    # -- logs ---------------------------------------------------------------------------
    def collected_log(self, rank: int, host: str) -> Path | None:
        folder = self.node_folder(rank, host)
        for name in ("console.log", "console.streamed.log"):
            if (folder / name).is_file():
                return folder / name
        return None

    def follow(
        self,
        ranks: Sequence[tuple[int, str]],
        on_line: Callable[[int, str, str], None],
        *,
        follow: bool = True,
        lines: int | None = None,
        stop: threading.Event | None = None,
        timeout: float | None = None,
    ) -> dict[int, str | None]:
        """Stream the nodes' live ``console.log`` (one streamed SSH command per node).

        Calls ``on_line(rank, host, text)`` for every whole line; returns when every node's
        job ended and its log was read to the end (``follow``), at once after the current
        content (not ``follow``), when ``stop`` is set, or after ``timeout``. Returns rank ->
        error (None = fine).
        """
        stop = stop or threading.Event()
        q: queue.Queue[tuple[int, str, str | None]] = queue.Queue()
        by_name = {n.name: n for n in self.nodes}
        errors: dict[int, str | None] = {}
        threads = []
        for rank, host in ranks:
            node = by_name.get(host)
            if node is None:
                errors[rank] = "not in connect.json"
                continue
            t = threading.Thread(
                target=self._follow_one,
                args=(rank, node, q, stop, follow, lines),
                daemon=True,
                name=f"logs-{rank}",
            )
            threads.append(t)
            t.start()
        pending = {rank for rank, _ in ranks if rank not in errors}
        hosts = dict(ranks)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while pending:
                if stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                    break
                try:
                    rank, kind, text = q.get(timeout=0.2)
                except queue.Empty:
                    continue
                if kind == "line":
                    on_line(rank, hosts[rank], text or "")
                else:
                    errors[rank] = text
                    pending.discard(rank)
        finally:
            stop.set()
            for t in threads:
                t.join(3.0)
        while True:  # lines already read before the end
            try:
                rank, kind, text = q.get_nowait()
            except queue.Empty:
                break
            if kind == "line":
                on_line(rank, hosts[rank], text or "")
        return errors

    def _follow_one(
        self,
        rank: int,
        node: Node,
        q: queue.Queue[tuple[int, str, str | None]],
        stop: threading.Event,
        follow: bool,
        lines: int | None,
    ) -> None:
        from fleetctl.phases.launch import start_command, supervisor_path, upload_on_request

        stream = None
        try:
            conn = self.fleet.connection(node)
            np = self.plan.node(node.name)
            sup = supervisor_path(conn.expand(node.workdir))
            args = ["follow", "--run-dir", conn.expand(np.run_dir)]
            args += [
                "--follow",
                "1" if follow else "0",
                "--last",
                str(-1 if lines is None else lines),
            ]
            stream = conn.start(start_command(conn.expand(node.python), sup, *args))
            reader = FrameReader(kinds=FOLLOW_KINDS)
            while not stop.is_set():
                data = stream.recv(0.3)
                if data is None:
                    continue
                frames = reader.feed(data) if data else reader.flush()
                for fr in frames:
                    if fr.kind == "L":
                        q.put((rank, "line", fr.text))
                    elif fr.kind == "E":
                        q.put((rank, "line", f"[fleetctl] {fr.text}"))
                    elif fr.kind == "U":  # the supervisor is not there yet: the loader asks
                        upload_on_request(stream)
                if not data:
                    code = stream.exit_code(2.0)
                    q.put((rank, "end", None if code == 0 else f"log follower exited {code}"))
                    return
            q.put((rank, "end", None))
        except Exception as e:  # every node's outcome is kept; never a silent thread death
            q.put((rank, "end", _one_line(e)))
        finally:
            if stream is not None:
                with contextlib.suppress(Exception):
                    stream.close()


def _with_after(ff: dict[str, Any], started: str | None) -> dict[str, Any]:
    """``after``: seconds from the job's start to the failure (as an attached run records)."""
    if ff.get("after") is None:
        a, b = _parse_iso(started), _parse_iso(ff.get("time"))
        ff["after"] = None if a is None or b is None else round(max(0.0, b - a), 3)
    return ff


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
