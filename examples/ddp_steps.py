#!/usr/bin/env python3
"""A synchronous DDP loop that runs for a fixed time: the slow-node watch's workload.

``ddp_steps.py SECONDS [CUE_FILE] [--width N]``: a small MLP (``N``×``N``, 128 by default),
every step's gradients all-reduced by DDP over gloo, one rank per process under any launcher
that sets the ``torch.distributed`` env (torchrun, ``fleetctl run --launcher plain``). It runs
for SECONDS: every step all-reduces one flag more, so all ranks agree when to end and none
waits in a collective for a peer that left. At its fifth step rank 0 prints ``STEPPING`` and,
when CUE_FILE is given, creates that file on its host (a test's or a bench's cue that the job
steps: start-up is over). At the end every rank prints ``done rank=R steps=S``; rank 0 also
``STEP <seconds>``, the mean step time after the first 20 steps.

Used unchanged by ``tests/lab/test_slow_node.py``, ``bench/slowname.py`` and
``bench/slownode.py``; a step is all-reduce bound, so a host held below its share of a CPU
makes every peer wait for it — what the pace judge sees.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

WARMUP = 20  # steps not counted in the mean step time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("seconds", type=float, help="how long the job steps")
    p.add_argument("cue", nargs="?", help="a file rank 0 creates at its fifth step")
    p.add_argument("--width", type=int, default=128, help="the MLP's width")
    args = p.parse_args()

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = args.width
    net = torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.Tanh(), torch.nn.Linear(w, 1))
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(w, w), torch.randn(w, 1)  # a batch of w samples
    end, flag, step, t0 = time.time() + args.seconds, torch.zeros(1), 0, None
    rank = dist.get_rank()
    while True:
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        flag[0] = float(time.time() > end)
        dist.all_reduce(flag)
        step += 1
        if step == 5 and rank == 0:
            print("STEPPING", flush=True)
            if args.cue:
                open(args.cue, "a").close()
        if step == WARMUP:
            t0 = time.perf_counter()
        if flag[0] > 0:
            break
    print(f"done rank={rank} steps={step}", flush=True)
    if rank == 0 and t0 is not None and step > WARMUP:
        print("STEP %.6f" % ((time.perf_counter() - t0) / (step - WARMUP)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
