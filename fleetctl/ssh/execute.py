"""Ad-hoc commands on every node (``fleetctl exec``): one fan-out, every node's outcome kept.

Each node connects and runs in the same worker, so a fast node prints while a slow one is still
in its handshake, and one remote command per node is all it costs (no SFTP, no home lookup).
Exit status semantics (like ``pdsh``/``clush`` without ``-S``): 0 when every node ran the
command and it exited 0, 124 when it timed out on any node, else 3 (remote failure) — the
per-node codes are in the result; with ``max_rc`` the largest remote exit code is returned
instead (``clush -S``/``pdsh -S``), 124 for a node where it timed out, 255 for a node where
the command could not run at all (as ``ssh`` reports it).

The time limit is enforced on the node (``fleetctl/remote/programs/exec_timeout.py``): closing an
SSH channel does not stop a command that has no terminal, so the command runs in its own session,
tagged by an id in its environment, and is stopped there with everything it started.
"""

from __future__ import annotations

import shlex
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetctl.errors import UsageError, one_line
from fleetctl.results import Cancelled

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection

REMOTE_FAILURE = 3
UNREACHABLE_RC = 255
TIMED_OUT_RC = 124  # as coreutils timeout
KILL_GRACE = 2.0  # s between SIGTERM and SIGKILL on the node when the time is up


@dataclass(frozen=True)
class NodeRun:
    """One node's outcome. ``exit_code`` is None when the command did not run to completion;
    ``seconds`` counts from the start of the fan-out to this node's result (connect included)."""

    node: str
    label: str
    exit_code: int | None
    stdout: str = ""
    stderr: str = ""
    error: str | None = None
    seconds: float = 0.0
    timed_out: bool = False  # stopped on the node (with everything it started) at the limit

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0

    @property
    def status(self) -> str:
        """Short outcome for summaries: ``ok``, ``exit 2``, or the error line."""
        if self.error is not None:
            return self.error
        return "ok" if self.exit_code == 0 else f"exit {self.exit_code}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "exit_code": self.exit_code,
            "ok": self.ok,
            "error": self.error,
            "timed_out": self.timed_out,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "seconds": round(self.seconds, 4),
        }


@dataclass(frozen=True)
class ExecResult:
    """Every selected node's outcome, in rank order; the one result protocol
    (``fleetctl.results.Outcome``: ``ok``, ``exit_code``, ``failed``, ``to_dict()``)."""

    command: str
    runs: tuple[NodeRun, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)

    @property
    def failed(self) -> dict[str, str]:
        """Host → how the command failed there (``exit 7``, ``timed out after 5s: …``, the
        connection's error), in rank order; empty when ok."""
        return {r.node: r.status for r in self.runs if not r.ok}

    @property
    def failed_runs(self) -> tuple[NodeRun, ...]:
        """The failed hosts' whole runs (output included), in rank order."""
        return tuple(r for r in self.runs if not r.ok)

    @property
    def exit_code(self) -> int:
        """The command's: 0 if all ok; 124 if it timed out anywhere, else 3."""
        if self.ok:
            return 0
        return TIMED_OUT_RC if any(r.timed_out for r in self.runs) else REMOTE_FAILURE

    @property
    def max_rc(self) -> int:
        """``exec -S`` (clush/pdsh ``-S``): the largest remote exit code, 124 for a host where
        it timed out, 255 for one where it could not run; 0 if all ok."""
        return max((_rc(r) for r in self.runs), default=0)

    def gathered(self) -> list[tuple[list[str], NodeRun]]:
        """Nodes with identical output and status grouped (clush ``-b``), first-seen order."""
        return group_identical(self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "ok": self.ok,
            "exit_code": self.exit_code,
            "failed": self.failed,
            "seconds": round(self.seconds, 4),
            "nodes": [r.to_dict() for r in self.runs],
        }


def _rc(r: NodeRun) -> int:
    if r.timed_out:
        return TIMED_OUT_RC
    return UNREACHABLE_RC if r.exit_code is None else r.exit_code


#: coreutils ``timeout`` where every Linux distribution puts it; a link there (busybox's applet,
#: whose options differ) is not taken for it
TIMEOUT_BIN = "/usr/bin/timeout"


def timed_command(command: str, python: str, timeout: float, tag: str) -> str:
    """``command`` under the node's own time limit: stopped with all it started when
    ``timeout`` is up.

    Where coreutils ``timeout`` is (nearly every node), it runs the tagged command and stops its
    process group; only when it timed out does Python start (``exec_timeout.py --sweep``), to
    stop the tagged processes that left the group (``setsid``). A command that ends in time —
    the usual ``exec`` — so costs the node no interpreter start and no compile of the program
    (~15 ms of a node's CPU each, more than the rest of ``exec -- hostname`` there).
    Without that ``timeout``, ``exec_timeout.py`` runs the command itself; without that python
    either, a ``timeout`` found on PATH stops the process group alone; else the command runs
    as it is (``exec`` may be what installs them).
    """
    from fleetctl.remote import NO_SITE, inline
    from fleetctl.remote.kit.wire import EXEC_TIMEOUT_MARK as MARK

    py = "~/" + shlex.quote(python[2:]) if python.startswith("~/") else shlex.quote(python)
    secs, grace, cmd = f"{timeout:g}", f"{KILL_GRACE:g}", shlex.quote(command)
    program = f'{py} {NO_SITE} -c "$p"'
    said = shlex.quote(
        f"{MARK} {timeout:g}s: stopped by coreutils timeout (no {python} on the node: only "
        "the command's process group)"
    )
    # In the background, waited for with this shell's stderr on /dev/null (the command's is
    # the real one, and so is stdin): a shell reports a waited-for child killed by a signal
    # ("Terminated"), and timeout dies of the signal its command died of. timeout gives the
    # command back the SIGINT and SIGQUIT a background job starts with ignored.
    limited = (
        f"exec 4<&0 3>&2 2>/dev/null; FLEET_EXEC_ID={tag} {TIMEOUT_BIN} -k {grace} {secs} "
        f"/bin/sh -c {cmd} <&4 4<&- 2>&3 3>&- & wait $!; rc=$?; exec 2>&3 3>&- 4<&-; "
        f"case $rc in 124|137) command -v {py} >/dev/null 2>&1 && "
        f"exec {program} --sweep {secs} {grace} {tag} $rc; "
        f'[ "$rc" -ne 124 ] || echo {said} >&2;; esac; exit "$rc"'
    )
    own = f"exec {program} {shlex.join([secs, grace, tag, command])}"
    coreutils = (
        f"timeout -k {grace} {secs} /bin/sh -c {cmd}; rc=$?; "
        f'[ "$rc" -ne 124 ] || echo {said} >&2; exit "$rc"'
    )
    return (
        f"p={shlex.quote(inline('exec_timeout.py'))}; "
        f"if [ -x {TIMEOUT_BIN} ] && [ ! -L {TIMEOUT_BIN} ]; then {limited}; "
        f"elif command -v {py} >/dev/null 2>&1; then {own}; "
        f"elif command -v timeout >/dev/null 2>&1; then {coreutils}; "
        f"else exec /bin/sh -c {cmd}; fi"
    )


