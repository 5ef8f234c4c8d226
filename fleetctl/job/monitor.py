"""The job monitor: a controller-side watcher that gives detached jobs first-failure teardown.

``fleetctl run --detach`` leaves the job to the node supervisors (no dead-man switch: the job
must outlive the terminal). Without a watcher a rank that dies leaves its peers hung in
collectives for hours. ``fleetctl run --detach`` therefore starts ``fleetctl monitor JOB`` as
its own process (own session, output in ``<run folder>/monitor.log``), which polls every node's
supervisor (one ``status`` command per node per poll over kept SSH connections) and:

* the first node that ends badly (non-zero exit, signal, supervisor gone, no record of the job)
  → the rest is stopped with the same teardown + verification as an attached run, every node's
  logs are collected, and job.json says **failed** with ``first_failure`` naming that node;
* a node unreachable for longer than ``lost_timeout`` → the same, the node counts as lost;
  shorter blips are written to events.log and tolerated;
* every node succeeded → teardown verifies nothing is left, logs are collected, job.json
  says **succeeded**;
* a lost node has no dead-man switch in a detached job: after the verdict the monitor keeps
  trying to reach it (``chase_lost`` seconds, default 30 min) and stops the job there, and
  brings its logs home, once it answers again;
* job.json no longer live (``fleetctl stop``/``collect`` from another terminal), or a node's
  supervisor stopped the job for ``fleetctl stop`` → the monitor leaves quietly.

Killed or SIGTERMed while watching, the monitor just exits (recorded in events.log) and leaves
the job running: it is detached by design; ``fleetctl monitor JOB`` attaches a new one.
Its identity is ``job.json``'s ``monitor`` entry: pid *and* /proc start time (and boot id,
host), so no other process is ever taken for it or signalled in its name.

The decision itself (:func:`decide`) is pure: node states in, verdict and event lines out.
Library code: raises ``FleetctlError`` subclasses, never prints.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import FleetctlError, RunFolderError, UsageError
from fleetctl.job.lifecycle import EXTERNAL_STOP_REASON, LIVE_STATES, JobHandle, NodeReport
from fleetctl.job.runfolder import RunFolder, iso
from fleetctl.job.state import JobState, NodeState
from fleetctl.remote.supervisor import proc_start_time

if TYPE_CHECKING:
    from fleetctl.plan.roles import CompletionPolicy
    from fleetctl.ssh.connection import SSHSettings

DEFAULT_POLL = 2.0
DEFAULT_LOST_TIMEOUT = 60.0  # detached jobs: nobody waits on them, so tolerate long blips
DEFAULT_GRACE = 5.0
MONITOR_REASON = "stopped by the job monitor"
REGISTER_WAIT = 20.0  # s for a spawned monitor to record itself in job.json
STOP_WAIT = 30.0  # s for a watching monitor to exit after SIGTERM (a poll in flight ends)
FINISH_WAIT = 180.0  # s for a monitor already tearing down / collecting to finish
DEFAULT_CHASE_LOST = 1800.0  # s to keep trying to stop the job on a lost node
ENDED = frozenset({"succeeded", "failed", "lost"})
# A detached job has no dead-man switch: say who stops it on a node that cannot be reached.
LOST_NOTE = "lost: cannot be reached; the monitor keeps trying to stop the job there"


# ---------------------------------------------------------------------------- the decision


@dataclass
class WatchState:
    """What the monitor remembers between polls (kept by the caller of :func:`decide`)."""

    unreachable_since: dict[int, float] = field(default_factory=dict)  # rank -> first miss
    reported: set[int] = field(default_factory=set)  # ranks whose end was written to events
    tolerated: set[int] = field(default_factory=set)  # failures the completion policy allows


@dataclass(frozen=True)
class Decision:
    """How the job ends. ``action``: ``fail`` (a node failed first: tear the rest down),
    ``done`` (every node ended; ``status`` says how), ``external`` (someone else stops it)."""

    action: str
    status: str | None = None
    rank: int | None = None
    host: str | None = None
    state: str | None = None  # failed or lost, for ``fail``
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    time: float | None = None
    unreachable: bool = False  # lost because it did not answer: do not wait on it again

    def first_failure(self) -> dict[str, Any] | None:
        """job.json's ``first_failure`` entry (None unless ``fail``)."""
        if self.action != "fail":
            return None
        return {
            "rank": self.rank,
            "host": self.host,
            "state": self.state,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "time": iso(self.time),
            "found_by": "monitor",
        }

    def describe(self) -> str:
        if self.action == "fail":
            if self.state == "lost":
                how = f"lost ({self.reason})" if self.reason else "lost"
            elif self.signal is not None:
                how = f"signal {self.signal}"
            else:
                how = f"exit code {self.exit_code}"
            return f"node {self.rank} ({self.host}) failed first: {how}"
        if self.action == "done":
            return f"every node ended: {self.status}"
        return "the job is being stopped from another terminal"


