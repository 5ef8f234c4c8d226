"""Global rank -> node, local rank and log files (``ranks.json``), and which ranks failed.

paddle's ABORT line says "rank=[2,3] was aborted: see workerlog.2/3" — on one machine. On a
fleet, ``1-node2/log/workerlog.0`` is global rank 4, and torchrun's files sit under
``torchrun/<job>_*/attempt_N/<local>/``. After collection this module maps every global rank to
the node it ran on and the files that hold its output, and reads which ranks failed from what
the launchers say (torchrun's error summary, paddle's ABORT line), so the summary can name
ranks and files, not just the node. Each launcher's file layout and last words are its own
module's (``Launcher.rank_files``, ``named_failures``). Reads the collected run folder; no
network.
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.plan.launchers import launcher_for

if TYPE_CHECKING:
    from fleetctl.job.records.result import JobResult

# What a rank prints when a collective failed because a peer's process went away: gloo's
# "Connection closed by peer [addr]:port. This is typically caused by a remote worker
# crashing", a reset, NCCL's remote error. Such a rank is the culprit's victim even when it
# ended first: the culprit prints its exception, then its interpreter's teardown closes the
# process group (what the peers see) and only then does it exit, 0.2 s later under load.
_PEER_LOSS = re.compile(
    rb"Connection closed by peer|Connection reset by peer|remote worker crash"
    rb"|remote process exited|ncclRemoteError",
    re.IGNORECASE,
)
_LOG_TAIL = 16384  # bytes of a rank's log read for it

# deepspeed's own "[ERROR] [launch.py:…:sigkill_handler] [<argv>] exits with return code = N"
# is not used: <argv> is always its last spawned rank's, and N the code of whichever failed
# process its set iteration met first (often a rank killed by the real culprit's peer error).


def _per_node(launcher: str | None, procs: int) -> int:
    """Rank processes per node: a plain script is one, whatever ``--nproc-per-node`` says."""
    return 1 if launcher_for(launcher).one_process_per_node else max(1, procs)


def rank_map(result: JobResult) -> list[dict[str, Any]]:
    """One entry per global rank: node, local rank, pid when known, its log files (relative
    to the run folder, those that came home)."""
    plan = result.plan
    if plan is None:
        return []
    nproc = _per_node(plan.launcher, plan.procs)
    files = launcher_for(plan.launcher).rank_files
    out = []
    for node in result.nodes:
        rel = node.folder and Path(node.folder).name
        here = result.folder / rel if rel else None
        pids = _rank_pids(here)
        for local in range(nproc):
            seen = pids.get(str(local))
            logs: list[str] = []
            if here is not None and here.is_dir():
                logs = [str(p.relative_to(result.folder)) for p in files(
                    here, local, node.rank * nproc + local
                )]  # fmt: skip
            out.append(
                {
                    "rank": node.rank * nproc + local,
                    "node": node.host,
                    "node_rank": node.rank,
                    "local_rank": local,
                    "pid": seen[-1] if seen else None,
                    "logs": logs,
                }
            )
            if len(pids.get(str(local)) or ()) > 1:  # the launcher restarted it
                out[-1]["pids"] = pids[str(local)]
    return out


def rank_exits(result: JobResult) -> list[tuple[float, int, int | None, str]]:
    """(when, global rank, exit code or -signal or None, host) of every rank process the node
    supervisors saw end (``rank_exits.json``, each by its node's clock: the moment it ended,
    from a pidfd), over every node — except those that ended after our stop had reached their
    node (``after_stop``): our teardown's doing, never a first failure."""
    plan = result.plan
    if plan is None:
        return []
    nproc = _per_node(plan.launcher, plan.procs)
    out = []
    for node in result.nodes:
        if not node.folder:
            continue
        try:
            data = json.loads((Path(node.folder) / "rank_exits.json").read_text())
            for e in data["exits"]:
                if e.get("after_stop"):
                    continue
                code = e.get("code")
                out.append((
                    float(e["at"]),
                    node.rank * nproc + int(e["local"]),
                    None if code is None else int(code),
                    node.host,
                ))  # fmt: skip
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
            continue
    return sorted(out)


def _rank_pids(node_dir: Path | None) -> dict[str, list[int]]:
    """The node supervisor's ``rank_pids.json`` (local rank -> pids), {} when absent/bad."""
    if node_dir is None:
        return {}
    try:
        data = json.loads((node_dir / "rank_pids.json").read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        str(k): [p for p in v if isinstance(p, int)] for k, v in data.items() if isinstance(v, list)
    }


