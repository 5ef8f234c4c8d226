"""Coming back to a job by id: what ``fleetctl status``, ``logs``, ``stop``, ``collect``,
``stacks`` and ``monitor`` do, as calls that return reports (``Job.status()`` and friends).

Each works from the run folder alone (``JobHandle``: plan, connect.json, job.json) and reaches
the nodes only when the job may still run there. Nothing prints: progress a command shows
between steps comes through ``on_note`` (one line of text each).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import threading

    from fleetctl.api.runspec import Observe
    from fleetctl.job.diagnose.stacks import StackGroup
    from fleetctl.job.monitor.handle import JobHandle
    from fleetctl.job.monitor.supervisors import NodeReport
    from fleetctl.job.records.jobrecord import JobRecord
    from fleetctl.job.records.members import Member
    from fleetctl.phases.collect import CollectOptions, NodeCollect
    from fleetctl.phases.stacks import StackReport
    from fleetctl.phases.teardown import TeardownReport
    from fleetctl.transport.connection import SSHSettings

Note = Callable[[str], None]


@dataclass
class StatusReport:
    """``fleetctl status``: the job's record and every node's state (asked of the
    supervisors while the job may run); ``to_dict()`` is ``--json``. A result over hosts
    (``fleetctl.results.Outcome``): ``exit_code`` is the job's as ``run`` exits with it (0 while
    it runs), ``failed`` each node that ended badly or could not be asked."""

    job_id: str
    status: str
    detached: bool
    live: bool
    folder: str
    attempt: int
    nodes: list[NodeReport]
    left_out: dict[str, str]
    monitor: dict[str, Any] | None = None  # the detached job's monitor: pid, alive, phase, log
    running_nodes: int | None = None  # live only
    controller: dict[str, Any] | None = None  # live, attached: pid, host, alive
    hint: str | None = None  # what to do next, one line
    #: a submitted job (the sbatch executor): slurm.json, ``now`` Slurm's line
    slurm: dict[str, Any] | None = None
    #: run --elastic: each slot's holder and the hosts that lost theirs
    #: (fleetctl.job.records.members)
    members: list[Member] | None = None

    @property
    def exit_code(self) -> int:
        from fleetctl.api.result import status_exit_code

        return status_exit_code(self.status, self.live)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def failed(self) -> dict[str, str]:
        """Host → what its node says went wrong (``exit code 1``, ``signal 9``, ``lost``,
        ``unreachable: …``), in rank order."""
        out: dict[str, str] = {}
        for n in sorted(self.nodes, key=lambda n: n.rank):
            if n.error:
                out[n.host] = f"{n.state}: {n.error}"
            elif n.state in ("lost", "unreachable"):
                out[n.host] = n.state
            elif n.signal is not None:
                out[n.host] = f"signal {n.signal}"
            elif n.exit_code:
                out[n.host] = f"exit code {n.exit_code}"
        return out

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "failed": self.failed,
            "job_id": self.job_id,
            "status": self.status,
            "detached": self.detached,
            "live": self.live,
            "folder": self.folder,
            "attempt": self.attempt,
            "nodes": [s.to_dict() for s in self.nodes],
            "left_out": self.left_out,
        }
        if self.live:
            data["running_nodes"] = self.running_nodes
            data["controller"] = self.controller
        if self.hint is not None:
            data["hint"] = self.hint
        data["monitor"] = self.monitor
        if self.slurm is not None:
            data["slurm"] = self.slurm
        if self.members is not None:
            data["members"] = [m.to_dict() for m in self.members]
        return data


@dataclass
class StopReport:
    """``fleetctl stop``: the teardown (``verified``: nothing of the job left anywhere), what
    was collected, the job's status after it, and what became of its monitor; a result over
    hosts (``fleetctl.results.Outcome``), ``failed`` the hosts whose end is not verified."""

    job_id: str
    teardown: TeardownReport
    status: str
    monitor: str | None = None  # "monitor pid N exited", None: no live monitor
    collected: list[NodeCollect] = field(default_factory=list)
    #: a submitted job stopped by scancel: its Slurm job id and state (the teardown is the
    #: fleetctl's inside the allocation, from job.json)
    slurm: dict[str, Any] | None = None

    @property
    def verified(self) -> bool:
        return bool(self.teardown.verified)

    @property
    def ok(self) -> bool:
        return self.verified

    @property
    def exit_code(self) -> int:
        """``fleetctl stop``'s: 0 verified, 3 (JobFailed) a node not verified."""
        return 0 if self.verified else 3

    @property
    def failed(self) -> dict[str, str]:
        """Host → why its end is not verified (the stop's error, why it was not asked, what
        is left), in rank order."""
        return {
            n.host: n.error or n.skipped or f"{len(n.remaining)} process(es) left"
            for n in sorted(self.teardown.nodes, key=lambda n: n.rank)
            if not n.clean
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "failed": self.failed,
            "job_id": self.job_id,
            "teardown": self.teardown.to_dict(),
            "status": self.status,
            "monitor": self.monitor,
        } | ({} if self.slurm is None else {"slurm": self.slurm})


