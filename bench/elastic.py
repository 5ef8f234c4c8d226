"""Measurement: a lost node's recovery, ``run --elastic`` (a hot spare joins the running job)
against a full retry (``--max-retries 1``: every node torn down, the job launched again on the
survivors and the spare), the same torchrun DDP job (gloo, 1 rank per node) on 4 lab hosts.

The job keeps its step in its working folder (pytorch/examples' elastic habit: every worker
start loads it, the world agrees on the MAX) and prints ``STEP <step> <time>`` after every
step. Once the 3-node world is at step 8 the lab cuts node3's link. From the job's own clocks
(lab hosts share this machine's): the cut to the spare's first step, and to the first moment
every rank of the world has stepped again (the slowest rank's first step after the cut).
"""

from __future__ import annotations

import re
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

STEP_RE = re.compile(r"^\[\d+ (\S+)\] (?:\[rank \d+\] )?STEP (\d+) (\d+\.\d+)$")
HOSTS = 4
NODES = 3
STEPS = 60
CUT_AT = 8  # the world's step when the link is cut


def _steps(path: Path) -> list[tuple[str, int, float]]:
    """(host, step, time) of every STEP line fleetctl printed, in order."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = STEP_RE.match(line)
        if m:
            out.append((m.group(1), int(m.group(2)), float(m.group(3))))
    return out


class ElasticBench:
    def __init__(self, phases: Any) -> None:
        self.p = phases

    def run(self, repeats: int) -> list[Result]:
        if len(self.p.lab.hosts) < HOSTS:
            raise RuntimeError(f"needs {HOSTS} lab hosts (--hosts {HOSTS})")
        victim, spare = self.p.lab.hosts[NODES - 1].name, self.p.lab.hosts[NODES].name
        common = ["--launcher", "torchrun", "--nproc-per-node", "1", "--nodes", str(NODES)]
        common += ["--no-check", "--lost-timeout", "3", "--deadman", "4", "--grace", "2"]
        rows = [
            (Result("elastic", f"run --elastic: spare {spare} joins", HOSTS), ["--elastic"]),
            (
                Result("elastic", f"run --max-retries 1: a full retry with {spare}", HOSTS),
                ["--max-retries", "1"],
            ),
        ]
        out = []
        for row, extra in rows:
            row.note = (
                f"cut {victim}'s link at step {CUT_AT}; timing: the cut to every rank's first "
                "step after it (the job's clocks); default --lost-timeout 3 here"
            )
            out.append(
                repeat(row, repeats, lambda extra=extra: self._once(common + extra, victim, spare))
            )
        return out

    def _once(self, argv: list[str], victim: str, spare: str) -> tuple[float, dict[str, Any]]:
        stdout = self.p.work / "elastic-stdout.log"
        cut: dict[str, float] = {}

        def during(proc: Any, runs: Path, before: set) -> None:
            deadline = time.time() + 150
            while time.time() < deadline and proc.poll() is None:
                if stdout.exists() and any(s >= CUT_AT for _, s, _ in _steps(stdout)):
                    cut["t"] = time.time()
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
            if cut:
                self.p.lab.heal_link(victim)
        if "t" not in cut:
            raise SampleFailed(f"the world never reached step {CUT_AT}: {r['why']}")
        if r["rc"] != 0:
            raise SampleFailed(f"exit {r['rc']}: {r['why']}")
        after = [(h, s, t) for h, s, t in _steps(stdout) if t > cut["t"]]
        first: dict[str, float] = {}
        for h, _, t in after:
            first.setdefault(h, t)
        hosts = [h for h in first if h != victim]
        if spare not in first or len(hosts) < NODES:
            raise SampleFailed(f"not every rank stepped after the cut: {sorted(first)}")
        lost = [t for t, k, text in r["events"] if k == "lost" or " lost (" in text]
        resumed = min(s for h, s, _ in after if h == spare)
        return max(first[h] for h in hosts) - cut["t"], {
            "cut → lost s": (lost[0] - cut["t"]) if lost else None,
            "cut → spare's first step s": first[spare] - cut["t"],
            "spare's first step": resumed,
            "cut → exit s": r["t0"] + r["wall"] - cut["t"],
        }
