"""The post-mortem's time to name: on lab fleets of N hosts with one host's data link throttled
(tc tbf, 50 Mbit/s into it), the proof of ``fleetctl.job.diagnose.proof`` from a cold start (its
connections and node programs started as a teardown would start them) until it names the host:
all pairs in one collective up to 8 hosts, the bisection beyond (``--bisect``: from 3 hosts, to
time its rounds on a small lab). Run by hand (root, namespace
labs with 2 networks, downed in ``finally``); prints one markdown row per fleet size."""

from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="4,16")
    p.add_argument("--limit", type=float, default=120.0, help="the proof's limit (s)")
    p.add_argument(
        "--bisect", action="store_true", help="bisect from 3 hosts (no all-pairs short-cut)"
    )
    args = p.parse_args()
    from fleetctl.job.diagnose import proof as proof_module
    from fleetctl.job.diagnose.proof import Ahead, prove
    from fleetctl.lab import Lab
    from fleetctl.testing.proofs import lab_proof_job

    if args.bisect:  # the rounds a fleet past 8 hosts runs, on one that fits this machine
        proof_module.ALL_PAIRS_UP_TO = 2
    print("| hosts | throttled | named | rounds | time to name | programs | load at the start |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.hosts.split(",")):
        lab = Lab.up(n, networks=2)
        try:
            slow = lab.hosts[n // 2].name
            lab.slow_link(slow, "data", "50mbit")
            job = lab_proof_job(lab, args.limit)
            load = " ".join(f"{x:.1f}" for x in os.getloadavg())
            t = time.monotonic()
            proof = prove(job, Ahead(job, "bench"))
            took = time.monotonic() - t
            f = proof.finding
            print(
                f"| {n} | {slow} | {f.kind} {' '.join(f.hosts)} | {len(proof.rounds)} | "
                f"{took:.1f} s | {proof.programs} | {load} |",
                flush=True,
            )
            for i, r in enumerate(proof.rounds, 1):
                print(f"  round {i}: {r.to_dict()}", flush=True)
        finally:
            lab.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
