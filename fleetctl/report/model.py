"""A job's run folder (every attempt) read into the typed facts its report shows: the
verdict and the culprit, one timeline lane per node and attempt, the rank map, the check table,
the collective matrix, progress lanes, folded stacks and log excerpts.

Pure: it reads files only (no node is reached, nothing is written), so a run folder copied
off the controller reads the same, and tests compare its output with golden values. Every
figure comes from a file fleetctl wrote (job.json, events.log, plan.json, ranks.json,
attempts.json, collective.json, the collected node folders); what a folder lacks is left out,
never guessed. Log text is bounded here (lines cut, excerpts short), so a 64-node report stays
small whatever the job printed.

The facts are NamedTuples (immutable, like the frozen dataclasses they were): this module is
imported at the end of every run, and a dataclass costs ~0.5 ms of CPU to define (its methods
are generated and compiled at import), a NamedTuple ~0.1 ms. ``Lane``, which is filled in
place, stays a dataclass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, NamedTuple

from fleetctl.errors import RunFolderError
from fleetctl.job.records.files import CheckRecord, CollectiveRecord, RankEntry, RanksRecord
from fleetctl.job.records.jobrecord import JobRecord, NodeRecord
from fleetctl.job.records.plan import PlanRecord
from fleetctl.job.records.runfolder import (
    EVENTS_FILE,
    RANKS_FILE,
    RunFolder,
    read_job,
)
from fleetctl.job.records.runs import attempt_folders, describe_failure
from fleetctl.report.files import (
    Event,
    count_lines,
    cut_line,
    parse_time,
    read_events,
    span_of,
    tail_lines,
)

_QUIET = re.compile(r"no progress on any node for (\d+(?:\.\d+)?) s")
EXCERPT_LINES = 40  # per failing rank: its last lines
EXCERPT_RANKS = 8  # failing ranks excerpted at most (the first by time)
ERROR_LINES = 12  # the culprit's own error lines shown on the first screen
# job-level phases as job.json's ``phases`` names them (their text's first words)
_PHASES = (
    ("connect", "connecting"),
    ("check", "checking nodes"),
    ("push", "pushing"),
    ("launch", "launching"),
    ("postmortem", "checking every host"),
    ("collect", "collecting"),
    ("done", "done"),
)


class Span(NamedTuple):
    """A stretch of one lane: ``kind`` names its colour (connect, check, push, launch,
    running, teardown, collect), times in seconds since the epoch."""

    kind: str
    start: float
    end: float
    label: str


class Mark(NamedTuple):
    """An instant on a lane: the first failure, a stall, a slow-node verdict, a last
    progress touch."""

    kind: str
    at: float
    label: str


@dataclass
class Lane:
    """One node in one attempt."""

    attempt: int
    rank: int
    host: str
    state: str
    outcome: str  # "exit code 1", "signal 9 (SIGKILL)", "lost (…)", "running"
    spare: bool = False  # ran in this attempt but not in the first
    culprit: bool = False
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


class Culprit(NamedTuple):
    """Who ended the job: the node (and the rank, when known) that failed first, why, and
    that rank's own error lines."""

    host: str
    node_rank: int
    address: str | None
    rank: int | None
    local_rank: int | None
    reason: str
    error_lines: tuple[str, ...] = ()
    error_log: str | None = None  # relative to the attempt's folder
    attempt: int = 1
    likely_cause: tuple[str, ...] = ()
    hint: str | None = None  # what to do about a well-known error (job.hints)


class RankRow(NamedTuple):
    rank: int
    host: str
    node_rank: int
    local_rank: int | None
    pid: int | None
    outcome: str  # "exit code 1" for failed ranks, else ""
    failed: bool
    logs: tuple[str, ...]


class CheckCell(NamedTuple):
    """One check of one host (check.json): ``ok``, ``warn``, ``fail`` or ``skip``, and why."""

    name: str
    status: str
    detail: str


