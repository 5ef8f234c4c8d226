#!/usr/bin/env python3
"""``check --collective`` on lab fleets: its wall time, and its all-reduce busbw next to a plain
``torch.distributed`` all-reduce script's over the same data network.

``python bench/collective.py [--hosts 4,16,64] [--size-mib 32]`` (root: it starts namespace
labs, downed in ``finally``). Prints one markdown row per fleet size; nothing is judged. The
plain script is started on every host at once and imports torch as the benchmark's node
program does; both use gloo over the data NIC, the same bytes, best of 3. CPU seconds of
``check --collective``: the lab hosts' (every process their sshd and init reaped, summed over
hosts: the node programs' torch import and traffic, the probe) and this controller's; robust
to load where the wall time is not, as every lab host shares this machine's cores.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PLAIN = """
import os, sys, time, datetime, torch, torch.distributed as dist
rank, world, master, nic = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
size = int(sys.argv[5])
os.environ["GLOO_SOCKET_IFNAME"] = nic
dist.init_process_group("gloo", init_method="tcp://%s:29731" % master, rank=rank,
                        world_size=world, timeout=datetime.timedelta(seconds=600))
buf = torch.ones(size // 4)
dist.all_reduce(buf)
best = None
for _ in range(3):
    dist.barrier(); t = time.perf_counter(); dist.all_reduce(buf); t = time.perf_counter() - t
    best = t if best is None else min(best, t)
print("BUSBW %f" % (size / best / 1e9 * 2 * (world - 1) / world))
dist.destroy_process_group()
"""


def plain_allreduce(lab, size: int) -> float:
    hosts = lab.hosts
    master = hosts[0].data_addr

    def one(i: int) -> float:
        argv = [
            sys.executable,
            "-c",
            PLAIN,
            str(i),
            str(len(hosts)),
            master,
            hosts[i].data_nic,
            str(size),
        ]
        out = lab.exec(hosts[i].name, argv, timeout=600).stdout
        return float(out.split("BUSBW")[-1]) if "BUSBW" in out else 0.0

    with cf.ThreadPoolExecutor(len(hosts)) as pool:
        return min(pool.map(one, range(len(hosts))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", default="4,16,64")
    p.add_argument("--size-mib", type=float, default=32.0)
    args = p.parse_args()
    from fleet import remote_cpu

    from fleetctl.lab import Lab
    from fleetctl.phases.check.collective_judge import CollectiveOptions, MiB
    from fleetctl.phases.check.preflight import CheckOptions, check_fleet
    from fleetctl.plan.inventory import load_inventory
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import SSHSettings

    size = int(args.size_mib * MiB)
    print("load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(
        "| hosts | check | check --collective | collective part | lab hosts CPU | controller "
        "CPU | all-reduce busbw (fleetctl) | plain torch.distributed all-reduce busbw | "
        "median link busbw |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.hosts.split(",")):
        lab = Lab.up(n, networks=2)
        try:
            nodes = load_inventory(lab.inventory_path).nodes
            settings = SSHSettings(connect_timeout=10)
            with FanOut(nodes, settings) as fleet:
                t = time.monotonic()
                plain = check_fleet(fleet, CheckOptions(cache_ttl=0))
                t_plain = time.monotonic() - t
            coll_opts = CollectiveOptions(size=size)
            r0 = remote_cpu(lab)
            with FanOut(nodes, settings) as fleet:
                t, c0 = time.monotonic(), time.process_time()
                rep = check_fleet(fleet, CheckOptions(cache_ttl=0, collective=coll_opts))
                t_coll = time.monotonic() - t
            cpu_here = time.process_time() - c0
            cpu_lab = remote_cpu(lab) - r0
            c = rep.collective
            assert plain.ok and c is not None, (plain.failures, rep.failures)
            bw = plain_allreduce(lab, size)
            verdict = (
                "" if rep.ok else " (failed: " + "; ".join(r for _, _, r in rep.failures) + ")"
            )
            print(
                f"| {n} | {t_plain:.2f} s | {t_coll:.2f} s{verdict} | {c.elapsed:.2f} s | "
                f"{cpu_lab:.1f} s | {cpu_here:.2f} s | "
                f"{c.allreduce.get('busbw', 0):.3f} GB/s | {bw:.3f} GB/s | {c.median:.3f} GB/s |",
                flush=True,
            )
        finally:
            lab.down()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