def failed_ranks(result: JobResult, ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rank that failed first, with its node, exit code and log files.

    By the node supervisors' times (``rank_exits.json``) when they saw it: the earliest rank
    process on any node that ended badly, a rank whose log says it lost a peer (``_PEER_LOSS``)
    only when no other did. The launchers' own words are no witness of order:
    torchrun's "first observed failure" is the lowest rank among those failed within one
    second, and its summary also lists the peers it stopped with SIGTERM; a peer's launcher may
    end before the culprit's (deepspeed looks at its ranks once a second); deepspeed's own line
    shows its last spawned rank's argv. A SIGTERM end sorts last: launchers and teardown stop
    a failed rank's peers that way. Without such times: the ranks the first failing node's
    launcher named (torchrun's summary, paddle's ABORT line), or its only rank (plain).
    """
    ff = result.failed_node
    if ff is None or result.plan is None:
        return []
    by_rank = {r["rank"]: r for r in ranks}
    launcher = launcher_for(result.plan.launcher)
    named = launcher.named_failures(list(ff.tail))
    said = dict(named)
    nproc = _per_node(result.plan.launcher, result.plan.procs)
    where = {ff.rank * nproc + i: ff.host for i in range(nproc)}
    candidates = []
    for at, rank, code, host in rank_exits(result):
        if code is None:
            code = said.get(rank)  # ended, status unread: the launcher may say it
        if code:
            lost_peer = _lost_a_peer(result, by_rank.get(rank, {}).get("logs") or ())
            candidates.append((code == -signal.SIGTERM, lost_peer, at, rank, code, host))
    if candidates:
        *_, rank, code, host = min(candidates)
        named, where = [(rank, code)], {rank: host}
    elif launcher.one_process_per_node:  # its only rank
        named = [(ff.rank, ff.exit_code)]
    out, seen = [], set()
    for rank, code in named:
        if rank in seen:
            continue
        seen.add(rank)
        info = by_rank.get(rank, {})
        out.append(
            {
                "rank": rank,
                "node": info.get("node", where.get(rank, ff.host)),
                "node_rank": info.get("node_rank", rank // nproc),
                "local_rank": info.get("local_rank"),
                "exit_code": code,
                "logs": info.get("logs", []),
                **rank_error(getattr(result, "folder", None), info.get("logs") or ()),
            }
        )
    return out


def _lost_a_peer(result: JobResult, logs: Any) -> bool:
    """Whether a rank's collected log ends saying a peer's process went away."""
    folder = getattr(result, "folder", None)
    if folder is None:
        return False
    for rel in logs:
        try:
            with open(Path(folder) / rel, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - _LOG_TAIL))
                if _PEER_LOSS.search(f.read()):
                    return True
        except (OSError, TypeError, ValueError):
            continue
    return False


_TRACEBACK = "Traceback (most recent call last):"
_ERROR_LINES = 12  # of a rank's traceback shown: its first line, then the innermost frames
_ERROR_READ = 65536  # bytes from the end of a rank log searched for it


def rank_error(folder: Path | None, logs: Any) -> dict[str, Any]:
    """``{"error": [lines], "error_log": rel}``: the failed rank's own last words from its log
    (its last Python traceback, else the last lines of its stderr/log), for the summary: a
    launcher's last lines are its own boilerplate (torchrun's ``ChildFailedError``), the rank's
    ``RuntimeError: …`` only in the rank's file. ``{}`` when no log says anything."""
    if folder is None:
        return {}
    texts = []
    for rel in reversed(list(logs)):  # torchrun: the last restart's files first
        try:
            with open(Path(folder) / rel, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - _ERROR_READ))
                text = f.read().decode("utf-8", errors="replace")
        except (OSError, TypeError, ValueError):
            continue
        lines = traceback_lines(text)
        if lines:
            return _with_hint({"error": lines, "error_log": str(rel)})
        texts.append((str(rel), text))
    for rel, text in sorted(texts, key=lambda t: "stdout" in t[0]):  # stderr before stdout
        last = [ln for ln in text.splitlines() if ln.strip()][-5:]
        if last:
            return _with_hint({"error": last, "error_log": rel})
    return {}


def _with_hint(error: dict[str, Any]) -> dict[str, Any]:
    """``error`` with what to do about it, where the error is a well-known one."""
    from fleetctl.job.diagnose.hints import hint_for

    hint = hint_for(error["error"])
    return {**error, "hint": hint} if hint else error


def traceback_lines(text: str, limit: int = _ERROR_LINES) -> list[str]:
    """The last Python traceback in ``text``, through its exception line and up to 4 lines of a
    message that goes on; a deep one keeps its first line and its innermost frames. Lines keep
    a prefix the traceback's first line has (torch.distributed's ``[rank3]: ``)."""
    lines = text.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.rstrip().endswith(_TRACEBACK)]
    if not starts:
        return []
    start = starts[-1]
    prefix = lines[start].rstrip()[: -len(_TRACEBACK)]
    body = [ln[len(prefix) :] if ln.startswith(prefix) else None for ln in lines]

    def frame(i: int) -> bool:  # a frame's line (indented) or a blank one, same prefix
        line = body[i]
        return line is not None and (line.startswith((" ", "\t")) or not line.strip())

    end = start + 1
    while end < len(lines) and frame(end):
        end += 1
    if end >= len(lines) or body[end] is None:
        return []  # cut off before its exception line: not one to show
    end += 1
    more = 0
    while end < len(lines) and more < 4:  # a message over several lines
        line = body[end]
        if line is None or not line.strip() or line.startswith(("[", " ", _TRACEBACK)):
            break
        end, more = end + 1, more + 1
    block = lines[start:end]
    if len(block) > limit:
        block = [block[0], f"{prefix}  …", *block[len(block) - (limit - 2) :]]
    return block


def describe(f: dict[str, Any], folder: Path) -> str:
    """``rank 3 (node2, local 1) exited 1: <run folder>/1-node2/torchrun/…/1/stdout.log``."""
    local = "" if f.get("local_rank") is None else f", local {f['local_rank']}"
    how = "failed" if f.get("exit_code") is None else f"exited {f['exit_code']}"
    logs = ", ".join(str(folder / p) for p in f.get("logs") or []) or "no log collected"
    return f"rank {f['rank']} ({f['node']}{local}) {how}: {logs}"