class CheckRow(NamedTuple):
    """A node as the check and the plan saw it: the plan's facts, the node's end, and each
    of the check's cells where the run folder has check.json."""

    host: str
    node_rank: int
    address: str
    nic: str | None
    train_addr: str | None
    python: str | None
    state: str
    note: str
    cells: tuple[CheckCell, ...] = ()


class Collective(NamedTuple):
    """collective.json: hosts in node order, busbw per link (GB/s), the judged slow hosts."""

    hosts: tuple[str, ...]
    links: dict[tuple[str, str], float]
    median: float
    threshold: float
    failures: tuple[tuple[str, str], ...]
    allreduce: dict[str, Any]

    @property
    def slow(self) -> set[str]:
        return {h for h, _ in self.failures}


class ProgressRow(NamedTuple):
    """One rank's lane: how many lines it wrote over its node's run, and its node's last
    ``FLEET_PROGRESS_FILE`` touch (the file's time as collected)."""

    rank: int
    host: str
    attempt: int
    lines: int
    start: float | None
    end: float | None
    last_touch: float | None

    @property
    def rate(self) -> float | None:
        if self.start is None or self.end is None or self.end <= self.start:
            return None
        return self.lines / (self.end - self.start)


class StackGroup(NamedTuple):
    frame: str
    ranks: tuple[int, ...]
    nodes: tuple[int, ...]


class Excerpt(NamedTuple):
    """The last lines of one failing rank's log (or a node's console), with its file."""

    title: str
    path: str  # relative to the report's run folder
    lines: tuple[str, ...]
    total_bytes: int
    cut: bool  # the file holds more than these lines


class Report(NamedTuple):
    """Everything the report shows, read from one job's run folders."""

    job_id: str
    status: str
    verdict: str
    launcher: str | None
    script: str | None
    started: str | None
    ended: str | None
    duration: float | None
    attempts: int
    culprit: Culprit | None
    lanes: list[Lane]
    t0: float
    t1: float
    ranks: list[RankRow]
    checks: list[CheckRow]
    collective: Collective | None
    progress: list[ProgressRow]
    stacks: list[StackGroup]
    excerpts: list[Excerpt]
    errors: list[str]
    notes: list[str]  # what this folder lacks, said once


def load(folder: str | Path) -> Report:
    """The report of the job whose first run folder is ``folder`` (its retries'
    ``<job>.<k>`` folders beside it are read too). RunFolderError when job.json is unreadable."""
    first = RunFolder(Path(folder))
    attempts = [(k, f, read_job(f.path / "job.json")) for k, f in attempt_folders(first)]
    last_k, last_folder, last = attempts[-1]
    first_hosts = {n.host for n in attempts[0][2].nodes}
    lanes: list[Lane] = []
    for k, f, job in attempts:
        lanes += _lanes(k, f.path, job, first_hosts)
    times = [t for lane in lanes for s in lane.spans for t in (s.start, s.end)]
    times += [m.at for lane in lanes for m in lane.marks]
    t0, t1 = (min(times), max(times)) if times else (0.0, 1.0)
    culprit = _culprit(last_k, last_folder.path, last, _relative(last_folder.path, first.path))
    plan = _plan_record(last_folder)
    collective = None
    for k, f, job in reversed(attempts):  # the latest check that measured the collective
        collective = _collective(f, job)
        if collective is not None:
            _mark_slow([x for x in lanes if x.attempt == k], collective)
            break
    notes = []
    if not (last_folder.path / RANKS_FILE).is_file():
        notes.append("no ranks.json in the run folder (the job never launched, or it predates it)")
    there = _relative(last_folder.path, first.path)
    return Report(
        job_id=attempts[0][2].job_id,
        status=last.status,
        verdict=_verdict(last, culprit, last_k),
        launcher=last.launcher,
        script=plan.script if plan else None,
        started=attempts[0][2].started,
        ended=last.ended,
        duration=span_of(attempts[0][2].started, last.ended),
        attempts=len(attempts),
        culprit=culprit,
        lanes=lanes,
        t0=t0,
        t1=max(t1, t0 + 1e-3),
        ranks=_ranks(last_folder.path, last, there),
        checks=_checks(plan, last, _check_record(last_folder)),
        collective=collective,
        progress=_progress(attempts),
        stacks=_stacks(last),
        excerpts=_excerpts(last_folder.path, last, there),
        errors=list(last.errors),
        notes=notes,
    )


