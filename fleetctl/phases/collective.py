"""``--collective``: a real torch.distributed benchmark over the training NICs after the check.

Each node runs ``fleetctl/remote/collective.py`` with its own python (the check's facts: the
pushed env's where there is one), shipped inline like the port probe: one streamed remote
command per node, all started at once on the fleet's open connections. A direct start rather
than the supervisor + plain launcher: the benchmark is a bounded program with no run folder,
no rank logs and no job id to stop, and its channel is all the lifeline it needs — the program
exits on EOF, at its own deadline (after sending its stacks) and, as a last resort, by a C-level
faulthandler timer; the controller closes every channel in ``finally``. Rank 0 picks a free
port for the store itself (``R <port>``) and the controller passes it on, so no port is
guessed. Rank order is inventory order; the master is the first node's training address.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.phases.collective_judge import CollectiveOptions, CollectiveReport, judge, shifts
from fleetctl.phases.frames import FrameStream

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import NodeFacts
    from fleetctl.ssh.connection import Connection
    from fleetctl.ssh.fleet import Fleet

KINDS = frozenset("RPDK")
START_WAIT = 60.0  # s for rank 0 to import torch and open the store
# a link below this many times the verdict's fraction of the median is measured again (the
# node program's best-of-N grows), within this many seconds of more rounds
REMEASURE_MARGIN = 1.25
REMEASURE_BUDGET = 10.0


class _Port:
    """Rank 0's store port, once it said it (or gave up: None)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.port: int | None = None
        self.done = False

    def set(self, port: int | None) -> None:
        with self.cond:
            self.port, self.done = port, True
            self.cond.notify_all()

    def wait(self, deadline: float) -> int | None:
        with self.cond:
            while not self.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)
            return self.port


def node_args(
    rank: int, world: int, master: str, nic: str | None, options: CollectiveOptions, names: list
) -> dict[str, Any]:
    return {
        "rank": rank,
        "world": world,
        "master_addr": master,
        "nic": nic,
        "backend": options.backend,
        "size": options.size,
        "iters": options.iters,
        "shifts": shifts(world, names),
        "deadline": options.timeout,
        "op_timeout": options.timeout,
        "remeasure_below": min(1.0, options.min_fraction * REMEASURE_MARGIN),
        "remeasure_budget": min(REMEASURE_BUDGET, options.timeout / 10),
    }


def run_collective(
    fleet: Fleet,
    nodes: Sequence[Node],
    facts: Mapping[str, NodeFacts],
    options: CollectiveOptions,
) -> CollectiveReport:
    """Benchmark ``nodes`` (≥ 2, in rank order) and judge it; never raises for a slow or
    failing node: the report names it."""
    started = time.monotonic()
    names = [n.name for n in nodes]
    master = facts[names[0]].train_addr or nodes[0].address
    port = _Port()
    results: dict[str, dict[str, Any]] = {}
    hung: dict[str, str] = {}
    errors: dict[str, str] = {}
    lock = threading.Lock()
    deadline = started + options.timeout + START_WAIT + 10  # the node's own limit + slack

    def work(node: Node, conn: Connection) -> None:
        rank = names.index(node.name)
        f = facts.get(node.name)
        python = conn.expand((f.python if f else None) or node.python)
        args = node_args(rank, len(names), master, f.nic if f else None, options, names)
        argv = [python, "-c", remote.inline("collective.py"), json.dumps(args)]
        stream = conn.start(argv)
        lines = FrameStream(stream, KINDS, json_kinds="PDK")
        step = "start"
        try:
            if rank == 0:
                got = lines.next("RD", time.monotonic() + START_WAIT)
                if got is not None and got.kind == "R":
                    port.set(int(got.payload))
                else:
                    port.set(None)
                    _record(got, node.name, lines, step)
                    return
            else:
                p = port.wait(time.monotonic() + START_WAIT + 5)
                if p is None:
                    with lock:
                        errors[node.name] = "rank 0 did not start the collective"
                    return
                stream.send((json.dumps({"port": p}) + "\n").encode())
            while True:
                got = lines.next("PDK", deadline)
                if got is not None and got.kind == "P":
                    step = str(got.data().get("step"))
                    continue
                _record(got, node.name, lines, step)
                return
        finally:
            if rank == 0 and not port.done:
                port.set(None)
            with contextlib.suppress(Exception):
                stream.close_stdin()  # EOF: the node program exits at once
                stream.exit_code(3.0)
            stream.close()

    def _record(got: Any, host: str, lines: FrameStream, step: str) -> None:
        with lock:
            if got is None:
                hung[host] = f"(no answer after step {step}; no stacks came back)\n{lines.tail}"
            elif got.kind == "K":
                data = got.data()
                hung[host] = f"(stuck after step {data.get('step')})\n{data.get('stacks', '')}"
            elif got.kind == "D" and isinstance(got.data(), dict):
                results[host] = got.data()
            else:
                errors[host] = f"collective program ended: {lines.tail or 'no answer'}"

    res = fleet.map(
        work, timeout=deadline - time.monotonic() + 15, nodes=list(nodes), width=len(nodes)
    )
    for host, e in res.failed.items():
        errors.setdefault(host, f"collective did not run: {_one_line(e)}")
    for host in res.cancelled:
        hung.setdefault(host, "(the controller gave up waiting)")
    hung = _narrow_hung(names, hung, results)
    rep = judge(names, results, options, hung=hung, errors=errors)
    rep.elapsed = time.monotonic() - started
    return rep


def _narrow_hung(
    names: list[str], hung: dict[str, str], results: Mapping[str, Any]
) -> dict[str, str]:
    """Everyone waits on a hung peer, so every rank of a stalled collective times out; the
    ranks that said nothing at all (not even their stacks) are the hung ones when some did."""
    silent = {h: s for h, s in hung.items() if s.startswith("(no answer")}
    if silent and len(silent) < len(hung):
        return silent
    return hung


def _one_line(e: object) -> str:
    return " ".join(str(e).split()) or type(e).__name__
