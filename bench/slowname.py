#!/usr/bin/env python3
"""The slow-node watch's time to name (``run --on-slow``, docs/health.md): on lab fleets of N
hosts, a synchronous gloo DDP job (one rank per host, under torchrun, no change to the script)
with one host's processes CPU-capped through its own cpu cgroup (``lab fault cpu-cap``), until
the watch names a host — job.json's ``slow``: ``seconds`` from the launch, ``at_round``.

``python bench/slowname.py [--hosts 4,16] [--samples 1] [--share 0.25] [--when start,steps]``
(root: a namespace lab per size, downed in ``finally``; the health ledger goes to a temporary
state folder). Prints markdown rows; nothing is judged.

The cap is scaled to the fair share, not a fixed percent: on a machine with C cores shared by
N lab hosts each host gets ~C/N of a CPU, and a cap of 20% of one CPU is no cap at all when
C/N is 1/8. ``--share 0.25``: a quarter of C/N (``--percent`` fixes it instead). ``--when
start``: capped before the launch (the capped host then also starts torchrun and imports
torch at that pace: it is in the time to name); ``steps``: capped once rank 0 has stepped, as
``tests/lab/test_slow_node.py`` does (``cap to named``: the judge's own latency).
``--on-slow stop`` ends each job at its verdict; a job never named runs ``--seconds``.

Every round of pace reports the controller's judge completes is kept (a recording wrapper
around ``PaceJudge.add`` in the ``fleetctl run`` process: the suspect and each node's busy
share, cgroup throttled share and CPU), printed under a row whose job named nobody or the
wrong host — the evidence of why.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the job: rank 0 prints STEPPING once it steps (the ``steps`` cap's cue)
STEPS = ROOT / "examples" / "ddp_steps.py"
sys.path.insert(0, str(ROOT))


# ``fleetctl run`` with every completed round of the pace judge appended to a JSON-lines file
RECORDED_RUN = """\
import json, sys, time
from fleetctl.job.diagnose import pace

out = open(sys.argv.pop(1), "a")
add = pace.PaceJudge.add


def recorded(self, rank, report):
    count = self.count
    verdict = add(self, rank, report)
    if self.count != count:
        got, nodes = self.rounds[-1]
        row = {"t": time.time(), "round": self.count, "suspect": got.host if got else None}
        row["nodes"] = [[p.host, round(p.busy, 2), p.throttled, round(p.cpu, 3)] for p in nodes]
        out.write(json.dumps(row) + "\\n")
        out.flush()
    return verdict


pace.PaceJudge.add = recorded
sys.argv[0] = "fleetctl"
from fleetctl.cli import main

main()
"""


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def one_job(lab, folder: Path, slow: str, percent: float, when: str, args) -> dict:
    """One job on ``lab`` with ``slow`` capped: what job.json and the judge's rounds say."""
    rounds = folder / f"rounds-{time.monotonic_ns()}.jsonl"
    argv = [sys.executable, "-c", RECORDED_RUN, str(rounds), "run", "-i", str(lab.inventory_path)]
    argv += ["--nproc-per-node", "1", "--no-check", "--runs-dir", str(folder / "runs")]
    argv += ["--on-slow", "stop", "--no-post-mortem", "--timeout", str(args.timeout)]
    argv += [str(folder / "ddp_steps.py"), str(args.seconds), "--width", "64"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), FLEETCTL_SSH_CONFIG="/dev/null")
    env["FLEETCTL_STATE_DIR"] = str(folder / "state")  # the ledger: not the user's
    at_start = load()
    capped_at: list[float] = []
    if when == "start":
        lab.cpu_cap(slow, percent)
        capped_at.append(time.time())
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    )
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if when == "steps" and not capped_at and "STEPPING" in line:
                lab.cpu_cap(slow, percent)
                capped_at.append(time.time())
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if capped_at:
            lab.clear_cpu_cap(slow)
    reader.join(timeout=10)
    folder_of = next((ln.rsplit(" job ", 1)[1].strip() for ln in err if "launching " in ln), None)
    job = {}
    if folder_of is not None:
        job = json.loads((folder / "runs" / folder_of / "job.json").read_text())
    got = [json.loads(ln) for ln in rounds.read_text().splitlines()] if rounds.exists() else []
    from fleetctl.job.records.runs import _parse_iso

    started = _parse_iso(job.get("started"))
    return {
        "exit": proc.returncode,
        "job": job,
        "rounds": got,
        "load": at_start,
        "capped_after_launch": (capped_at[0] - started) if capped_at and started else None,
        "stderr_tail": "".join(err[-5:]),
    }