@dataclass
class CollectReport:
    """``fleetctl collect``: each node's collection and the job's status after it; a result
    over hosts (``fleetctl.results.Outcome``), ``failed`` the hosts whose logs are not home."""

    job_id: str
    status: str
    collected: list[NodeCollect]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        """``fleetctl collect``'s: 0 every log home, 4 (LogsIncomplete) some are not."""
        return 0 if self.ok else 4

    @property
    def failed(self) -> dict[str, str]:
        """Host → why its logs are not all home, in rank order."""
        out: dict[str, str] = {}
        for c in sorted(self.collected, key=lambda c: c.rank):
            if c.incomplete:
                left = sorted({f["reason"] for f in c.not_collected})
                out[c.host] = c.error or c.skipped or "not home: " + ", ".join(left)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "failed": self.failed,
            "job_id": self.job_id,
            "status": self.status,
            "collected": [c.to_dict() for c in self.collected],
        }


@dataclass
class StacksReport:
    """``fleetctl stacks``: every process's stack, folded by innermost frame (``groups``),
    each node's dump, and the file in the run folder holding them all."""

    job_id: str
    groups: list[StackGroup]
    report: StackReport
    saved: Path

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "stacks": [dataclasses.asdict(g) for g in self.groups],
            "nodes": [n.to_dict() for n in self.report.nodes],
            "saved": str(self.saved),
        }


def status(h: JobHandle) -> StatusReport:
    from fleetctl.job.monitor.process import monitor_status
    from fleetctl.job.records.members import members

    states = h.status()
    report = StatusReport(
        job_id=h.job_id,
        status=h.job.status,
        detached=h.job.detached,
        live=h.live,
        folder=str(h.folder.path),
        attempt=h.job.attempt,
        nodes=states,
        left_out=dict(h.job.left_out or {}),
        members=members(h.job),
    )
    if h.live:
        running = [s for s in states if s.state == "running" or s.processes]
        report.running_nodes = len(running)
        # an attached run whose controller died (SIGKILL, a reboot) never wrote its end
        ctl = None if report.detached else h.controller()
        report.controller = ctl
        if ctl is not None and ctl["alive"] is False and running:
            report.hint = (
                f"its controller is gone; {len(running)} node(s) still run the job: "
                f"`fleetctl stop {h.job_id}` ends it, `fleetctl collect {h.job_id}` "
                "records how it ended"
            )
        elif ctl is not None and ctl["alive"] is False:
            report.hint = (
                "its controller is gone and no node runs the job (their dead-man switch "
                f"stopped it): `fleetctl collect {h.job_id}` brings the logs home and "
                "records how it ended"
            )
        elif not running:
            report.hint = f"job ended on every node; `fleetctl collect {h.job_id}`"
    report.monitor = monitor_status(h.job)
    return report


def collect_options(
    h: JobHandle, max_bytes: int | None, exclude: Sequence[str] | None
) -> CollectOptions:
    """The run's cap and excludes (connect.json), each replaced where given."""
    from fleetctl.phases.collect import CollectOptions

    base = h.collect_options()
    return CollectOptions(
        max_bytes=base.max_bytes if max_bytes is None else max_bytes,
        exclude=tuple(exclude) if exclude else base.exclude,
    )


