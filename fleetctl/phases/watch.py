"""Watch: reader threads turn supervisor frames into events on one queue.

One thread follows up to ``GROUP`` nodes with a selector over their channels, so a fleet of
128 nodes costs two reader threads, not 128. A node that needs a blocking step — draining a
channel that closed, or reaching a silent node over a new connection — leaves its group for a
thread of its own, so one sick host never holds up the others' lines or heartbeats; so does a
stream that cannot be selected on (no ``fileno``).

The reader also heartbeats each supervisor (one byte a second: the dead-man switch on the node
stops the job when they stop coming). A node that says nothing — not even its ``H`` heartbeat —
for half the lost-node timeout, or whose channel closes before it reported an exit, is reached
over a new connection (``reattach``); unless that succeeds, it is reported ``lost`` once it has
been silent for the whole timeout, with the time it was last heard from (``Event.heard``).
Lines are whole lines: the supervisor frames them and nothing here splits one; a line longer
than the supervisor's read size comes as ``C`` pieces and is joined here
(:class:`~fleetctl.phases.frames.LineJoiner`, bounded: cut with a marker for the live view).
"""

from __future__ import annotations

import contextlib
import os
import queue
import selectors
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetctl.phases.frames import LineJoiner
from fleetctl.phases.launch import exit_code_of, exit_report_of

if TYPE_CHECKING:
    from fleetctl.api.runspec import Supervision
    from fleetctl.phases.launch import Frame, NodeRun

DEFAULT_HEARTBEAT = 1.0
GROUP = 64  # nodes one reader thread follows


@dataclass(frozen=True)
class Event:
    """Something that happened on a node. ``kind``: lines, notice, exit, lost, pace (``report``:
    where its ranks spent the last seconds, ``fleetctl.remote.kit.pace``), ranks_ended
    (``report``: ``{"ranks", "failed", "at"}``, every rank there ended; its launcher has not).

    ``lines`` (lines): the job's output lines that arrived together, in order — one event per
    received chunk, not per line, so a chatty job costs the controller one queue hand-off and
    one terminal write per chunk. ``code`` (exit): the launcher's exit code, or -signal when a
    signal ended it.
    """

    kind: str
    rank: int
    host: str
    time: float
    text: str = ""
    code: int | None = None
    lines: tuple[str, ...] = ()
    report: dict[str, Any] | None = None  # exit: the node's own scan for leftovers
    heard: float | None = None  # lost: when the node was last heard from (wall clock)