def _classify(s: NodeReport) -> tuple[str, str | None]:
    """A supervisor's answer as running / succeeded / failed / lost / unreachable / external,
    with a reason for the bad ones."""
    if s.state == "unreachable":
        return "unreachable", s.error
    if s.state == "exited":
        if s.signal is None and s.exit_code == 0:
            return "succeeded", None
        return "failed", None
    if s.state == "stopped":
        if s.stop_reason == EXTERNAL_STOP_REASON:
            return "external", s.stop_reason
        if s.stop_reason and s.stop_reason.startswith(MONITOR_REASON):
            return "external", s.stop_reason  # another monitor already tears it down
        return "failed", f"stopped on the node: {s.stop_reason or 'no reason recorded'}"
    if s.state == "lost":
        return "lost", "its supervisor died"
    if s.state == "absent":
        return "lost", "no record of the job on the node"
    return "running", None


def decide(
    states: Sequence[NodeReport],
    watch: WatchState,
    now: float,
    *,
    lost_timeout: float,
    policy: CompletionPolicy | None = None,
) -> tuple[Decision | None, list[str]]:
    """One poll's verdict (None: keep watching) and the event lines it gives rise to.

    The first failure is the bad end with the earliest time (a node's recorded end time; for
    a node that stopped answering, when it first did not), so two nodes failing between two
    polls are told apart. A role job's ``min_failed`` (``policy``) may tolerate a failure.
    Updates ``watch`` (unreachable streaks, what was already reported).
    """
    notes: list[str] = []
    kinds: dict[int, str] = {}
    bad: list[tuple[float, Decision]] = []
    for s in states:
        kind, why = _classify(s)
        if kind == "external":
            return Decision("external", reason=why), notes
        if kind == "unreachable":
            since = watch.unreachable_since.setdefault(s.rank, now)
            if since == now:
                notes.append(
                    f"node {s.rank} ({s.host}) did not answer: {why or 'no reason'}; "
                    f"tolerated up to {lost_timeout:g}s"
                )
            if now - since > lost_timeout:
                kinds[s.rank] = "lost"
                reason = f"unreachable for {now - since:.0f}s" + (f": {why}" if why else "")
                d = Decision(
                    "fail",
                    "failed",
                    s.rank,
                    s.host,
                    "lost",
                    reason=reason,
                    time=since,
                    unreachable=True,
                )
                bad.append((since, d))
            else:
                kinds[s.rank] = "running"
            continue
        since = watch.unreachable_since.pop(s.rank, None)
        if since is not None:
            notes.append(f"node {s.rank} ({s.host}) answers again after {now - since:.1f}s")
        kinds[s.rank] = kind
        if kind in ("failed", "lost"):
            when = s.end_time if s.end_time is not None else now
            d = Decision(
                "fail",
                "failed",
                s.rank,
                s.host,
                "failed" if kind == "failed" else "lost",
                exit_code=s.exit_code,
                signal=s.signal,
                reason=why,
                time=when,
            )
            bad.append((when, d))
        elif kind == "succeeded" and s.rank not in watch.reported:
            watch.reported.add(s.rank)
            notes.append(f"node {s.rank} ({s.host}) succeeded")
    # The job's state machine decides, as for an attached run: successes as they stand, then
    # the bad ends one by one, earliest first; the one that reaches a role's min_failed (for a
    # plain job: the first) is the job's first failure.
    index = {s.rank: i for i, s in enumerate(states)}
    machine = JobState(
        len(states),
        policy,
        [
            NodeState.SUCCEEDED if kinds[s.rank] == "succeeded" else NodeState.RUNNING
            for s in states
        ],
    )
    bad.sort(key=lambda x: (x[0], x[1].rank or 0))
    for when, d in bad:
        assert d.rank is not None and d.state is not None
        change = machine.end(index[d.rank], NodeState(d.state), when)
        if change.first_failure:
            return d, notes
        if d.rank not in watch.tolerated:
            watch.tolerated.add(d.rank)
            notes.append(
                f"node {d.rank} ({d.host}) ended badly ({d.state}); tolerated by its role's "
                "min_failed"
            )
    if all(kinds[s.rank] in ENDED for s in states):
        return Decision("done", str(machine.outcome())), notes
    return None, notes