def row(n: int, slow: str, percent: float, when: str, got: dict) -> str:
    s = got["job"].get("slow")
    rounds = len(got["rounds"])
    if not s:
        named, right, healthy, secs, at, cap = "nobody", "no", "no", "—", "—", "—"
    else:
        named = s["host"]
        right = "yes" if s["host"] == slow else "no"
        healthy = "no" if right == "yes" else f"yes ({s['host']})"
        secs, at = f"{s['seconds']:.1f} s", str(s["at_round"])
        c = got["capped_after_launch"]
        cap = f"{s['seconds'] - c:.1f} s" if when == "steps" and c is not None else "—"
    return (
        f"| {n} | {slow} at {percent:.3g}% | {when} | {named} | {right} | {healthy} | {secs} | "
        f"{at} of {rounds} | {cap} | {got['load']} |"
    )


def evidence(got: dict) -> list[str]:
    """The judge's rounds (busy share, throttled share, CPU per node) and the verdict's why."""
    out = [f"  exit {got['exit']}; slow: {json.dumps(got['job'].get('slow'))[:600]}"]
    for r in got["rounds"]:
        nodes = " ".join(
            f"{h}:{b:.2f}/{'-' if t is None else f'{t:.2f}'}/{c:.2f}" for h, b, t, c in r["nodes"]
        )
        out.append(f"  round {r['round']}: suspect {r['suspect']}; busy/throttled/cpu {nodes}")
    if not got["job"]:
        out.append(f"  no job.json; stderr: {got['stderr_tail'][-800:]}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="4,16")
    p.add_argument("--samples", type=int, default=1, help="jobs per size and --when")
    p.add_argument("--share", type=float, default=0.25, help="the cap: this × cores/N of a CPU")
    p.add_argument("--percent", type=float, help="the cap in percent of one CPU (not scaled)")
    p.add_argument("--when", default="start,steps", help="cap at start, at steps, or both")
    p.add_argument("--seconds", type=float, default=90.0, help="the job's length unless named")
    p.add_argument("--timeout", type=float, default=300.0, help="the run's --timeout")
    p.add_argument("--verbose", action="store_true", help="every job's rounds, not only misses")
    args = p.parse_args()
    from fleetctl.lab import Lab

    cores = os.cpu_count() or 1
    print(f"{cores} cores; cap: {args.percent or f'{args.share:g} × {cores}/N of one CPU'}")
    print(
        "| hosts | capped | capped at | named | right host | a healthy host named | "
        "launch to named (job.json `seconds`) | at round (`at_round`) of rounds | "
        "cap to named | load at the start |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.hosts.split(",")):
        percent = args.percent or max(1.0, 100 * args.share * cores / n)
        lab = Lab.up(n)
        try:
            slow = lab.hosts[n // 2].name
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(tmp)
                shutil.copy(STEPS, folder)
                for _ in range(args.samples):
                    for when in args.when.split(","):
                        got = one_job(lab, folder, slow, percent, when, args)
                        print(row(n, slow, percent, when, got), flush=True)
                        s = got["job"].get("slow")
                        if args.verbose or not s or s.get("host") != slow:
                            print("\n".join(evidence(got)), flush=True)
        finally:
            lab.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