class Watch:
    """Reader threads for started nodes, feeding ``events``. Attach nodes as they start."""

    def __init__(
        self,
        sup: Supervision | None = None,
        *,
        heartbeat: float = DEFAULT_HEARTBEAT,
        reattach: Callable[[NodeRun, float], list[Frame]] | None = None,
    ) -> None:
        if sup is None:
            from fleetctl.api.runspec import Supervision

            sup = Supervision()
        # the run's --lost-timeout: silent this long, a node is lost (half: reached afresh)
        self.lost_timeout = sup.lost_timeout
        self.heartbeat = heartbeat
        # A silent or closed channel: reach the node over a new connection before calling
        # it lost (fleetctl.phases.reattach), giving up at the deadline (time.monotonic());
        # returns the frames that came with its answer.
        self.reattach = reattach
        self.heard: dict[int, float] = {}  # rank -> wall-clock time its last bytes arrived
        self.events: queue.Queue[Event] = queue.Queue()
        self.runs: dict[int, NodeRun] = {}
        self.ended: dict[int, Event] = {}  # rank -> its exit or lost event
        self._threads: dict[int, threading.Thread] = {}  # ranks read by a thread of their own
        self._groups: list[_Group] = []
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._long: dict[int, LineJoiner] = {}  # rank -> a long line still arriving (C frames)

    def attach(self, run: NodeRun) -> None:
        run.reader.batch_lines = True  # from here on, only lines come in bulk
        if self._closing.is_set():  # started after the end: EOF makes its supervisor stop it
            with contextlib.suppress(Exception):
                run.stream.send(b"k")
                run.stream.close()
            return
        fd = _fileno(run.stream)
        with self._lock:
            self.runs[run.rank] = run
            self.heard[run.rank] = time.time()
            if fd is None:
                self._solo(run)
                return
            group = next((g for g in self._groups if g.size < GROUP), None)
            if group is None:
                group = _Group(self, len(self._groups))
                self._groups.append(group)
            group.add(run)

    def get(self, timeout: float) -> Event | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def lose(self, rank: int, why: str) -> bool:
        """Declare a running node lost on outside word (Slurm marked it DOWN), now rather than
        after the lost-node timeout: the same ``lost`` event a silence gives, its ``heard``
        the last time the node spoke. False when it had ended (or never started)."""
        run = self.runs.get(rank)
        if run is None or rank in self.ended:
            return False
        self._emit(run, "lost", why)
        return True

    def running(self) -> list[int]:
        """Ranks attached and not yet ended."""
        with self._lock:
            return [r for r in self.runs if r not in self.ended]

    def stop_nodes(self, *, hard: bool = False) -> None:
        """Ask every live supervisor to stop its job now (``t``: with grace, ``k``: kill)."""
        for rank in self.running():
            with contextlib.suppress(OSError, EOFError, Exception):
                self.runs[rank].stream.send(b"k" if hard else b"t")

    def wait_ended(self, timeout: float) -> list[int]:
        """Wait until every attached node has ended (exit or lost); returns those still running.

        Events keep flowing to the queue meanwhile; the caller drains it.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = self.running()
            if not left:
                return []
            time.sleep(0.05)
        return self.running()

    def close(self, keep: Iterable[int] = ()) -> None:
        """Stop reading; close every stream (a still-running supervisor sees EOF = dead-man).

        ``keep``: ranks whose stream stays open — their job has ended and their supervisor
        waits to send its run folder on it (``fleetctl.phases.collect``); the collector closes them.
        """
        self._closing.set()
        keep = set(keep)
        for g in list(self._groups):
            g.wake()
        for t in [*(g.thread for g in self._groups), *self._threads.values()]:
            t.join(2.0)
        for rank, run in self.runs.items():
            if rank in keep and not self._reading(rank):
                continue
            with contextlib.suppress(Exception):
                run.stream.close()

    def _reading(self, rank: int) -> bool:
        """Whether a reader thread may still be reading the rank's stream."""
        with self._lock:
            solo = self._threads.get(rank)
            if solo is not None:
                return solo.is_alive()
            return any(g.thread.is_alive() and rank in g.members for g in self._groups)

    def _solo(
        self,
        run: NodeRun,
        why: str | None = None,
        *,
        drain: bool = False,
        since: float | None = None,
    ) -> None:
        """A thread of its own for one node: no selectable stream, or a blocking step ahead
        (``drain`` a closing channel, or reach a silent node anew: ``why``; ``since``: when it
        was last heard, ``time.monotonic()``). Under the lock."""
        t = threading.Thread(
            target=self._follow,
            args=(run, why, drain, since),
            daemon=True,
            name=f"watch-{run.rank}",
        )
        self._threads[run.rank] = t
        t.start()

    # -- per node ---------------------------------------------------------------------------
    def _may_reattach(self, run: NodeRun) -> bool:
        from fleetctl.phases.reattach import MAX_REATTACH

        return (
            self.reattach is not None
            and not self._closing.is_set()
            and run.reattached < MAX_REATTACH
            and run.rank not in self.ended  # lost already (``lose``): no new connection
        )

    def _silent_too_long(self, run: NodeRun, silent: float) -> bool:
        """Time to act on a silent node: at half the lost-node timeout when a new connection
        may still reach it (a blip shorter than the timeout then costs nothing), else at the
        timeout (it is lost)."""
        if silent > self.lost_timeout:
            return True
        return silent > self.lost_timeout / 2 and self._may_reattach(run)

    def _heard(self, rank: int) -> None:
        self.heard[rank] = time.time()

    def _emit(
        self,
        run: NodeRun,
        kind: str,
        text: str = "",
        code: int | None = None,
        lines: tuple[str, ...] = (),
        report: dict[str, Any] | None = None,
    ) -> None:
        if self.runs.get(run.rank) not in (None, run):  # a spare took its place (--elastic)
            return
        heard = self.heard.get(run.rank) if kind == "lost" else None
        ev = Event(kind, run.rank, run.node.name, time.time(), text, code, lines, report, heard)
        if kind in ("exit", "lost"):
            with self._lock:
                if run.rank in self.ended:
                    return
                self.ended[run.rank] = ev
        self.events.put(ev)

    def _handle(self, run: NodeRun, frames: list[Frame]) -> bool:
        """Turn frames into events; True once the node reported its exit.

        Consecutive output lines become one ``lines`` event; any other frame flushes them
        first, so the order of lines, notices and the exit stays the node's order.
        """
        batch: list[str] = []
        joiner = self._long.setdefault(run.rank, LineJoiner())
        pieces = False
        for fr in frames:
            if fr.kind == "C":  # a piece of a long line: the next L frame ends it
                joiner.piece(fr.payload)
                if not pieces:  # output is moving, even if no line has ended yet
                    pieces = True
                    self._emit(run, "progress")
                continue
            if fr.kind == "L":  # one line, or several joined by newlines (batched reader)
                run.lines += fr.payload.count(b"\n") + 1
                if joiner.active:
                    first, sep, rest = fr.payload.partition(b"\n")
                    batch.append(joiner.finish(first))
                    if sep:
                        batch.extend(rest.decode("utf-8", errors="replace").split("\n"))
                else:
                    batch.extend(fr.text.split("\n"))
                continue
            if fr.kind == "?" and fr.payload:
                batch.append(fr.text)
                continue
            if fr.kind == "P":  # the job touched FLEET_PROGRESS_FILE
                self._emit(run, "progress")
                continue
            if fr.kind == "A":  # every rank ended there: what follows is its launcher's exit
                with contextlib.suppress(ValueError):
                    said = fr.data()
                    if isinstance(said, dict) and not run.ranks_ended:
                        run.ranks_ended = True
                        self._emit(run, "ranks_ended", report=said)
                continue
            if fr.kind == "W":  # where the node's ranks spent the last seconds (remote/kit/pace.py)
                with contextlib.suppress(ValueError):
                    said = fr.data()
                    if isinstance(said, dict):
                        self._emit(run, "pace", report=said)
                continue
            if fr.kind not in ("E", "F", "X"):
                continue
            if joiner.active:  # the job ended (or a notice) in the middle of a long line
                batch.append(joiner.finish())
            if batch:
                self._emit(run, "lines", lines=tuple(batch))
                batch = []
            if fr.kind == "X":
                code = exit_code_of(fr)
                self._emit(
                    run, "exit", code=code if code is not None else 255, report=exit_report_of(fr)
                )
                return True
            self._emit(run, "notice", fr.text)
        if batch:
            self._emit(run, "lines", lines=tuple(batch))
        return False

    def _follow(
        self,
        run: NodeRun,
        why: str | None = None,
        drain: bool = False,
        since: float | None = None,
    ) -> None:
        try:
            self._follow_inner(run, why, drain, since)
        except Exception as e:  # never die silently: a broken reader is a lost node
            self._emit(run, "lost", f"reader failed: {e}")

    def _drain(self, run: NodeRun) -> bool:
        """Read what is left on a closing channel, bounded by the lost-node timeout; True when
        the node's exit report was among it."""
        deadline = time.monotonic() + self.lost_timeout
        while time.monotonic() < deadline:
            data = run.stream.recv(min(0.2, max(0.01, deadline - time.monotonic())))
            if data is None:
                continue
            if not data:
                return self._handle(run, run.reader.flush())
            self._heard(run.rank)
            if self._handle(run, run.reader.feed(data)):
                return True
        return False

    def _follow_inner(
        self,
        run: NodeRun,
        why: str | None = None,
        drain: bool = False,
        since: float | None = None,
    ) -> None:
        if drain and self._drain(run):
            return
        if why is not None:  # from a group: its pending frames were handled there
            if self._revive(run, why, since) != "attached":
                return
        elif self._handle(run, run.pending):
            return
        last_rx = time.monotonic()
        last_hb = 0.0 if why is None else last_rx
        while not self._closing.is_set():
            stream = run.stream  # a reattach swaps it
            now = time.monotonic()
            why, since = None, None
            if now - last_hb >= self.heartbeat:
                last_hb = now
                try:
                    stream.send(b"h")
                except Exception as e:
                    # The supervisor closes its end when the job is over; its last lines and
                    # its exit report may still be buffered here. Drain them before calling
                    # the node lost, or a finished node loses its tail (and its logs).
                    if self._drain(run):
                        return
                    why, since = f"connection closed ({e or 'send failed'})", last_rx
            if why is None:
                data = stream.recv(min(0.2, self.heartbeat))
                if data is None:
                    silent = time.monotonic() - last_rx
                    if not self._silent_too_long(run, silent):
                        continue
                    why, since = f"no heartbeat for {silent:.1f}s", last_rx
                elif not data:
                    if self._handle(run, run.reader.flush()):
                        return
                    why, since = "connection closed before the job ended", last_rx
                else:
                    last_rx = time.monotonic()
                    self._heard(run.rank)
                    if self._handle(run, run.reader.feed(data)):
                        return
                    continue
            outcome = self._revive(run, why, since)
            if outcome != "attached":
                return
            last_rx = last_hb = time.monotonic()

    def _revive(self, run: NodeRun, why: str, since: float | None = None) -> str:
        """Reach a silent or cut-off node over a new connection before calling it lost:
        ``attached`` (read on), ``exit`` (its exit came with the answer), ``lost``.

        ``since``: when the node was last heard (``time.monotonic()``). It is lost once it has
        been silent for the lost-node timeout — the new connection is tried until then, and
        for at least half the timeout after a channel closed."""
        now = time.monotonic()
        since = now if since is None else since
        deadline = max(since + self.lost_timeout, now + self.lost_timeout / 2)
        if not self._may_reattach(run):
            self._emit(run, "lost", why)
            return "lost"
        self._emit(run, "notice", f"{why}: reaching the node over a new connection")
        try:
            frames = self.reattach(run, deadline)  # type: ignore[misc]
        except Exception as e:
            said = e.one_line() if hasattr(e, "one_line") else str(e)
            prefix = run.node.label + ": "
            said = said[len(prefix) :] if said.startswith(prefix) else said
            if why.startswith("no heartbeat"):  # the whole silence, now that it is over
                why = f"no heartbeat for {time.monotonic() - since:.1f}s"
            self._emit(run, "lost", f"{why}; a new connection failed too: {said}")
            return "lost"
        self._heard(run.rank)
        self._emit(run, "notice", f"back over a new connection after: {why}; the job ran on")
        return "exit" if self._handle(run, frames) else "attached"