# ------------------------------------------------------------------------ process identity


def boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def identity(pid: int | None = None) -> dict[str, Any]:
    """Who a process is, beyond its pid: start time, boot, host."""
    pid = os.getpid() if pid is None else pid
    return {
        "pid": pid,
        "start_time": proc_start_time(pid),
        "boot_id": boot_id(),
        "host": socket.gethostname(),
    }


def monitor_alive(info: Any) -> bool:
    """Is the process job.json's ``monitor`` entry names still that very process, here?"""
    if not isinstance(info, dict):
        return False
    pid, start = info.get("pid"), info.get("start_time")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not isinstance(start, int):
        return False
    if info.get("host") not in (None, socket.gethostname()):
        return False  # recorded on another controller: its pid means nothing here
    if info.get("boot_id") not in (None, boot_id()):
        return False
    return proc_start_time(pid) == start


def monitor_status(job: dict[str, Any]) -> dict[str, Any] | None:
    """``fleetctl status``'s view of the job's monitor (None: it never had one)."""
    info = job.get("monitor")
    if not isinstance(info, dict):
        return None
    return {
        "pid": info.get("pid"),
        "alive": monitor_alive(info),
        "phase": info.get("phase"),
        "log": info.get("log"),
        "outcome": info.get("outcome"),
    }


# --------------------------------------------------------------------------- the watcher


@dataclass
class MonitorResult:
    """How a monitor run ended. ``outcome``: failed / succeeded (it ended the job), gone (the
    job ended elsewhere), interrupted (signalled: job left running), deadline."""

    job_id: str
    outcome: str
    decision: Decision | None = None
    verified: bool | None = None  # teardown verified every node (when it tore down)
    final: bool = False  # this monitor wrote the job's final record


def _policy(job: dict[str, Any]) -> CompletionPolicy | None:
    """The role job's completion policy as ``fleetctl run`` recorded it (None: plain job)."""
    data = job.get("completion")
    if not isinstance(data, dict) or not data.get("roles"):
        return None
    from fleetctl.plan.roles import CompletionPolicy

    return CompletionPolicy(
        roles=tuple(str(r) for r in data["roles"]),
        min_failed=dict(data.get("min_failed") or {}),
        min_succeeded=dict(data.get("min_succeeded") or {}),
    )


def completion_record(policy: Any) -> dict[str, Any] | None:
    """A CompletionPolicy as job.json's ``completion`` (read back by the monitor)."""
    if policy is None:
        return None
    return {
        "roles": list(policy.roles),
        "min_failed": dict(policy.min_failed),
        "min_succeeded": dict(policy.min_succeeded),
    }


def _register(h: JobHandle, info: dict[str, Any]) -> None:
    """Record this process as the job's monitor, unless a live one is there (check and set
    under the folder lock, so two monitors never both watch)."""
    with h.folder.locked():
        job = h.folder.load_job()
        old = job.get("monitor")
        if monitor_alive(old) and old.get("pid") != info["pid"]:
            raise UsageError(
                f"job {h.job_id} is already watched by monitor pid {old.get('pid')} "
                f"(log: {old.get('log')})"
            )
        if str(job.get("status")) not in LIVE_STATES:
            raise UsageError(
                f"job {h.job_id} already ended ({job.get('status')}): nothing to watch"
            )
        job["monitor"] = info
        h.folder.write_job(job)
        h.job = job


def _update_monitor(h: JobHandle, pid: int, **changes: Any) -> bool:
    """Change this monitor's entry in job.json (not if another monitor replaced it)."""
    with h.folder.locked():
        job = h.folder.load_job()
        info = job.get("monitor")
        if not isinstance(info, dict) or info.get("pid") != pid:
            return False
        job["monitor"] = {**info, **changes}
        h.folder.write_job(job)
        h.job = job
    return True


