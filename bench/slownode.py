#!/usr/bin/env python3
"""What the slow-node watch costs a job (``run --on-slow``, docs/health.md): a 3-host lab DDP
job's mean step time with the watch off and on, and the sampler's own CPU per report.

``python bench/slownode.py [--runs 3] [--seconds 30]`` (root: it starts a namespace lab,
downed in ``finally``). Prints markdown rows; nothing is judged. The job is the real gloo DDP
loop ``tests/lab/test_slow_node.py`` runs (examples/ddp_steps.py), which prints its mean step
time (after its first 20 steps); off and on alternate, ``--runs`` of each, medians shown. On a
shared 2-core box the step times move with the load far more than by 1%: the sampler's CPU per
report (timed over 2,000 reports of 8 live processes on this machine), over the report
interval, is the bound that does not.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
STEPS = ROOT / "examples" / "ddp_steps.py"  # rank 0 prints its mean step time: STEP <s>


def step_time(inventory: str, folder: Path, on_slow: str, seconds: float) -> float:
    argv = [sys.executable, "-m", "fleetctl", "run", "-i", inventory, "--nproc-per-node", "1"]
    argv += ["--no-check", "--runs-dir", str(folder / "runs"), "--on-slow", on_slow]
    argv += [str(folder / "ddp_steps.py"), str(seconds)]
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
            shutil.copy(STEPS, folder)
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