def _relative(folder: Path, base: Path) -> str:
    """The prefix that makes a path relative to ``folder`` (a retry's) relative to ``base``
    (the job's first folder, where links start): '' or ``../<job>.2/``."""
    return "" if folder == base else f"../{folder.name}/"


# ------------------------------------------------------------------------------ lanes


def outcome(node: NodeRecord | Any) -> str:
    """A node's end in words: ``exit code 1``, ``signal 9``, ``lost (…)``, its state."""
    if node.state == "lost":
        return "lost" + (f" ({node.reason})" if node.reason else "")
    if node.signal is not None:
        return f"signal {node.signal}"
    if node.exit_code is not None:
        return f"exit code {node.exit_code}"
    return node.state


def _phase_spans(job: JobRecord) -> list[Span]:
    """The job-level phases (connect, check, push, launch, post-mortem, collect) as spans,
    each until the next phase began."""
    marks = []
    for p in job.phases:
        at = parse_time(p.get("at"))
        name = str(p.get("phase", ""))
        kind = next((k for k, prefix in _PHASES if name.startswith(prefix)), None)
        if at is not None and kind is not None:
            marks.append((at, kind, name))
    spans = []
    for (at, kind, name), nxt in pairwise(marks):
        if kind != "done":
            spans.append(Span(kind, at, nxt[0], name))
    return spans


def _lanes(k: int, folder: Path, job: JobRecord, first_hosts: set[str]) -> list[Lane]:
    phases = _phase_spans(job)
    events = read_events(folder / EVENTS_FILE)
    ff = job.first_failure
    lanes = []
    for node in job.nodes:
        lane = Lane(k, node.rank, node.host, node.state, outcome(node))
        lane.spare = k > 1 and node.host not in first_hosts
        start, end = parse_time(node.start_time), parse_time(node.end_time)
        for s in phases:
            if s.kind == "launch" and start is not None:
                lane.spans.append(Span("launch", s.start, max(s.start, start), s.label))
            elif s.kind != "launch":
                lane.spans.append(s)
        if start is not None:
            stop = end if end is not None else parse_time(job.ended) or start
            lane.spans.append(Span("running", start, stop, f"running: {lane.outcome}"))
        mine = [e for e in events if e.rank == node.rank and e.host == node.host]
        lane.spans += _teardown_spans(events, mine)
        lane.spans += _stall_spans(events)
        lane.marks += [Mark("stall", e.at, e.text) for e in events if _is_stall(e)]
        if ff is not None and ff.rank == node.rank:
            at = parse_time(ff.time) or end
            if at is not None:
                lane.culprit = True
                lane.marks.append(Mark("failure", at, f"first failure: {outcome(ff)}"))
        lanes.append(lane)
    return lanes


def _is_stall(e: Event) -> bool:
    return e.kind == "failure" and e.rank is None and e.text.startswith("stalled")


def _stall_spans(events: list[Event]) -> list[Span]:
    """A job-wide stall (``stalled: no progress on any node for 30 s``): the quiet stretch
    before it was called, on every node's lane."""
    out = []
    for e in events:
        m = _QUIET.search(e.text) if _is_stall(e) else None
        if m is not None:
            out.append(Span("stall", e.at - float(m.group(1)), e.at, e.text))
    return out


def _teardown_spans(events: list[Event], mine: list[Event]) -> list[Span]:
    """From the stop reaching this node (its stop notice, else the job's teardown line) to
    the teardown's verdict."""
    begun = next((e.at for e in mine if "stop" in e.text and e.kind == "notice"), None)
    job_td = [e for e in events if e.kind == "teardown" and e.rank is None]
    if begun is None and job_td:
        begun = job_td[0].at
    done = next((e.at for e in job_td if e.text.startswith(("verified", "not verified"))), None)
    if begun is None or done is None or done < begun:
        return []
    return [Span("teardown", begun, done, "teardown")]