def monitor_job(
    runs_dir: str | Path,
    job_id: str,
    settings: SSHSettings | None = None,
    *,
    poll: float = DEFAULT_POLL,
    lost_timeout: float = DEFAULT_LOST_TIMEOUT,
    grace: float = DEFAULT_GRACE,
    stop_event: threading.Event | None = None,
    deadline: float | None = None,
    on_note: Callable[[str], None] | None = None,
    chase_lost: float = DEFAULT_CHASE_LOST,
) -> MonitorResult:
    """Watch a detached job until it ends, then end it like an attached run would.

    ``stop_event`` set (SIGTERM/SIGINT in the CLI) while watching: return at once, job left
    running. Once a verdict is reached the teardown and collection finish regardless (each
    bounded). ``deadline``: a ``time.monotonic()`` after which watching stops (None: as long
    as the job runs). Raises UsageError when another live monitor watches the job or it ended.
    """
    import dataclasses

    from fleetctl.ssh.connection import SSHSettings

    stop_event = stop_event or threading.Event()
    note = on_note or (lambda text: None)
    me = identity()
    # A reconnect to a node that went away must not stall the polls of the others for long.
    settings = settings or SSHSettings()
    settings = dataclasses.replace(
        settings, connect_timeout=min(settings.connect_timeout, max(3.0, lost_timeout / 4))
    )
    with JobHandle(runs_dir, job_id, settings) as h:
        folder = h.folder
        info = {
            **me,
            "started": iso(time.time()),
            "poll": poll,
            "lost_timeout": lost_timeout,
            "grace": grace,
            "log": str(folder.monitor_log),
            "phase": "watching",
        }
        _register(h, info)
        pid = me["pid"]

        def event(text: str) -> None:
            note(text)
            with contextlib.suppress(OSError):
                folder.event(f"monitor {text}")

        event(
            f"pid {pid} watching job {h.job_id} on {len(h.nodes)} node(s) "
            f"(poll {poll:g}s, lost after {lost_timeout:g}s unreachable)"
        )
        result = MonitorResult(h.job_id, "interrupted")
        try:
            decision, watch = _watch(h, stop_event, deadline, poll, lost_timeout, event, result)
            if decision is None or decision.action == "external":
                if decision is not None:
                    result.outcome = "gone"
                    event(f"{decision.describe()}; leaving it to that")
                return result
            ranks = {np.node_rank: np.host for np in h.plan.nodes}
            lost = {ranks[r] for r in watch.unreachable_since if r in ranks}
            _finish(h, decision, grace, event, result, pid, lost)
            if lost and result.final:
                until = time.monotonic() + chase_lost
                every = max(poll, min(lost_timeout / 4, 15.0))
                _chase_lost(h, lost, grace, stop_event, until, every, event, pid)
            return result
        except Exception as e:
            result.outcome = "error"
            event(f"pid {pid} failed: {type(e).__name__}: {e}; the job is left running")
            raise
        finally:
            with contextlib.suppress(FleetctlError, OSError):
                _update_monitor(
                    h, pid, phase="exited", outcome=result.outcome, ended=iso(time.time())
                )
            if result.outcome == "interrupted":
                event(f"pid {pid} stopped by a signal: the job is left running (detached)")
            elif result.outcome == "deadline":
                event(f"pid {pid} reached its deadline: the job is left running (detached)")


def _watch(
    h: JobHandle,
    stop_event: threading.Event,
    deadline: float | None,
    poll: float,
    lost_timeout: float,
    event: Callable[[str], None],
    result: MonitorResult,
) -> tuple[Decision | None, WatchState]:
    """Poll until a verdict; None when interrupted, past the deadline or the job ended."""
    from fleetctl.job.lifecycle import ensure_supervisor, node_states

    policy = _policy(h.job)
    watch = WatchState()
    by_name = {n.name: n for n in h.nodes}
    # One answer may take this long; a longer silence is the lost_timeout's business.
    timeout = max(3.0, min(15.0, lost_timeout / 4))
    with contextlib.suppress(FleetctlError):
        ensure_supervisor(h.fleet, h.nodes)  # once; polls then are one command per node
    while True:
        if stop_event.is_set():
            return None, watch
        if deadline is not None and time.monotonic() > deadline:
            result.outcome = "deadline"
            return None, watch
        try:
            job = h.folder.load_job()
        except RunFolderError:
            job = h.job  # mid-rewrite elsewhere: atomic replace makes that rare; next poll
        if str(job.get("status")) not in LIVE_STATES:
            result.outcome = "gone"
            event(f"job {h.job_id} is {job.get('status')} now (ended elsewhere); leaving")
            return None, watch
        # Reconnect nodes that stopped answering (a broken transport is not reused).
        down = [by_name[np.host] for np in h.plan.nodes if np.node_rank in watch.unreachable_since]
        for node in down:
            h.fleet.drop(node)
        if down:
            h.fleet.connect(down)
        states = node_states(h.fleet, h.plan, h.nodes, ensure=False, timeout=timeout)
        if stop_event.is_set():
            return None, watch
        decision, notes = decide(
            states, watch, time.time(), lost_timeout=lost_timeout, policy=policy
        )
        for text in notes:
            event(text)
        if decision is not None:
            return decision, watch
        stop_event.wait(poll)


