"""Measurement: a lost node's recovery, ``run --elastic`` (a hot spare joins the running job)
against a full retry (``--max-retries 1``: every node torn down, the job launched again on the
survivors and the spare), the same torchrun DDP job (gloo, 1 rank per node) on 4 lab hosts.

The job keeps its step in its working folder (pytorch/examples' elastic habit: every worker
start loads it, the world agrees on the MAX) and prints ``STEP <step> <time>`` after every
step. Once the 3-node world is at step 8 the lab cuts node rank 2's link (the spare: the host
the job did not start on). Each sample has a health ledger of its own
(``FLEETCTL_STATE_DIR``), else the host lost in one sample is left out of the next. From the
job's own clocks (lab hosts share this machine's): the cut to the spare's first step, and to
the first moment every rank of the world has stepped again (the slowest rank's first step
after the cut).
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Result, SampleFailed, repeat

TRAIN = """\
import datetime, os, sys, time
import torch
import torch.distributed as dist
total = int(sys.argv[1])
loaded = 0
if os.path.exists("step.txt"):
    with open("step.txt") as f:
        loaded = int(f.read())
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.tensor([loaded])
dist.all_reduce(t, op=dist.ReduceOp.MAX)
step = int(t.item())
while step < total:
    x = torch.ones(1)
    dist.all_reduce(x)
    step += 1
    if os.environ["LOCAL_RANK"] == "0":
        with open("step.txt.tmp", "w") as f:
            f.write(str(step))
        os.replace("step.txt.tmp", "step.txt")
    print(f"STEP {step} {time.time():.6f}", flush=True)
    time.sleep(0.2)
"""

STEP_RE = re.compile(r"^\[(\d+) (\S+)\] (?:\[rank \d+\] )?STEP (\d+) (\d+\.\d+)$")
HOSTS = 4
NODES = 3
STEPS = 60
CUT_AT = 8  # the world's step when the link is cut


def _steps(path: Path) -> list[tuple[int, str, int, float]]:
    """(node rank, host, step, time) of every STEP line fleetctl printed, in order."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = STEP_RE.match(line)
        if m:
            out.append((int(m.group(1)), m.group(2), int(m.group(3)), float(m.group(4))))
    return out


class ElasticBench:
    def __init__(self, phases: Any) -> None:
        self.p = phases

    def run(self, repeats: int) -> list[Result]:
        if len(self.p.lab.hosts) < HOSTS:
            raise RuntimeError(f"needs {HOSTS} lab hosts (--hosts {HOSTS})")
        common = ["--launcher", "torchrun", "--nproc-per-node", "1", "--nodes", str(NODES)]
        common += ["--no-check", "--lost-timeout", "3", "--deadman", "4", "--grace", "2"]
        rows = [
            (Result("elastic", "run --elastic: the spare joins", HOSTS), ["--elastic"]),
            (
                Result("elastic", "run --max-retries 1: a full retry with the spare", HOSTS),
                ["--max-retries", "1"],
            ),
        ]
        out = []
        for row, extra in rows:
            row.note = (
                f"node rank 2's link cut at step {CUT_AT}; timing: the cut to every rank's first "
                "step after it (the job's clocks); --lost-timeout 3"
            )
            out.append(repeat(row, repeats, lambda extra=extra: self._once(common + extra)))
        return out

    def _once(self, argv: list[str]) -> tuple[float, dict[str, Any]]:
        work = Path(tempfile.mkdtemp(dir=self.p.work, prefix="elastic-"))
        stdout = work / "stdout.log"
        # a health ledger of its own: the host lost here must not be left out of the next sample
        self.p.env["FLEETCTL_STATE_DIR"] = str(work / "state")
        cut: dict[str, Any] = {}

        def during(proc: Any, runs: Path, before: set) -> None:
            deadline = time.time() + 150
            while time.time() < deadline and proc.poll() is None:
                seen = _steps(stdout) if stdout.exists() else []
                if any(s >= CUT_AT for _, _, s, _ in seen):
                    victim = next(h for rank, h, _, _ in seen if rank == NODES - 1)
                    cut.update(t=time.time(), victim=victim, world={h for _, h, _, _ in seen})
                    self.p.lab.cut_link(victim)
                    return
                time.sleep(0.05)

        try:
            r = self.p.run_job(
                HOSTS,
                TRAIN,
                [str(STEPS)],
                name="elastic",
                extra=argv,
                timeout=300,
                during=during,
                stdout_path=stdout,
            )
        finally:
            self.p.env.pop("FLEETCTL_STATE_DIR", None)
            if cut:
                self.p.lab.heal_link(cut["victim"])
        if "t" not in cut:
            raise SampleFailed(f"the world never reached step {CUT_AT}: {r['why']}")
        if r["rc"] != 0:
            raise SampleFailed(f"exit {r['rc']}: {r['why']}")
        [spare] = [h.name for h in self.p.lab.hosts[:HOSTS] if h.name not in cut["world"]]
        after = [(h, s, t) for _, h, s, t in _steps(stdout) if t > cut["t"]]
        first: dict[str, float] = {}
        for h, _, t in after:
            first.setdefault(h, t)
        hosts = [h for h in first if h != cut["victim"]]
        if spare not in first or len(hosts) < NODES:
            raise SampleFailed(f"not every rank stepped after the cut: {sorted(first)}")
        lost = [t for t, k, text in r["events"] if k == "lost" or " lost (" in text]
        if not lost:
            raise SampleFailed(f"{cut['victim']} was not lost: {r['why']}")
        return max(first[h] for h in hosts) - cut["t"], {
            "cut → lost s": lost[0] - cut["t"],
            "cut → spare's first step s": first[spare] - cut["t"],
            "spare's first step": min(s for h, s, _ in after if h == spare),
            "cut → exit s": r["t0"] + r["wall"] - cut["t"],
        }