def _mark_slow(lanes: list[Lane], coll: Collective) -> None:
    for lane in lanes:
        if lane.host in coll.slow:
            check = next((s for s in lane.spans if s.kind == "check"), None)
            if check is not None:
                why = "; ".join(r for h, r in coll.failures if h == lane.host)
                lane.marks.append(Mark("slow", check.end, f"slow node: {why}"))


# ------------------------------------------------------------------------------ the rest


def _verdict(job: JobRecord, culprit: Culprit | None, attempts: int) -> str:
    tries = f" after {attempts} attempts" if attempts > 1 else ""
    if culprit is not None:
        who = f"rank {culprit.rank} on " if culprit.rank is not None else ""
        where = f"{who}{culprit.host} (node {culprit.node_rank})"
        return f"{job.status}{tries}: {where}, {culprit.reason}"
    return f"{job.status}{tries}"


def _culprit(k: int, folder: Path, job: JobRecord, there: str) -> Culprit | None:
    ff = job.first_failure
    if ff is None:
        return None
    fr = next(
        (r for r in job.failed_ranks or [] if r.get("node") == ff.host),
        job.failed_ranks[0] if job.failed_ranks else None,
    )
    lines: list[str] = []
    if fr is not None:
        lines = [cut_line(str(x)) for x in fr.get("error") or []][-ERROR_LINES:]
        if not lines and fr.get("error_log"):
            lines = tail_lines(folder / str(fr["error_log"]), ERROR_LINES)[0]
    words = describe_failure(ff) or outcome(ff)
    reason = words.split(": ", 1)[1] if ": " in words else words
    return Culprit(
        host=ff.host or "?",
        node_rank=ff.rank,
        address=ff.address,
        rank=fr.get("rank") if fr else None,
        local_rank=fr.get("local_rank") if fr else None,
        reason=reason,
        error_lines=tuple(lines),
        error_log=there + str(fr.get("error_log") or (fr.get("logs") or [None])[0]) if fr else None,
        attempt=k,
        likely_cause=tuple(job.culprits or ()),
        hint=str(fr["hint"]) if fr and fr.get("hint") else None,
    )


def _plan_record(folder: RunFolder) -> PlanRecord | None:
    """plan.json, when the folder has one that is one (the job never launched: none)."""
    try:
        return folder.find_record(PlanRecord)
    except RunFolderError:
        return None


def _check_record(folder: RunFolder) -> CheckRecord | None:
    """check.json, when the folder has one that is one."""
    try:
        return folder.find_record(CheckRecord)
    except RunFolderError:
        return None


def _rank_entries(folder: Path) -> list[RankEntry]:
    """ranks.json's entries; none when the folder has none or it is not a ranks.json."""
    try:
        return (RunFolder(folder).find_record(RanksRecord) or RanksRecord()).ranks
    except RunFolderError:
        return []


def _ranks(folder: Path, job: JobRecord, there: str) -> list[RankRow]:
    failed = {r.get("rank"): r for r in job.failed_ranks or []}
    rows = []
    for r in _rank_entries(folder):
        f = failed.get(r.rank)
        code = f.get("exit_code") if f else None
        rows.append(
            RankRow(
                rank=r.rank,
                host=r.node,
                node_rank=r.node_rank,
                local_rank=r.local_rank,
                pid=r.pid,
                outcome=(f"exit code {code}" if code is not None else "failed") if f else "",
                failed=f is not None,
                logs=tuple(there + x for x in r.logs),
            )
        )
    return rows


