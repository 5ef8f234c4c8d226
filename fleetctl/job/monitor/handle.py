"""Coming back to a job from its run folder: live status, stop, collect, and the final
record of a job nobody watched to the end.

Works from ``fleet-runs/<job-id>/`` alone, from any terminal: ``plan.json`` says what runs
where, ``connect.json`` how to reach the nodes again, ``job.json`` what happened. Retry
attempts live next to it as ``<job-id>.<k>/``; the latest one is the job's handle. Library
code: raises ``FleetctlError`` subclasses, never prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import RunFolderError, UsageError
from fleetctl.job.records.jobrecord import FailureRecord, NodeRecord
from fleetctl.job.records.runfolder import iso, read_json
from fleetctl.job.records.state import JobState, JobStatus, NodeState, exit_state, node_state
from fleetctl.remote.kit.records import RecordError, SupervisorState
from fleetctl.remote.kit.wire import STATE_FILE

if TYPE_CHECKING:
    from fleetctl.phases.collect import CollectOptions, NodeCollect
    from fleetctl.phases.stacks import StackReport
    from fleetctl.phases.teardown import NodeStop, TeardownReport
    from fleetctl.plan.rankplan import Plan
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import SSHSettings

from fleetctl.job.monitor.supervisors import (
    NodeReport,
    ensure_supervisor,
    node_states,
    request_stop,
)
from fleetctl.job.records.runs import _duration, _parse_iso, latest_attempt, load_nodes, load_plan

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
        self._fleet: FanOut | None = None

    @property
    def job_id(self) -> str:
        return self.job.job_id or self.folder.job_id

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
        return self.job.live

    @property
    def fleet(self) -> FanOut:
        if self._fleet is None:
            from fleetctl.ssh.fanout import FanOut

            self._fleet = FanOut(self.nodes, self.settings)
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
        ranks = [(n.rank, n.host) for n in self.job.nodes]
        if not ranks:
            ranks = [(np.node_rank, np.host) for np in self.plan.nodes]
        if node is None:
            return ranks
        chosen = [(r, h) for r, h in ranks if str(r) == node or h == node]
        if not chosen:
            names = ", ".join(f"{r} {h}" for r, h in ranks)
            raise UsageError(f"job {self.job_id} has no node {node!r} (nodes: {names})")
        return chosen

    def controller(self) -> dict[str, Any] | None:
        """The ``fleetctl run`` that created the run folder: ``pid``, ``host`` and ``alive``
        (None when it ran on another machine: its pid means nothing here). None when the
        folder has no record of it."""
        import socket

        from fleetctl.job.monitor.process import monitor_alive

        info = self.folder.load_controller()
        if info is None:
            return None
        here = info.host in (None, socket.gethostname())
        return {
            "pid": info.pid,
            "host": info.host,
            "alive": monitor_alive(info.to_dict()) if here else None,
        }

    # -- actions ------------------------------------------------------------------------
    def status(self) -> list[NodeReport]:
        """Per-node state: the supervisors' answers when live, else job.json's record."""
        if self.live:
            return node_states(self.fleet, self.plan, self.nodes)
        out = []
        for n in self.job.nodes:
            out.append(
                NodeReport(
                    rank=n.rank,
                    host=n.host,
                    state=n.state,
                    exit_code=n.exit_code,
                    signal=n.signal,
                    start_time=_parse_iso(n.start_time),
                    end_time=_parse_iso(n.end_time),
                    error=n.reason,
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

    def stacks(self) -> tuple[StackReport, Path]:
        """Every process's stack on every node of the live job (py-spy only: the job goes
        on), saved in the run folder; returns the report and the saved file."""
        from fleetctl.phases.stacks import dump_stacks

        if not self.live:
            raise UsageError(f"job {self.job_id} is {self.job.status}: nothing runs")
        report = dump_stacks(self.fleet, self.plan, pythons=self.pythons(), abort=False)
        parts = []
        for n in report.nodes:
            for p in n.processes:
                who = "launcher" if p.get("rank") is None else f"rank {p['rank']}"
                head = f"== node {n.rank} ({n.host}) pid {p['pid']} {who}: {p['method']}"
                parts.append(head + "\n" + (p.get("text") or f"not dumped: {p.get('error')}\n"))
            if n.error:
                parts.append(f"== node {n.rank} ({n.host}): {n.error}\n")
        saved = self.folder.write_stacks("\n".join(parts))
        self._event(f"stacks dumped on demand into {saved.name}")
        return report, saved

    def collect_options(self) -> CollectOptions:
        """The cap and excludes the run was started with (connect.json), else the defaults."""
        from fleetctl.phases.collect import CollectOptions

        data: dict[str, Any] = {}
        if self.folder.has_connect:
            with contextlib.suppress(RunFolderError):
                data = self.folder.load_connect().collect or {}
        return CollectOptions.from_dict(data)

    def collect(
        self, *, stopped: bool = False, options: CollectOptions | None = None
    ) -> list[NodeCollect]:
        """Bring home what of every node's run folder is not home yet (same size and mtime
        counts as home) and finalise job.json from the nodes' records (``stopped``: after
        :meth:`stop`, jobs that ended then count as stopped). ``options``: cap and excludes
        for this collection, else the run's."""
        from fleetctl.phases.collect import check_console, collect

        ensure_supervisor(self.fleet, self.nodes)
        results = collect(
            self.fleet,
            self.plan,
            self.folder.path,
            pythons=self.pythons(),
            options=options or self.collect_options(),
        )
        results = [self._home_already(c) for c in results]
        started = {n.rank for n in self.job.nodes if n.start_time}
        for c in results:  # a started job's console.log must come home
            if c.rank in started:
                check_console(c)
        if not stopped:  # after a stop, mark_stopped finalises with the teardown's verdict
            with self.folder.locked():
                self._finalise(results)
        return results

    def _home_already(self, c: NodeCollect) -> NodeCollect:
        """A node this collection could not reach, whose logs the job's own collection brought
        home whole after it ended: that record stands. An ended Slurm allocation (its srun
        steps refused) or a node powered off since is no reason to call them incomplete."""
        node = next((n for n in self.job.nodes if n.rank == c.rank), None)
        before = next((d for d in self.job.collected if d.get("rank") == c.rank), None)
        if c.error is None or node is None or before is None or not node.collected:
            return c
        if not node_state(node.state).ended or before.get("complete") is not True:
            return c
        if before.get("not_collected") or not (Path(c.folder) / "console.log").is_file():
            return c
        files, size = list(before.get("files") or []), int(before.get("bytes") or 0)
        return dataclasses.replace(c, error=None, unreachable=c.error, files=files, bytes=size)

    def _event(self, text: str) -> None:
        with contextlib.suppress(OSError):
            self.folder.event(text)

    def _finalise(
        self,
        results: Iterable[NodeCollect],
        stopped: bool = False,
        *,
        status: str | None = None,
        failed_first: FailureRecord | None = None,
        verified: Iterable[str] | None = None,
        tore_down: bool = False,
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
        job = self.job.copy()
        nodes = [n.copy() for n in job.nodes]
        by_rank = {n.rank: n for n in nodes}
        collected = {c.rank: c for c in results}
        first_rank = None if failed_first is None else failed_first.rank
        still = False
        for rank, c in collected.items():
            node = by_rank.get(rank)
            if node is None:
                continue
            node.folder = c.folder
            node.collected = c.error is None and c.skipped is None
            try:
                sup = SupervisorState.from_dict(read_json(Path(c.folder) / STATE_FILE))
            except (RunFolderError, RecordError):  # not (whole) home, or not a record of one:
                continue  # the node's end stays unknown
            st = sup.state
            if st is None:
                continue
            if st == NodeState.RUNNING:
                still = True
                continue
            node.exit_code, node.signal = sup.exit_code, sup.signal
            node.end_time = iso(sup.end_time)
            node.start_time = node.start_time or iso(sup.start_time)
            ended = sup.end_time
            by_stop = (
                (stopped or tore_down or failed_first is not None)  # ended by our teardown
                and self.stop_time is not None
                and ended is not None
                and ended >= self.stop_time - 1.0
            )
            if rank == first_rank:
                continue  # set from the monitor's record below
            if st == NodeState.STOPPED or by_stop:
                node.state = str(NodeState.STOPPED)
                node.reason = sup.stop_reason
            else:
                node.state = str(exit_state(0 if sup.exit_code == 0 else 1, stopping=False))
        if failed_first is not None and first_rank in by_rank:
            node = by_rank[first_rank]
            node.state = failed_first.state or str(NodeState.FAILED)
            if failed_first.exit_code is not None:
                node.exit_code = failed_first.exit_code
            if failed_first.signal is not None:
                node.signal = failed_first.signal
            node.reason = failed_first.reason
            node.end_time = node.end_time or failed_first.time
        if stopped:  # nodes whose record did not come back were stopped all the same
            for node in nodes:
                if not node_state(node.state).ended:
                    node.state = str(NodeState.STOPPED)
        elif status is not None:
            clean = set(verified or ())
            for node in nodes:
                if not node_state(node.state).ended:
                    if node.host in clean:
                        node.state = str(NodeState.STOPPED)
                    else:
                        node.state = str(NodeState.LOST)
                        node.reason = "not reachable: the teardown could not verify it"
        # A node whose record did not come back (unreachable) may still run: the job stays live.
        still = still or any(not node_state(n.state).ended for n in nodes)
        job.nodes = nodes
        job.collected = [c.to_dict() for c in collected.values()]
        final = False
        if job.live and (not still or status is not None):
            final = True
            machine = _replay(nodes)
            if status is not None:
                job.status = status
                if failed_first is not None:
                    ff = failed_first.copy()
                    where = by_rank.get(ff.rank)
                    if ff.address is None and where is not None:
                        ff.address = where.train_addr or where.address
                    job.first_failure = _with_after(ff, job.started)
            else:
                job.status = str(JobStatus.STOPPED if stopped else machine.outcome())
            if (
                job.status == JobStatus.FAILED
                and machine.first_failure is not None
                and not job.first_failure
            ):
                first = nodes[machine.first_failure]
                job.first_failure = FailureRecord(
                    rank=first.rank,
                    host=first.host,
                    state=first.state,
                    exit_code=first.exit_code,
                    signal=first.signal,
                    reason=first.reason,
                    address=first.train_addr or first.address,
                    time=first.end_time,
                )
            ends = [n.end_time for n in nodes if n.end_time]
            job.ended = max(ends) if ends and status is None else iso(time.time())
            if job.started and job.ended:
                job.duration = _duration(job.started, job.ended)
        self.folder.write_job(job)
        self.job = job
        return final

    def mark_ended(
        self,
        status: str,
        report: TeardownReport,
        results: Iterable[NodeCollect],
        *,
        failed_first: FailureRecord | None = None,
        extra: dict[str, Any] | None = None,
        tore_down: bool = False,
    ) -> bool:
        """The job monitor's verdict: job.json says ``status`` (with who failed first), with
        the teardown report and ``extra`` fields (``verdict`` and ``stacks`` of a job that
        timed out or stalled). ``tore_down``: the monitor stopped the job (a node failed
        first, or a limit was reached): nodes that ended after that count as stopped. A job
        that ended meanwhile (``fleetctl stop`` or ``collect`` from another terminal) keeps
        its own record. True when this verdict is the final record."""
        with self.folder.locked():
            final = self._finalise(
                results,
                status=status,
                failed_first=failed_first,
                verified={n.host for n in report.nodes if n.clean},
                tore_down=tore_down,
            )
            job = self.job.copy()
            if final:
                job.teardown = report.to_dict()
                for key, value in (extra or {}).items():
                    setattr(job, key, value)
            self.folder.write_job(job)
            self.job = job
        return final

    def record_late_stop(self, stop: NodeStop, results: Iterable[NodeCollect]) -> None:
        """A lost node reached again after the job ended: its teardown outcome and collected
        logs join job.json's record (the job's status and first failure stand)."""
        with self.folder.locked():
            with contextlib.suppress(RunFolderError):
                self.job = self.folder.load_job()
            job = self.job.copy()
            td = dict(job.teardown or {"nodes": []})
            td_nodes = [n for n in td.get("nodes") or [] if n.get("host") != stop.host]
            td["nodes"] = sorted([*td_nodes, stop.to_dict()], key=lambda n: n.get("rank", 0))
            td["verified"] = all(
                not n.get("remaining") and not n.get("error") and not n.get("skipped")
                for n in td["nodes"]
            )
            job.teardown = td
            nodes = [n.copy() for n in job.nodes]
            collected = [dict(c) for c in job.collected]
            for c in results:
                collected = [x for x in collected if x.get("rank") != c.rank] + [c.to_dict()]
                for n in nodes:
                    if n.rank == c.rank:
                        n.folder = c.folder
                        n.collected = c.error is None and c.skipped is None
            for n in nodes:
                if n.host == stop.host and stop.clean:
                    n.reason = f"{n.reason or 'lost'}; stopped when it answered again"
            job.nodes = nodes
            job.collected = sorted(collected, key=lambda c: c.get("rank", 0))
            self.folder.write_job(job)
            self.job = job

    def mark_stopped(self, report: TeardownReport, results: Iterable[NodeCollect]) -> None:
        """After ``stop`` + ``collect``: job.json says stopped, with the teardown report.

        A stop that could not verify every node leaves the job live (a later ``stop`` retries).
        """
        with self.folder.locked():
            self._finalise(results, stopped=report.verified)
            job = self.job.copy()
            job.teardown = report.to_dict()
            if report.verified and job.live:
                job.status = str(JobStatus.STOPPED)
                job.ended = iso(time.time())
            self.folder.write_job(job)
            self.job = job

    # -- logs ---------------------------------------------------------------------------
    def collected_log(self, rank: int, host: str) -> Path | None:
        folder = self.node_folder(rank, host)
        for name in ("console.log", "console.streamed.log"):
            if (folder / name).is_file():
                return folder / name
        return None


def _replay(nodes: Sequence[NodeRecord]) -> JobState:
    """job.json's node records through the state machine: successes and stops as they stand,
    the bad ends in the order they happened (ISO times sort as text), so the first failure
    is the state machine's."""
    states = [node_state(n.state) for n in nodes]
    machine = JobState(len(nodes), None, [NodeState.RUNNING if s.bad else s for s in states])
    for i in sorted(
        (i for i, s in enumerate(states) if s.bad),
        key=lambda i: (nodes[i].end_time or "", i),
    ):
        machine.end(i, states[i])
    return machine


def _with_after(ff: FailureRecord, started: str | None) -> FailureRecord:
    """``after``: seconds from the job's start to the failure (as an attached run records)."""
    if ff.after is None:
        a, b = _parse_iso(started), _parse_iso(ff.time)
        ff.after = None if a is None or b is None else round(max(0.0, b - a), 3)
    return ff