def stop(
    h: JobHandle,
    grace: float,
    *,
    collect: bool = True,
    options: CollectOptions | None = None,
    on_note: Note | None = None,
) -> StopReport:
    """Its monitor asked to exit first (never two of us tearing down at once), then the
    teardown and verification on every node, the logs collected, job.json says stopped."""
    from fleetctl.job.monitor.process import stop_monitor

    note = on_note or (lambda text: None)
    said = stop_monitor(h.folder)
    if said:
        note(said)
        with contextlib.suppress(OSError):
            h.folder.event(f"stop: {said}")
    note(f"stopping job {h.job_id} on {len(h.nodes)} node(s)")
    options = options or h.collect_options()
    report = h.stop(grace)
    results = h.collect(stopped=True, options=options) if collect else []
    h.mark_stopped(report, results)
    return StopReport(h.job_id, report, h.job.status, said, results)


def collect(h: JobHandle, options: CollectOptions | None = None) -> CollectReport:
    results = h.collect(options=options)
    return CollectReport(h.job_id, h.job.status, results)


def stacks(h: JobHandle) -> StacksReport:
    from fleetctl.job.diagnose.stacks import fold

    report, saved = h.stacks()
    return StacksReport(h.job_id, fold(report.stacks()), report, saved)


@dataclass
class LogsProblem:
    """Why some node's lines are not all there: ``missing`` nodes with no collected log of
    an ended job, or a node's follow error (``rank``: ``error``)."""

    missing: list[tuple[int, str]] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    interrupted: bool = False  # Ctrl-C ended following the live lines (the job goes on)


def logs(
    h: JobHandle,
    node: str | None,
    show: Callable[[int, str, str], None],
    *,
    follow: bool = False,
    lines: int | None = None,
) -> LogsProblem:
    """Each chosen node's log into ``show(rank, host, text)``: the collected console.log, else
    (or with ``follow``) live from the nodes while the job may run."""
    from fleetctl.job.monitor.logs import follow_logs

    chosen = h.select(node)
    missing = []
    if not follow:
        for rank, host in chosen:
            path = h.collected_log(rank, host)
            if path is None:
                missing.append((rank, host))
                continue
            text = path.read_text(encoding="utf-8", errors="replace").splitlines()
            for line in text[-lines:] if lines is not None else text:
                show(rank, host, line)
        if not missing:
            return LogsProblem()
        if not h.live:
            return LogsProblem(missing=missing)
    try:
        errors = follow_logs(h, missing or chosen, show, follow=follow, lines=lines)
    except KeyboardInterrupt:  # stops the reading, never the job
        return LogsProblem(interrupted=True)
    return LogsProblem(errors={r: e for r, e in errors.items() if e})


def last_monitor(runs_dir: str | Path, job_id: str) -> dict[str, Any]:
    """The settings the job's last monitor recorded (grace, poll, timeouts), else {}."""
    from fleetctl.job.records.runfolder import load_run

    record: JobRecord | None = None
    with contextlib.suppress(Exception):  # defaults: what the last monitor of the job used
        record = load_run(runs_dir, job_id).load_job()
    return dict(record.monitor or {}) if record is not None else {}


def monitor(
    runs_dir: str | Path,
    job_id: str,
    settings: SSHSettings | None,
    *,
    poll: float | None,
    lost_after: float | None,
    given: Mapping[str, float],
    chase_lost: float,
    stop_event: threading.Event,
    on_note: Note,
    observe: Observe | None = None,
    report: bool = True,
) -> str:
    """``fleetctl monitor``: watch the detached job until it ends (first failure: stop it
    everywhere, then collect). ``given``: the run's limits and grace by keyword
    (``Supervision.MONITORED``); what is not given, what its last monitor used, else the
    defaults. ``observe``: metrics and hooks, as ``run``'s (docs/metrics.md). Returns the
    outcome in a word."""
    from fleetctl.api.runspec import Supervision
    from fleetctl.job.monitor import watch as mon
    from fleetctl.report import write_report

    last = last_monitor(runs_dir, job_id)
    recorded = {k: last[k] for k in Supervision.MONITORED if last.get(k) is not None}
    result = mon.monitor_job(
        runs_dir,
        job_id,
        settings,
        poll=poll or float(last.get("poll") or mon.DEFAULT_POLL),
        lost_after=lost_after or float(last.get(mon.LOST_KEY) or mon.DEFAULT_LOST_TIMEOUT),
        sup=Supervision(**{**recorded, **given}),
        stop_event=stop_event,
        on_note=on_note,
        chase_lost=chase_lost,
        observe=observe,
        report=write_report if report else None,
    )
    return str(result.outcome)