def _split_timeout(stderr: str) -> tuple[str, str | None]:
    """(stderr without the node's time-out line, that line) — None when it did not time out."""
    from fleetctl.remote.kit.wire import EXEC_TIMEOUT_MARK as MARK

    body, _, last = stderr.rstrip("\n").rpartition("\n")
    if last.startswith(MARK):
        return (body + "\n" if body else ""), last
    return stderr, None


def command_line(argv: Sequence[str]) -> str:
    """The remote command line for ``exec -- ARGV``.

    One argument is a shell command line, as with ``ssh host 'cmd | wc -l'`` (pipes, globs and
    ``$VARS`` work); several are quoted one by one so each reaches the program literally
    (``exec -- echo 'a b;c'`` prints ``a b;c``).
    """
    if not argv:
        raise UsageError("no command given (usage: fleetctl exec [OPTIONS] -- COMMAND...)")
    if len(argv) == 1:
        if not argv[0].strip():
            raise UsageError("empty command")
        return argv[0]
    return shlex.join(argv)


def _one_line(e: BaseException) -> str:
    return "cancelled" if isinstance(e, Cancelled) else one_line(e, typed=True)


def execute(
    fleet: FanOut,
    command: str,
    *,
    timeout: float,
    on_result: Callable[[NodeRun], None] | None = None,
) -> ExecResult:
    """Run ``command`` (a remote shell line) on every node of ``fleet``; never raises per node.

    ``on_result`` is called once per node, from a worker thread, as soon as that node is done
    (serialised: calls never overlap), so a CLI can print while others still run.
    """
    started = time.monotonic()
    lock = threading.Lock()
    runs: dict[str, NodeRun] = {}

    def report(run: NodeRun) -> NodeRun:
        with lock:
            if run.node in runs:  # a straggler finishing after its deadline was recorded
                return runs[run.node]
            runs[run.node] = run
            if on_result is not None:
                on_result(run)
        return run

    tag = uuid.uuid4().hex[:16]

    def work(node: Node, conn: Connection) -> NodeRun:
        line = timed_command(command, node.python, timeout, tag)
        try:
            # the node stops it at ``timeout``; this deadline is for a node that cannot say so
            res = conn.run(line, timeout=timeout + KILL_GRACE + 10)
        except Exception as e:
            return report(
                NodeRun(
                    node.name,
                    node.label,
                    None,
                    error=_one_line(e),
                    seconds=time.monotonic() - started,
                )
            )
        code = res.exit_code if res.exit_code >= 0 else UNREACHABLE_RC  # -1: no exit status
        stderr, said = _split_timeout(res.stderr) if code == TIMED_OUT_RC else (res.stderr, None)
        if said is not None:
            return report(
                NodeRun(
                    node.name,
                    node.label,
                    None,
                    res.stdout,
                    stderr,
                    error=f"timed out after {timeout:g}s: {said.split(': ', 2)[-1]}",
                    seconds=time.monotonic() - started,
                    timed_out=True,
                )
            )
        return report(
            NodeRun(
                node.name,
                node.label,
                code,
                res.stdout,
                res.stderr,
                seconds=time.monotonic() - started,
            )
        )

    budget = fleet.settings.connect_timeout * 2 + timeout + KILL_GRACE + 15
    outcome = fleet.map(work, timeout=budget)
    for node in fleet.nodes:
        if node.name in runs:
            continue
        value = outcome.get(node.name)
        error = _one_line(value) if isinstance(value, BaseException) else "no result"
        report(
            NodeRun(node.name, node.label, None, error=error, seconds=time.monotonic() - started)
        )
    ordered = tuple(runs[n.name] for n in fleet.nodes)
    return ExecResult(command, ordered, time.monotonic() - started)


def group_identical(runs: Sequence[NodeRun]) -> list[tuple[list[str], NodeRun]]:
    """Nodes whose output and status are identical, grouped (clush ``-b``), first-seen order."""
    groups: dict[tuple[str, str, str], tuple[list[str], NodeRun]] = {}
    for r in runs:
        key = (r.stdout, r.stderr, r.status)
        if key in groups:
            groups[key][0].append(r.node)
        else:
            groups[key] = ([r.node], r)
    return list(groups.values())
