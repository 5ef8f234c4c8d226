"""The post-mortem's time to name: on lab fleets of N hosts with one host's data link throttled
(tc tbf, 50 Mbit/s into it), the proof of ``fleetctl.job.proof`` from a cold start (its
connections and node programs started as a teardown would start them) until it names the host:
all pairs in one collective up to 8 hosts, the bisection beyond. Run by hand (root, namespace
labs with 2 networks, downed in ``finally``); prints one markdown row per fleet size."""

from __future__ import annotations

import argparse
import os
import time
from types import SimpleNamespace


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="4,16")
    p.add_argument("--limit", type=float, default=120.0, help="the proof's limit (s)")
    args = p.parse_args()
    from fleetctl.job.proof import Ahead, prove
    from fleetctl.lab import Lab
    from fleetctl.plan.inventory import load_inventory
    from fleetctl.ssh.connection import SSHSettings

    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print("| hosts | throttled | named | rounds | time to name |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.hosts.split(",")):
        lab = Lab.up(n, networks=2)
        try:
            nodes = load_inventory(lab.inventory_path).nodes
            by = {h.name: h for h in lab.hosts}
            plan = SimpleNamespace(
                nodes=[
                    SimpleNamespace(
                        host=x.name,
                        train_addr=by[x.name].data_addr,
                        nic=by[x.name].data_nic,
                        python=x.python,
                        container=None,
                    )
                    for x in nodes
                ]
            )
            slow = lab.hosts[n // 2].name
            lab.slow_link(slow, "data", "50mbit")
            job = SimpleNamespace(
                plan=plan,
                nodes=list(nodes),
                options=SimpleNamespace(
                    post_mortem_timeout=args.limit, settings=SSHSettings(connect_timeout=10)
                ),
                result=SimpleNamespace(culprits=None),
            )
            t = time.monotonic()
            proof = prove(job, Ahead(job, "bench"))  # type: ignore[arg-type]
            took = time.monotonic() - t
            f = proof.finding
            print(
                f"| {n} | {slow} | {f.kind} {' '.join(f.hosts)} | {len(proof.rounds)} | "
                f"{took:.1f} s |",
                flush=True,
            )
            for i, r in enumerate(proof.rounds, 1):
                print(f"  round {i}: {r.to_dict()}", flush=True)
        finally:
            lab.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
