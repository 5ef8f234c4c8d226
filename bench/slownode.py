#!/usr/bin/env python3
"""What the slow-node watch costs a job (``run --on-slow``, docs/health.md): a 3-host lab DDP
job's mean step time with the watch off and on, and the sampler's own CPU per report.

``python bench/slownode.py [--runs 3] [--seconds 30]`` (root: it starts a namespace lab,
downed in ``finally``). Prints markdown rows; nothing is judged. The job runs the same real
gloo DDP loop as ``tests/lab/test_slow_node.py`` and prints its mean step time (after its
first 20 steps); off and on alternate, ``--runs`` of each, medians shown. On a shared 2-core
box the step times move with the load far more than by 1%: the sampler's CPU per report
(timed over 2,000 reports of 8 live processes on this machine), over the report interval,
is the bound that does not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent

STEPS = """\
import sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
torch.set_num_threads(1)
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Tanh(), torch.nn.Linear(128, 1))
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(128, 128), torch.randn(128, 1)
end, flag, step, t0 = time.time() + float(sys.argv[1]), torch.zeros(1), 0, None
while True:
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()
    flag[0] = float(time.time() > end)
    dist.all_reduce(flag)
    step += 1
    if step == 20:
        t0 = time.perf_counter()
    if flag[0] > 0:
        break
if dist.get_rank() == 0 and t0 is not None:
    print("STEP %.6f" % ((time.perf_counter() - t0) / (step - 20)), flush=True)
dist.destroy_process_group()
"""


def step_time(inventory: str, folder: Path, on_slow: str, seconds: float) -> float:
    argv = [sys.executable, "-m", "fleetctl", "run", "-i", inventory, "--nproc-per-node", "1"]
    argv += ["--no-check", "--runs-dir", str(folder / "runs"), "--on-slow", on_slow]
    argv += [str(folder / "steps.py"), str(seconds)]
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLEETCTL_SSH_CONFIG="/dev/null")
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    line = next((ln for ln in out.stdout.splitlines() if "STEP " in ln), None)
    if line is None:
        raise RuntimeError(f"no step time (exit {out.returncode}): {out.stderr[-500:]}")
    return float(line.rsplit("STEP ", 1)[1])


def sampler_cost(reports: int = 2000, ranks: int = 8) -> float:
    """CPU seconds of one report over ``ranks`` live processes on this machine."""
    from fleetctl.remote.kit.pace import PaceSampler

    kids = [subprocess.Popen(["sleep", "60"]) for _ in range(ranks)]
    try:
        sampler = PaceSampler(lambda: {str(i): k.pid for i, k in enumerate(kids)})
        sampler.report()
        c = time.process_time()
        for _ in range(reports):
            sampler.report()
        return (time.process_time() - c) / reports
    finally:
        for k in kids:
            k.kill()
            k.wait()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    from fleetctl.lab import Lab
    from fleetctl.remote.kit.pace import REPORT

    per = sampler_cost()
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(
        f"sampler: {per * 1e6:.0f} µs CPU per report of 8 ranks, every {REPORT:g} s: "
        f"{100 * per / REPORT:.3f}% of one core"
    )
    print("| runs | step time, watch off | step time, watch on (warn) | on vs off |")
    print("|---|---|---|---|")
    lab = Lab.up(3)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            (folder / "steps.py").write_text(STEPS)
            off, on = [], []
            for _ in range(args.runs):
                off.append(step_time(str(lab.inventory_path), folder, "off", args.seconds))
                on.append(step_time(str(lab.inventory_path), folder, "warn", args.seconds))
            a, b = statistics.median(off), statistics.median(on)
            row = f"| {args.runs} | {1e3 * a:.2f} ms | {1e3 * b:.2f} ms | "
            print(row + f"{100 * (b - a) / a:+.1f}% |", flush=True)
    finally:
        lab.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
