"""``--collective``: a real torch.distributed benchmark over the training NICs after the check.

Each node runs ``fleetctl/remote/programs/collective.py`` with its own python (the check's facts:
the pushed env's where there is one), shipped inline like the port probe: one streamed remote
command per node, all started at once on the fleet's open connections — by ``check_fleet`` as
soon as the fleet is connected (:func:`start_programs`), so each node imports torch while the
probe and the mesh run, and handed its part (rank, peers) once the check's verdict says which
hosts take part; a host that failed the check gets EOF instead. A direct start rather
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
from fleetctl.phases.check.collective_judge import (
    CollectiveOptions,
    CollectiveReport,
    judge,
    shifts,
)
from fleetctl.phases.frames import FrameStream

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import NodeFacts
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection, Stream

KINDS = frozenset("IRPDK")
START_WAIT = 60.0  # s for rank 0 to import torch and open the store
# a link below this many times the verdict's fraction of the median is measured again (the
# node program's best-of-N grows), within this many seconds of more rounds
REMEASURE_MARGIN = 1.25
REMEASURE_BUDGET = 10.0
ABORT_WAIT = 5.0  # s for a silent node's faulthandler dump after SIGABRT
MAX_STACKS = 64 << 10  # bytes of it kept


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


class Started:
    """Node programs started ahead (importing torch, then waiting for their part): host →
    (python, stream). ``take`` hands one over; ``close`` ends the rest (EOF: they exit).
    ``many``: each takes several parts in a row (the post-mortem's rounds): a program that
    answered its part is handed back (``give``) for the next, torch imported once."""

    def __init__(
        self, streams: Mapping[str, tuple[str, Stream]] | None = None, *, many: bool = False
    ) -> None:
        self._streams = dict(streams or {})
        self._lock = threading.Lock()
        self.many = many
        self.starts = len(self._streams)  # node programs started, ahead and after

    def give(self, host: str, python: str, stream: Stream) -> None:
        with self._lock:
            self._streams[host] = (python, stream)

    def count_start(self) -> None:
        with self._lock:
            self.starts += 1

    def take(self, host: str, python: str) -> Stream | None:
        """The stream started on ``host`` with ``python``; None (and that one closed) else."""
        with self._lock:
            got = self._streams.pop(host, None)
        if got is None:
            return None
        if got[0] == python:
            return got[1]
        _end(got[1])
        return None

    def close(self) -> None:
        with self._lock:
            rest, self._streams = list(self._streams.values()), {}
        for _, stream in rest:
            _end(stream)


def _end(stream: Stream) -> None:
    with contextlib.suppress(Exception):
        stream.close_stdin()  # EOF: the node program exits at once
        stream.exit_code(3.0)
    with contextlib.suppress(Exception):
        stream.close()


def _argv(python: str, wait: float) -> list[str]:
    return [python, "-c", remote.inline("collective.py"), json.dumps({"wait": wait})]


def start_programs(
    fleet: FanOut, nodes: Sequence[Node], wait: float, *, many: bool = False
) -> Started:
    """Start the node program on every node of ``nodes`` with its own python, to import torch
    while the caller still checks the fleet; each waits ``wait`` s for its part at most (for
    each part, ``many``). A node where it did not start is started again by
    :func:`run_collective`."""

    def work(node: Node, conn: Connection) -> tuple[str, Stream]:
        python = conn.expand(node.python)
        return python, conn.start(_argv(python, wait + START_WAIT))

    res = fleet.map(work, timeout=30.0, nodes=list(nodes), width=max(1, len(nodes)))
    return Started({h: v for h, v in res.outcomes.items() if isinstance(v, tuple)}, many=many)


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
    fleet: FanOut,
    nodes: Sequence[Node],
    facts: Mapping[str, NodeFacts],
    options: CollectiveOptions,
    ahead: Started | None = None,
    *,
    start_wait: float = START_WAIT,
) -> CollectiveReport:
    """Benchmark ``nodes`` (≥ 2, in rank order) and judge it, on the programs started
    ``ahead`` where there are; never raises for a slow or failing node: the report names it.
    ``start_wait``: s for rank 0 to import torch and open the store (the post-mortem's is
    its own time limit)."""
    started = time.monotonic()
    names = [n.name for n in nodes]
    master = facts[names[0]].train_addr or nodes[0].address
    port = _Port()
    results: dict[str, dict[str, Any]] = {}
    hung: dict[str, str] = {}
    silent: set[str] = set()  # hung without a word: not even its own watchdog's stacks
    errors: dict[str, str] = {}
    lock = threading.Lock()
    # rank 0's store, a node's own limit from its part + its watchdog's word, a SIGABRT's
    # command and dump, the channel's close, slack
    limit = start_wait + 5 + options.timeout + 10 + 2 * ABORT_WAIT + 3 + 5

    def work(node: Node, conn: Connection) -> None:
        rank = names.index(node.name)
        f = facts.get(node.name)
        python = conn.expand((f.python if f else None) or node.python)
        args = node_args(rank, len(names), master, f.nic if f else None, options, names)
        many = ahead is not None and ahead.many
        if many:
            args["more"] = True  # it waits for the next part after this one
        stream = ahead.take(node.name, python) if ahead is not None else None
        if stream is None:
            stream = conn.start(_argv(python, 2 * start_wait + 10))
            if ahead is not None:
                ahead.count_start()
        answered: list[bool] = []
        lines = FrameStream(stream, KINDS, json_kinds="IPDK")
        step = "start"
        pid: list[int] = []  # the node program's, from its first frame

        def next_frame(wanted: str, until: float) -> Any:
            while True:
                got = lines.next(wanted + "I", until)
                if got is None or got.kind != "I":
                    return got
                with contextlib.suppress(AttributeError, TypeError, ValueError):
                    pid.append(int(got.data().get("pid")))

        try:
            if rank == 0:
                stream.send((json.dumps(args) + "\n").encode())
                deadline = time.monotonic() + options.timeout + 10
                got = next_frame("RD", time.monotonic() + start_wait)
                if got is not None and got.kind == "R":
                    port.set(int(got.payload))
                else:
                    port.set(None)
                    _record(got, node.name, lines, step)
                    return
            else:
                p = port.wait(time.monotonic() + start_wait + 5)
                if p is None:
                    with lock:
                        errors[node.name] = "rank 0 did not start the collective"
                    return
                stream.send((json.dumps({**args, "port": p}) + "\n").encode())
                deadline = time.monotonic() + options.timeout + 10
            while True:
                got = next_frame("PDK", deadline)
                if got is not None and got.kind == "P":
                    step = str(got.data().get("step"))
                    continue
                if got is None and not lines.eof and pid:
                    # stuck so hard its own watchdog said nothing (stopped, GIL held):
                    # SIGABRT makes its faulthandler write every thread's stack
                    stacks = _abort_stacks(conn, stream, pid[0])
                    with lock:
                        silent.add(node.name)
                        hung[node.name] = f"(silent after step {step}; stacks by SIGABRT)\n{stacks}"
                    return
                answered.append(_record(got, node.name, lines, step))
                return
        finally:
            if rank == 0 and not port.done:
                port.set(None)
            if ahead is not None and many and answered == [True]:
                ahead.give(node.name, python, stream)  # alive, waiting for its next part
            else:
                _end(stream)

    def _record(got: Any, host: str, lines: FrameStream, step: str) -> bool:
        """Record ``host``'s answer; True when it was its figures (the program lives on)."""
        with lock:
            if got is None:
                silent.add(host)
                hung[host] = f"(no answer after step {step}; no stacks came back)\n{lines.tail}"
            elif got.kind == "K":
                data = got.data()
                hung[host] = f"(stuck after step {data.get('step')})\n{data.get('stacks', '')}"
            elif got.kind == "D" and isinstance(got.data(), dict):
                results[host] = got.data()
                return "error" not in results[host]
            else:
                errors[host] = f"collective program ended: {lines.tail or 'no answer'}"
        return False

    res = fleet.map(work, timeout=limit, nodes=list(nodes), width=len(nodes))
    for host, e in res.failed.items():
        errors.setdefault(host, f"collective did not run: {_one_line(e)}")
    for host in res.cancelled:
        silent.add(host)
        hung.setdefault(host, "(the controller gave up waiting)")
    hung = _narrow_hung(hung, silent)
    rep = judge(names, results, options, hung=hung, errors=errors)
    rep.elapsed = time.monotonic() - started
    return rep


def _narrow_hung(hung: dict[str, str], silent: set[str]) -> dict[str, str]:
    """Everyone waits on a hung peer, so every rank of a stalled collective times out; the
    ranks that said nothing at all (not even their own watchdog's stacks) are the hung ones
    when some did."""
    quiet = {h: s for h, s in hung.items() if h in silent}
    if quiet and len(quiet) < len(hung):
        return quiet
    return hung


def _abort_stacks(conn: Connection, stream: Stream, pid: int) -> str:
    """SIGABRT (and SIGCONT, should it be stopped) to the node program: its faulthandler
    writes every thread's stack to the channel as it dies; what came within ABORT_WAIT s."""
    with contextlib.suppress(Exception):
        conn.run(["sh", "-c", f"kill -ABRT {pid}; kill -CONT {pid}"], timeout=ABORT_WAIT)
    got = b""
    until = time.monotonic() + ABORT_WAIT
    while len(got) < MAX_STACKS and (left := until - time.monotonic()) > 0:
        chunk = stream.recv(min(left, 0.5))
        if chunk == b"":
            break
        got += chunk or b""
    text = got.decode("utf-8", errors="replace")
    return text[text.find("Fatal Python error") :] if "Fatal Python error" in text else text


def _one_line(e: object) -> str:
    return " ".join(str(e).split()) or type(e).__name__