class _Group:
    """One reader thread and one selector for up to ``GROUP`` nodes: reads what is ready,
    heartbeats each node on time, and hands a node that needs a blocking step to a thread of
    its own (``Watch._solo``)."""

    def __init__(self, watch: Watch, index: int) -> None:
        self.watch = watch
        self.sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.incoming: list[NodeRun] = []
        self.members: dict[int, list[float]] = {}  # rank -> [last byte in, last heartbeat out]
        self.size = 0  # nodes ever given to this group: its slots are not reused
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"watch-g{index}")
        self.thread.start()

    def add(self, run: NodeRun) -> None:
        """Under the watch's lock."""
        self.size += 1
        self.incoming.append(run)
        self.members[run.rank] = [time.monotonic(), 0.0]
        self.wake()

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"w")

    def _leave(self, run: NodeRun) -> None:
        with contextlib.suppress(Exception):
            self.sel.unregister(run.stream.fileno())  # type: ignore[attr-defined]
        with self.watch._lock:
            self.members.pop(run.rank, None)

    def _hand_off(
        self, run: NodeRun, why: str | None, *, drain: bool = False, since: float | None = None
    ) -> None:
        self._leave(run)
        with self.watch._lock:
            self.watch._solo(run, why, drain=drain, since=since)

    def _run(self) -> None:
        w = self.watch
        try:
            while not w._closing.is_set():
                with w._lock:
                    new, self.incoming = self.incoming, []
                for run in new:
                    self._join(run)
                for key, _ in self.sel.select(min(0.2, w.heartbeat)):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                        continue
                    self._read(key.data)
                self._tend()
        finally:
            self.sel.close()
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _join(self, run: NodeRun) -> None:
        try:
            if self.watch._handle(run, run.pending):
                self._leave(run)
                return
            fd = _fileno(run.stream)
            assert fd is not None
            self.sel.register(fd, selectors.EVENT_READ, run)
        except Exception as e:  # never die silently: a broken reader is a lost node
            self._leave(run)
            self.watch._emit(run, "lost", f"reader failed: {e}")

    def _read(self, run: NodeRun) -> None:
        w = self.watch
        try:
            data = run.stream.recv(0)
            if data is None:
                return
            if not data:
                if w._handle(run, run.reader.flush()):
                    self._leave(run)
                else:
                    since = self.members[run.rank][0]
                    self._hand_off(run, "connection closed before the job ended", since=since)
                return
            self.members[run.rank][0] = time.monotonic()
            w._heard(run.rank)
            if w._handle(run, run.reader.feed(data)):
                self._leave(run)
        except Exception as e:
            self._leave(run)
            w._emit(run, "lost", f"reader failed: {e}")

    def _tend(self) -> None:
        """Heartbeats due, and nodes silent past the lost-node timeout."""
        w = self.watch
        now = time.monotonic()
        for rank, times in list(self.members.items()):
            run = w.runs[rank]
            if now - times[1] >= w.heartbeat:
                times[1] = now
                try:
                    run.stream.send(b"h")
                except Exception as e:
                    # The supervisor closes its end when the job is over; its last lines and
                    # exit report may still be buffered: drained before calling it lost.
                    self._hand_off(
                        run,
                        f"connection closed ({e or 'send failed'})",
                        drain=True,
                        since=times[0],
                    )
                    continue
            silent = now - times[0]
            if w._silent_too_long(run, silent):
                self._hand_off(run, f"no heartbeat for {silent:.1f}s", since=times[0])


def _fileno(stream: object) -> int | None:
    """The stream's selectable descriptor; None: it gets a reader thread of its own."""
    fileno = getattr(stream, "fileno", None)
    return None if fileno is None else fileno()