def _finish(
    h: JobHandle,
    decision: Decision,
    grace: float,
    event: Callable[[str], None],
    result: MonitorResult,
    pid: int,
    lost: set[str],
) -> None:
    """Tear the job down everywhere (verified), collect every node's logs, write job.json.
    ``lost``: nodes not answering now (not waited on; chased afterwards)."""
    from fleetctl.job.lifecycle import request_stop
    from fleetctl.phases.collect import collect
    from fleetctl.phases.teardown import teardown

    with h.folder.locked():  # still ours to end? `fleetctl stop` may have been faster
        job = h.folder.load_job()
        if str(job.get("status")) not in LIVE_STATES:
            result.outcome = "gone"
            event(f"job {h.job_id} is {job.get('status')} now (ended elsewhere); leaving")
            return
        info = job.get("monitor")
        if isinstance(info, dict) and info.get("pid") == pid:
            job["monitor"] = {**info, "phase": "finishing", "verdict": decision.describe()}
            h.folder.write_job(job)
    result.decision = decision
    if decision.action == "fail":
        event(f"{decision.describe()}; stopping the job on every node (grace {grace:g}s)")
        with contextlib.suppress(FleetctlError):  # best effort: says why on each node
            request_stop(
                h.fleet,
                h.plan,
                h.nodes,
                reason=f"{MONITOR_REASON}: node {decision.rank} ({decision.host}) failed first",
                skip=lost,
            )
    else:
        event(f"{decision.describe()}; verifying nothing is left, collecting logs")
    h.stop_time = time.time()
    report = teardown(
        h.fleet,
        h.plan,
        grace=grace,
        pythons=h.pythons(),
        lost=lost,
        lost_note=LOST_NOTE,
    )
    for n in report.nodes:
        if n.remaining or n.error:
            event(f"node {n.rank} ({n.host}) teardown: {n.error or f'LEFT {n.remaining}'}")
    event(
        "teardown "
        + ("verified: nothing of the job left on any node" if report.verified else "NOT verified")
        + f" ({report.seconds:.1f}s)"
    )
    results = collect(h.fleet, h.plan, h.folder.path, pythons=h.pythons(), skip=lost)
    for c in results:
        if c.error:
            event(f"node {c.rank} ({c.host}) logs not collected: {c.error}")
    status = "failed" if decision.action == "fail" else str(decision.status)
    result.outcome = status
    result.verified = report.verified
    result.final = h.mark_ended(status, report, results, failed_first=decision.first_failure())
    event(
        f"job {h.job_id} {status}; logs in {h.folder.path}"
        if result.final
        else f"job {h.job_id} ended elsewhere meanwhile ({h.job.get('status')}); its record stands"
    )


def _chase_lost(
    h: JobHandle,
    hosts: set[str],
    grace: float,
    stop_event: threading.Event,
    until: float,
    every: float,
    event: Callable[[str], None],
    pid: int,
) -> None:
    """Keep trying to reach lost nodes (bounded by ``until``) and stop the job there when one
    answers again: a detached job's supervisor has no dead-man switch, so nobody else would."""
    from fleetctl.phases.collect import collect
    from fleetctl.phases.teardown import teardown

    with contextlib.suppress(FleetctlError, OSError):
        _update_monitor(h, pid, phase="chasing", chasing=sorted(hosts))
    by_name = {n.name: n for n in h.nodes}
    everyone = {np.host for np in h.plan.nodes}
    pending = set(hosts)
    event(f"will stop the job on lost node(s) {', '.join(sorted(pending))} once they answer")
    while pending and not stop_event.wait(every) and time.monotonic() < until:
        for host in sorted(pending):
            node = by_name[host]
            h.fleet.drop(node)
            if h.fleet.connect([node]).failed:
                continue
            others = everyone - {host}
            report = teardown(
                h.fleet, h.plan, grace=grace, pythons=h.pythons(), lost=others, lost_note=LOST_NOTE
            )
            stop = next(n for n in report.nodes if n.host == host)
            if stop.error:
                continue  # answered the handshake, not the stop: try again
            results = collect(h.fleet, h.plan, h.folder.path, pythons=h.pythons(), skip=others)
            h.record_late_stop(stop, [c for c in results if c.host == host])
            what = "verified: nothing left" if stop.clean else f"LEFT {stop.remaining}"
            event(f"lost node {stop.rank} ({host}) answers again; job stopped there, {what}")
            pending.discard(host)
    if pending:
        event(
            f"lost node(s) {', '.join(sorted(pending))} not reached; the job may still run "
            f"there: `fleetctl stop {h.job_id}` once they are back"
        )


