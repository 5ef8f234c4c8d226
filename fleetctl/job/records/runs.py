"""What a run folder says about a job, without reaching any node: how to reconnect
(``connect.json``), the rows of ``fleetctl runs``, a job's latest retry attempt."""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import RunFolderError
from fleetctl.job.records.files import ConnectRecord
from fleetctl.job.records.jobrecord import FailureRecord, JobRecord, signal_name
from fleetctl.job.records.plan import PlanRecord
from fleetctl.job.records.runfolder import RunFolder, list_runs, load_run
from fleetctl.node import Node
from fleetctl.remote.kit.records import RecordError

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import Plan
    from fleetctl.transport.connection import SSHSettings

ATTEMPT_RE = re.compile(r"^(?P<base>.+)\.(?P<k>[0-9]+)$")
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
    "proxy_jump",
    "shell_type",
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
    collect: dict[str, Any] | None = None,
) -> None:
    """Record how to reach the job's nodes again (no env values, no secrets), and what
    collecting their logs brings home (``collect``: cap and excludes of the run), with what
    each node's transport keeps to reach it the same way (a Slurm job's steps)."""
    from fleetctl.transport.connection import reach_fields

    entries = [
        {k: list(v) if isinstance(v, tuple) else v for k, v in _node_fields(n).items()}
        | reach_fields(n)
        for n in nodes
    ]
    data = {
        "inventory": os.path.abspath(inventory) if inventory else None,
        "limit": limit,
        "collect": collect,
        "nodes": entries,
    }
    try:
        record = ConnectRecord.from_dict(data)
    except RecordError as e:  # a node field of the wrong type: the inventory's, said so
        raise RunFolderError(f"{folder}: {e}") from None
    RunFolder(Path(folder)).write_record(record)


def nodes_as_reached(nodes: Sequence[Node], settings: SSHSettings | None) -> list[Node]:
    """Nodes as this run reached them: a --known-hosts given to `run` must also verify the keys
    when `status`, `logs`, `stop` or `collect` reconnect later from connect.json."""
    if settings is None or settings.known_hosts is None:
        return list(nodes)
    return [dataclasses.replace(n, known_hosts=settings.known_hosts) for n in nodes]


def _node_fields(n: Node) -> dict[str, Any]:
    return {k: getattr(n, k) for k in _NODE_FIELDS}


def load_nodes(folder: RunFolder) -> list[Node]:
    """The job's nodes in rank order: ``connect.json``, else what ``plan.json`` knows."""
    if folder.has_connect:
        from fleetctl.transport.connection import reached_vars

        nodes = []
        for entry in folder.load_connect().nodes:
            d = {k: getattr(entry, k) for k in _NODE_FIELDS}
            d["groups"] = tuple(entry.groups)
            reached = reached_vars(entry.reach)  # e.g. a step of that Slurm job, not SSH
            if reached:
                d["vars"] = reached
            nodes.append(Node(**d))
        return nodes
    plan = folder.find_record(PlanRecord)  # a malformed one: RunFolderError, in one line
    if plan is None:
        return []  # never launched: nothing to reach
    return [
        Node(
            name=n.host,
            address=n.address,
            workdir=n.workdir or "~/.fleetctl",
            python=n.python or "python3",
        )
        for n in plan.nodes
    ]


def load_plan(folder: RunFolder) -> Plan:
    from fleetctl.plan.rankplan import Plan

    return Plan.from_dict(folder.load_plan().to_dict())


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
    left_out: dict[str, str] = field(default_factory=dict)  # --nodes N, the latest attempt

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
            "left_out": self.left_out,
        }


def describe_failure(ff: FailureRecord | dict[str, Any] | None) -> str | None:
    """``node 1 (node2): exit code 1 after 3.2 s`` from job.json's ``first_failure``."""
    if not ff:
        return None
    if isinstance(ff, dict):
        ff = FailureRecord.from_dict(ff)
    if ff.state == "lost":
        how = "lost" + (f" ({ff.reason})" if ff.reason else "")
    elif ff.state == "start_failed":
        how = "could not start" + (f" ({ff.reason})" if ff.reason else "")
    elif ff.signal is not None:
        how = f"signal {ff.signal} ({signal_name(ff.signal)})"
    else:
        how = f"exit code {ff.exit_code}"
    after = f" after {ff.after:.1f} s" if ff.after is not None else ""
    return f"node {ff.rank} ({ff.host}): {how}{after}"


def list_records(runs_dir: str | Path) -> list[RunRecord]:
    """Every job under ``runs_dir``, oldest first; retry attempts fold into their job."""
    jobs = list_runs(runs_dir)
    by_id = {j.job_id: j for j in jobs if j.job_id}
    latest: dict[str, tuple[int, JobRecord]] = {}
    order: list[str] = []
    for j in jobs:
        m = ATTEMPT_RE.match(j.job_id)
        base, k = (
            (m.group("base"), int(m.group("k")))
            if m and m.group("base") in by_id
            else (j.job_id, j.attempt)
        )
        if base not in latest:
            order.append(base)
        if base not in latest or k >= latest[base][0]:
            latest[base] = (k, j)
    out = []
    for base in order:
        k, j = latest[base]
        first = by_id.get(base, j)
        status = j.status or "?"
        if j.detached and j.live:
            status = "detached"
        out.append(
            RunRecord(
                job_id=base,
                launcher=j.launcher,
                nodes=len(j.nodes),
                status=status,
                started=first.started,
                duration=_duration(first.started, j.ended),
                first_failure=describe_failure(j.first_failure),
                attempts=k,
                detached=j.detached,
                folder=j.folder or str(Path(runs_dir) / base),
                left_out=dict(j.left_out or {}),
            )
        )
    # a job id says its second, then a random suffix: two jobs of one second are ordered by
    # their start (ms), not by the suffix (`--resume last` took the older one)
    out.sort(key=lambda r: (r.job_id[:15], _parse_iso(r.started) or 0.0, r.job_id))
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
    return attempt_folders(folder)[-1][1]


def attempt_folders(folder: RunFolder) -> list[tuple[int, RunFolder]]:
    """The attempts of the job whose first folder is ``folder``, in order, ``(k, folder)``:
    ``<job>`` is attempt 1, ``<job>.<k>`` the later ones."""
    root, base = folder.path.parent, folder.path.name
    later = []
    for p in root.glob(f"{base}.*"):
        m = ATTEMPT_RE.match(p.name)
        if m and m.group("base") == base and p.is_dir() and int(m.group("k")) > 1:
            later.append((int(m.group("k")), RunFolder(p)))
    return [(1, folder), *sorted(later, key=lambda kf: kf[0])]
