"""Dump the Python stack of every process of a job on every node, without the job's help.

py-spy is the tool for it: when the controller has it (``pip install py-spy``; its wheel
carries one static binary) fleetctl ships that binary to each node once, named by its content
hash (``W/bin/py-spy-<sha12>``), like the supervisor; otherwise a node's own ``py-spy`` on PATH
is used. Where py-spy cannot attach (not installed; a non-root user under
``kernel.yama.ptrace_scope=1``), a dump that may end the process (``abort``: the job is being
torn down anyway) sends SIGABRT, and Python's faulthandler — enabled for every job
(``PYTHONFAULTHANDLER=1`` unless the job sets it) — writes every thread to the job's console
log as it dies; the node sends back what the log gained meanwhile and those dumps are folded
with py-spy's, each under the rank that wrote it. Each process's outcome says which way it
went.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import shutil
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import FleetctlError, one_line
from fleetctl.phases.frames import STACK_KINDS, decode
from fleetctl.phases.launch import install_file
from fleetctl.phases.stackdumps import RankStack, console_stacks

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import Plan
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection

DUMP_TIMEOUT = 60.0  # s per node: py-spy takes well under a second per process
SAMPLES = 8  # py-spy dumps per rank for a slow node's evidence, rounds over all of a node's ranks
SAMPLE_WINDOW = 4.0  # s: no new round of them after it
SAMPLE_TIMEOUT = 20.0  # s per node: past it, the evidence goes without that node


@dataclass
class NodeStacks:
    """One node's dumps: every Python process of the job and how it was dumped."""

    rank: int
    host: str
    processes: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    console: str = ""  # what console.log gained while aborted processes dumped their threads

    def console_stacks(self) -> list[RankStack]:
        """The faulthandler dumps in ``console``: tagged ``[rank G]`` lines are that rank's;
        untagged ones the launcher's, or the rank's own where the rank was the only process
        aborted here (the plain launcher)."""
        aborted = [p for p in self.processes if p.get("method") == "faulthandler"]
        if not aborted or not self.console:
            return []
        only = aborted[0].get("rank") if len(aborted) == 1 else None
        return console_stacks(self.console, self.rank, untagged_rank=only)

    def methods(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.processes:
            out[p["method"]] = out.get(p["method"], 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "methods": self.methods(),
            "errors": sorted({p["error"] for p in self.processes if p.get("error")}),
            "error": self.error,
        }


@dataclass
class StackReport:
    nodes: list[NodeStacks]

    def stacks(self) -> list[RankStack]:
        """The dumps py-spy read, and faulthandler's from the console logs."""
        return [
            RankStack(n.rank, p.get("rank"), p["text"])
            for n in self.nodes
            for p in n.processes
            if p.get("text")
        ] + [s for n in self.nodes for s in n.console_stacks()]


def local_py_spy() -> Path | None:
    """The controller's py-spy binary: next to this interpreter's scripts, else on PATH."""
    here = Path(sysconfig.get_path("scripts")) / "py-spy"
    if here.is_file() and os.access(here, os.X_OK):
        return here
    found = shutil.which("py-spy")
    return Path(found) if found else None


def dump_stacks(
    fleet: FanOut,
    plan: Plan,
    *,
    pythons: dict[str, str],
    abort: bool,
    timeout: float = DUMP_TIMEOUT,
) -> StackReport:
    """Dump every node in parallel; each node's outcome is kept, failures included."""
    binary = local_py_spy()
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:12] if binary else None
    source = remote.inline("stacks.py")
    by_name = {n.name: n for n in fleet.nodes}
    ranks = {np.host: np.node_rank for np in plan.nodes}

    def one(node: Node, conn: Connection) -> NodeStacks:
        np = plan.node(node.name)
        py_spy = None
        if binary is not None and digest is not None:
            py_spy = posixpath.join(conn.expand(node.workdir), "bin", f"py-spy-{digest}")
            install_file(conn, binary, py_spy, timeout=timeout)
        args = {"job_id": plan.job_id, "run_dir": conn.expand(np.run_dir), "py_spy": py_spy}
        args["abort"] = abort
        python = conn.expand(pythons.get(node.name) or node.python)
        argv = [python, remote.NO_SITE, "-c", source, json.dumps(args)]
        res = conn.run(argv, timeout=timeout)
        out = NodeStacks(ranks[node.name], node.name)
        for fr in decode(res.stdout, STACK_KINDS):
            with contextlib.suppress(ValueError):  # a line that is not JSON is noise
                if fr.kind == "K":
                    out.processes.append(fr.data())
                elif fr.kind == "D":
                    out.console = str(fr.data().get("console") or "")
        if res.exit_code != 0:
            tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise FleetctlError(f"stack dump exited {res.exit_code}: {tail}")
        return out

    todo = [by_name[np.host] for np in plan.nodes if np.host in by_name]
    res = fleet.map(one, timeout=timeout + 30, nodes=todo)
    nodes: list[NodeStacks] = []
    for np in plan.nodes:
        got = res.get(np.host)
        if isinstance(got, NodeStacks):
            nodes.append(got)
        else:
            nodes.append(NodeStacks(np.node_rank, np.host, error=one_line(got)))
    return StackReport(nodes)


def sample_stacks(
    fleet: FanOut,
    plan: Plan,
    *,
    pythons: dict[str, str],
    samples: int,
    window: float,
    timeout: float = SAMPLE_TIMEOUT,
) -> dict[int, dict[str, Any]]:
    """Every node's rank samples (``fleetctl.remote.programs.stacksample``), in parallel: node
    rank -> ``{"ranks": [tally, …], "error": str | None}``; a node that failed keeps its error."""
    binary = local_py_spy()
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:12] if binary else None
    source = remote.inline("stacksample.py")
    by_name = {n.name: n for n in fleet.nodes}

    def one(node: Node, conn: Connection) -> dict[str, Any]:
        py_spy = None
        if binary is not None and digest is not None:
            py_spy = posixpath.join(conn.expand(node.workdir), "bin", f"py-spy-{digest}")
            install_file(conn, binary, py_spy, timeout=timeout)
        args = {"job_id": plan.job_id, "py_spy": py_spy, "samples": samples, "window": window}
        python = conn.expand(pythons.get(node.name) or node.python)
        argv = [python, remote.NO_SITE, "-c", source, json.dumps(args)]
        res = conn.run(argv, timeout=timeout)
        if res.exit_code != 0:
            tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise FleetctlError(f"stack sampling exited {res.exit_code}: {tail}")
        out: dict[str, Any] = {"ranks": [], "error": None}
        for fr in decode(res.stdout, STACK_KINDS):
            with contextlib.suppress(ValueError):
                if fr.kind == "K":
                    out["ranks"].append(fr.data())
                elif fr.kind == "D":
                    out["error"] = fr.data().get("error")
        return out

    todo = [by_name[np.host] for np in plan.nodes if np.host in by_name]
    res = fleet.map(one, timeout=timeout + 10, nodes=todo)
    got: dict[int, dict[str, Any]] = {}
    for np in plan.nodes:
        r = res.get(np.host)
        got[np.node_rank] = r if isinstance(r, dict) else {"ranks": [], "error": one_line(r)}
    return got
