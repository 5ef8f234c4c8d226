#!/usr/bin/env python3
"""The controller's log path in one process, fed the frames a log bench node sends: CPU and
memory of each stage without a lab, SSH or a loaded machine's noise.

``python bench/logpath.py`` (no root, no lab; ~10 s). The input is what ``bench/run.py --only
logs`` makes its 16 nodes print (numbered 50-byte lines, written ``rate / 100`` at a time),
framed as the node supervisor frames them (``L <line>`` plus a heartbeat ``H`` now and then).
Each chunk goes the way a received one goes on the controller:

- **watch** (the reader thread): ``FrameReader.feed`` → ``Watch._handle`` → a ``lines`` event
  on the watch's queue;
- **job** (the main thread): ``context.on_event`` — the node's tail, its
  ``console.streamed.log`` spool, the progress-rate judge — and the run command's
  ``LiveLog`` writing to /dev/null.

CPU is ``time.process_time`` per stage (best of ``--repeat``), so a loaded machine moves it
less than wall time; ``live view`` is the job side less the same with a no-op view. ``all
queued, MB`` is what the run's events hold (tracemalloc) when the job side has not taken any
yet: the backlog's cost per line when the main thread falls behind the reader. ``--src DIR``
measures the fleetctl package under DIR (an older checkout, for a before/after). Nothing here
is judged: the numbers are reported, and bench/by_hand.md says what they were.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace
from typing import Any

# this checkout's fleetctl, or the one of --src (an older tree, for a before/after)
_src = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv[:-1] else None
sys.path.insert(0, _src or str(Path(__file__).resolve().parent.parent))

PAD = "x" * 40


def chunks(nodes: int, rate: int, seconds: float) -> list[tuple[int, bytes]]:
    """(rank, bytes received) in arrival order: each node's writes of ``rate // 100`` lines,
    round robin, as its supervisor frames them, a heartbeat every 100 writes."""
    batch = max(1, rate // 100)
    total = int(rate * seconds)
    out = []
    for k, i in enumerate(range(0, total, batch)):
        for r in range(nodes):
            body = b"".join(
                b"L %s\n" % f"L{r}:{j:07d} {PAD}".encode() for j in range(i, min(i + batch, total))
            )
            out.append((r, body + (b"H\n" if k % 100 == 99 else b"")))
    return out


def watch_side(data: list[tuple[int, bytes]], nodes: int) -> list[Any]:
    """The reader thread's work: frames, then events (returned, in order)."""
    from fleetctl.phases.frames import FrameReader
    from fleetctl.phases.watch import Watch

    watch = Watch()
    runs = [
        SimpleNamespace(
            rank=r, node=SimpleNamespace(name=f"node{r + 1}"), lines=0, reader=FrameReader()
        )
        for r in range(nodes)
    ]
    for run in runs:
        run.reader.batch_lines = True
    for rank, body in data:
        run = runs[rank]
        watch._handle(run, run.reader.feed(body))  # type: ignore[arg-type]
    events = []
    while not watch.events.empty():
        events.append(watch.events.get_nowait())
    return events


def job_side(events: list[Any], nodes: int, runs_dir: Path) -> None:
    """The main thread's work for each event: ``on_event`` with the judges a run makes at
    launch, the live view writing every line to /dev/null."""
    from fleetctl.api.runspec import Supervision
    from fleetctl.cli.render import LiveLog
    from fleetctl.job.diagnose.pace import judge_for
    from fleetctl.job.diagnose.progress_rate import progress_judge
    from fleetctl.job.run.context import JobContext, on_event
    from fleetctl.job.run.job import RunOptions
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec

    hosts = [Node(name=f"node{i + 1}", address=f"10.0.0.{i + 1}") for i in range(nodes)]
    sup = Supervision()
    with open(os.devnull, "w") as null:
        live = LiveLog(tail="all", colour=False, out=null, err=null)
        opts = RunOptions(runs_dir=runs_dir, supervision=sup)
        spec = JobSpec(script="job.py", job_id=f"bench-{time.monotonic_ns()}")
        job = JobContext(spec, hosts, opts, live)
        by_rank = {i: n.name for i, n in enumerate(hosts)}
        job.pace = judge_for(by_rank, None, sup.slow_rounds)
        job.progress_judge = progress_judge(by_rank, None, sup.slow_rounds)
        job.state.launch()
        job.begun = time.monotonic()
        for ev in events:
            on_event(job, ev)
        job.close_spools(keep=set())


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        gc.collect()
        t = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t)
    return best, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=16)
    p.add_argument("--rates", default="5000,1000", help="lines/s per node, comma list")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--src", default=None, help="measure the fleetctl package under this folder")
    a = p.parse_args(argv)
    import fleetctl

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"fleetctl {Path(fleetctl.__file__).parent}; load average {load}")
    print(
        "| lines/s per node | lines | chunks | watch CPU s | job CPU s | of it: live view s "
        "| all queued, MB |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="fleetctl-logpath-") as tmp:
        for rate in (int(x) for x in a.rates.split(",")):
            row = measure(a.nodes, rate, a.seconds, a.repeat, Path(tmp))
            print("| " + " | ".join(row) + " |")
    return 0


def measure(nodes: int, rate: int, seconds: float, repeat: int, tmp: Path) -> list[str]:
    """One row: each stage's CPU (best of ``repeat``) and the events' size when queued."""
    data = chunks(nodes, rate, seconds)
    t_watch, events = timed(lambda: watch_side(data, nodes), repeat)
    t_job, _ = timed(lambda: job_side(events, nodes, tmp), repeat)
    t_none, _ = timed(lambda: _job_no_view(events, nodes, tmp), repeat)
    n = sum(len(e.lines) for e in events)
    tracemalloc.start()
    kept = watch_side(data, nodes)
    queued = tracemalloc.get_traced_memory()[0] / 1e6
    tracemalloc.stop()
    del kept
    return [
        str(rate),
        str(n),
        str(len(data)),
        f"{t_watch:.3f}",
        f"{t_job:.3f}",
        f"{t_job - t_none:.3f}",
        f"{queued:.1f}",
    ]


def _job_no_view(events: list[Any], nodes: int, runs_dir: Path) -> None:
    from fleetctl.cli import render

    real = render.LiveLog.__call__
    render.LiveLog.__call__ = lambda self, ev: None  # type: ignore[method-assign]
    try:
        job_side(events, nodes, runs_dir)
    finally:
        render.LiveLog.__call__ = real  # type: ignore[method-assign]


if __name__ == "__main__":
    sys.exit(main())