def _checks(
    plan: PlanRecord | None, job: JobRecord, check: CheckRecord | None = None
) -> list[CheckRow]:
    by_host = {n.host: n for n in job.nodes}
    cells: dict[str, tuple[CheckCell, ...]] = {}
    for h in check.hosts if check else []:
        cells[h.host] = tuple(
            CheckCell(str(k), str(c.get("status", "")), cut_line(str(c.get("detail", ""))))
            for k, c in h.checks.items()
            if isinstance(c, dict)
        )
    rows = []
    for n in plan.nodes if plan else []:
        host = n.host
        rec = by_host.get(host)
        note = (rec.problem or rec.reason or "") if rec else "not run"
        rows.append(
            CheckRow(
                host=host,
                node_rank=n.node_rank,
                address=n.address,
                nic=n.nic,
                train_addr=n.train_addr,
                python=n.python or None,
                state=rec.state if rec else "-",
                note=note,
                cells=cells.get(host, ()),
            )
        )
    return rows


def _collective(folder: RunFolder, job: JobRecord) -> Collective | None:
    try:
        data = folder.find_record(CollectiveRecord)
    except RunFolderError:
        return None
    if data is None:
        return None
    links = {(x.src, x.dst): x.busbw for x in data.links}
    order = [n.host for n in sorted(job.nodes, key=lambda n: n.rank)]
    seen = {h for pair in links for h in pair} | set(data.nodes)
    hosts = [h for h in order if h in seen] + sorted(seen - set(order))
    return Collective(
        hosts=tuple(hosts),
        links=links,
        median=data.median_link_busbw,
        threshold=data.threshold_busbw,
        failures=tuple((f.host, f.reason) for f in data.failures),
        allreduce=dict(data.allreduce),
    )


def _progress(attempts: list[tuple[int, RunFolder, JobRecord]]) -> list[ProgressRow]:
    rows = []
    for k, f, job in attempts:
        nodes = {n.host: n for n in job.nodes}
        for r in _rank_entries(f.path):
            node = nodes.get(r.node)
            lines = sum(count_lines(f.path / p) for p in r.logs)
            touch = None
            if node is not None:
                try:
                    touch = (f.path / f"{node.rank}-{node.host}" / "progress").stat().st_mtime
                except OSError:
                    touch = None
            rows.append(
                ProgressRow(
                    rank=r.rank,
                    host=r.node,
                    attempt=k,
                    lines=lines,
                    start=parse_time(node.start_time) if node else None,
                    end=parse_time(node.end_time) if node else None,
                    last_touch=touch,
                )
            )
    return rows


def _stacks(job: JobRecord) -> list[StackGroup]:
    return [
        StackGroup(
            frame=str(s.get("frame", "")),
            ranks=tuple(s.get("ranks") or ()),
            nodes=tuple(s.get("launcher_nodes") or ()),
        )
        for s in job.stacks or []
    ]


def _excerpts(folder: Path, job: JobRecord, prefix: str) -> list[Excerpt]:
    """The failing ranks' logs (the first EXCERPT_RANKS), else the first failed node's
    console; ``prefix`` makes their paths relative to the job's first folder."""
    out = []
    for fr in (job.failed_ranks or [])[:EXCERPT_RANKS]:
        rel = fr.get("error_log") or (fr.get("logs") or [None])[0]
        if not rel:
            continue
        lines, size, cut = tail_lines(folder / str(rel), EXCERPT_LINES)
        title = f"rank {fr.get('rank')} on {fr.get('node')} (local rank {fr.get('local_rank')})"
        out.append(Excerpt(title, prefix + str(rel), tuple(lines), size, cut))
    if not out and job.first_failure is not None:
        node = job.node(job.first_failure.rank)
        if node is not None:
            rel = f"{node.rank}-{node.host}/console.log"
            if not (folder / rel).is_file():
                rel = f"{node.rank}-{node.host}/console.streamed.log"
            lines, size, cut = tail_lines(folder / rel, EXCERPT_LINES)
            title = f"node {node.rank} ({node.host}) console"
            out.append(Excerpt(title, prefix + rel, tuple(lines), size, cut))
    return out