# ----------------------------------------------------------------- spawning and stopping


@dataclass
class SpawnedMonitor:
    pid: int
    log: str
    registered: bool  # it recorded itself in job.json (else: see its log)
    exit_code: int | None = None  # when it already ended


def spawn_monitor(
    folder: str | Path,
    *,
    settings: SSHSettings | None = None,
    poll: float = DEFAULT_POLL,
    lost_timeout: float = DEFAULT_LOST_TIMEOUT,
    grace: float = DEFAULT_GRACE,
    wait: float = REGISTER_WAIT,
) -> SpawnedMonitor:
    """Start ``fleetctl monitor`` for the job in ``folder`` as its own process (own session,
    no terminal, output to ``monitor.log`` 0600), and wait (bounded) until it has recorded
    itself in job.json."""
    folder = Path(folder).resolve()
    argv = [
        sys.executable,
        "-m",
        "fleetctl",
        "monitor",
        "--runs-dir",
        str(folder.parent),
        "--poll",
        repr(float(poll)),
        "--lost-timeout",
        repr(float(lost_timeout)),
        "--grace",
        repr(float(grace)),
    ]
    if settings is not None:
        argv += ["--connect-timeout", repr(float(settings.connect_timeout))]
        if settings.known_hosts:
            argv += ["--known-hosts", os.path.abspath(os.path.expanduser(settings.known_hosts))]
    argv.append(folder.name)
    run = RunFolder(folder)
    log = run.monitor_log
    fd = run.open_monitor_log()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        raise FleetctlError(f"cannot start the job monitor: {e}") from e
    finally:
        os.close(fd)
    end = time.monotonic() + wait
    while True:
        with contextlib.suppress(RunFolderError):
            info = run.load_job().get("monitor")
            if isinstance(info, dict) and info.get("pid") == proc.pid:
                return SpawnedMonitor(proc.pid, str(log), True, proc.poll())
        code = proc.poll()
        if code is not None or time.monotonic() > end:
            return SpawnedMonitor(proc.pid, str(log), False, code)
        time.sleep(0.1)


def stop_monitor(
    folder: RunFolder,
    *,
    wait: float = STOP_WAIT,
    finish_wait: float = FINISH_WAIT,
) -> str | None:
    """Ask the job's live monitor to exit (SIGTERM to its verified pid) and wait for it, so a
    ``fleetctl stop`` never tears down and collects at the same time as the monitor.

    A monitor already tearing down is given ``finish_wait`` to end the job itself; one that
    still runs after that is killed (SIGKILL, pid and start time checked again). Returns a
    line saying what happened, None when no live monitor watches the job.
    """
    try:
        info = folder.load_job().get("monitor")
    except RunFolderError:
        return None
    if not monitor_alive(info):
        return None
    pid = int(info["pid"])
    if not _signal_verified(info, signal.SIGTERM):
        return None
    end = time.monotonic() + wait
    while time.monotonic() < end or _finishing(folder, pid, time.monotonic() < end + finish_wait):
        if not monitor_alive(info):
            return f"monitor pid {pid} exited"
        time.sleep(0.1)
    if _signal_verified(info, signal.SIGKILL):
        for _ in range(50):
            if not monitor_alive(info):
                break
            time.sleep(0.1)
        return f"monitor pid {pid} did not exit in time: killed"
    return f"monitor pid {pid} exited"


def _finishing(folder: RunFolder, pid: int, in_time: bool) -> bool:
    if not in_time:
        return False
    with contextlib.suppress(RunFolderError):
        info = folder.load_job().get("monitor")
        return (
            isinstance(info, dict) and info.get("pid") == pid and info.get("phase") == "finishing"
        )
    return False


def _signal_verified(info: dict[str, Any], sig: int) -> bool:
    """Signal the monitor only while pid and start time still name it."""
    if not monitor_alive(info):
        return False
    try:
        os.kill(int(info["pid"]), sig)
    except ProcessLookupError:
        return False
    except PermissionError as e:
        raise FleetctlError(f"cannot signal monitor pid {info['pid']}: {e}") from e
    return True
