"""Which process is which local rank, and when and how each ended (mode ``run``'s watcher
thread): ``rank_pids.json``, ``rank_exits.json``, and ``ranks_ended.json`` with the ``A``
frame once the last rank ended.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import threading
import time
from collections.abc import Callable

from .atomic import now, write_json
from .output import Out
from .procfs import zombie_exit
from .ranks import all_ended, pidfd_open, rank_processes
from .wire import RANK_EXITS, RANK_PIDS, RANKS_ENDED


class RankWatch:
    """The supervisor's rank pids (``rank_pids``, local rank -> pids, shared with it: the pace
    sampler reads them) kept and their ends told. ``root``: where the ranks are (None until
    known); ``stopping``: whether a stop of ours was asked (a rank it ended is never a first
    failure)."""

    def __init__(
        self,
        run_dir: str,
        out: Out,
        rank_pids: dict,
        expected: int,
        root: Callable[[], int | None],
        stopping: Callable[[], bool],
    ) -> None:
        self.run_dir = run_dir
        self.out = out
        self.rank_pids = rank_pids
        self.expected = expected
        self.root = root
        self.stopping = stopping
        self.exits: dict = {}  # pid -> {"local", "pid", "code", "at"[, "after_stop"]}
        self.said: list = []  # the ``A`` frame's payload, once sent

    def ended(self, pid: int, local: str, code: int | None) -> None:
        exits = self.exits
        exits[pid] = {"local": int(local), "pid": pid, "code": code, "at": now()}
        if self.stopping():  # ended by our stop: never a first failure
            exits[pid]["after_stop"] = True
        with contextlib.suppress(OSError):
            write_json(os.path.join(self.run_dir, RANK_EXITS), {"exits": list(exits.values())})
        # The last rank ended, not by our stop: ``A`` once (and ranks_ended.json for a
        # detached job's ``status``), so a launcher's slow shut-down is not taken for a stall.
        all_done = all_ended(self.rank_pids, exits, self.expected) if not self.said else None
        if all_done is not None and not any(e.get("after_stop") for e in exits.values()):
            self.said.append(all_done)
            all_done["at"] = exits[pid]["at"]
            with contextlib.suppress(OSError):
                write_json(os.path.join(self.run_dir, RANKS_ENDED), all_done)
            self.out.frame("A", json.dumps(all_done, sort_keys=True).encode(), must=True)

    def run(self, done: threading.Event) -> None:
        """Until ``done``: the topmost process per local rank (``LOCAL_RANK`` torchrun/
        deepspeed, ``PADDLE_LOCAL_RANK`` paddle in its env), each new one (a launcher restart)
        added; often at first, then every few seconds: ranks start once, restarts are rare (a
        rank that ends within a fraction of a second may go unseen: its pid stays unknown).

        A pidfd per rank process wakes us the moment it ends: its time is exact (which rank
        failed first, across nodes, is decided by these times) and its exit status is read
        while it is still a zombie, before its launcher reaps it (torchrun looks every 0.1 s,
        deepspeed every 1 s). Without pidfds (Linux < 5.3) /proc is read every 0.05 s."""
        t0 = time.monotonic()
        next_scan = 0.0
        poller = select.poll()
        pidfds: dict = {}  # fd -> (pid, local)
        watched: set = set()
        try:
            while not done.is_set():
                for local, pids in list(self.rank_pids.items()):
                    pid = pids[-1]
                    if pid in watched:
                        continue
                    watched.add(pid)
                    fd = pidfd_open(pid)
                    if fd is not None:
                        pidfds[fd] = (pid, local)
                        poller.register(fd, select.POLLIN)
                for fd, _ in poller.poll(50):
                    pid, local = pidfds.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    self.ended(pid, local, zombie_exit(pid))
                for local, pids in list(self.rank_pids.items()):
                    pid = pids[-1]
                    if pid in self.exits or any(pid == p for p, _ in pidfds.values()):
                        continue
                    code = zombie_exit(pid)
                    if code is not None:
                        self.ended(pid, local, code)
                age = time.monotonic() - t0
                if age < next_scan:
                    continue
                next_scan = age + (0.2 if age < 10 else 1.0 if age < 60 else 5.0)
                changed = False
                root = self.root()
                for local, pid in rank_processes(root) if root is not None else ():
                    pids = self.rank_pids.setdefault(str(local), [])
                    if pid not in pids:
                        pids.append(pid)
                        changed = True
                if changed:
                    with contextlib.suppress(OSError):
                        write_json(os.path.join(self.run_dir, RANK_PIDS), self.rank_pids)
        finally:
            for fd in pidfds:
                with contextlib.suppress(OSError):
                    os.close(fd)
