#!/usr/bin/env python3
"""A real DistributedDataParallel job, small enough for CPUs: fleetctl's demo and test workload.

Tiny MLP, seeded synthetic regression data, ``DistributedSampler`` + ``set_epoch``, gradient
all-reduce through DDP, ``dist.barrier()`` before exit. Backend: nccl when CUDA is available,
gloo otherwise (``--backend`` or env ``FLEET_BACKEND`` override).

Runs unchanged under
* torchrun / ``python -m torch.distributed.run`` / deepspeed (``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` from the launcher),
* ``fleetctl run --launcher plain`` (the same variables from fleetctl's plan, one per node),
* plain ``python examples/ddp_train.py`` (no env: a world of one, in-process store).

Rank 0 prints the mean loss of every epoch; every rank ends with
``done rank=R world=W loss=L`` and exits 0. For demos and tests: ``--fail-rank R --fail-step
S`` raises on global rank R at global step S (counted from 0 across epochs);
``--hang-rank R --hang-step S`` blocks rank R at step S forever (stall tests: until then every
rank touches ``FLEET_PROGRESS_FILE`` twice a second, so the silence is the hang's alone, never
a slow machine's imports or first step); ``--sleep-per-step`` slows steps down (teardown
tests); ``--print-args`` prints
``argv-json: <sys.argv[1:] as JSON>`` so a test can see its arguments arrived literally
(unknown arguments are then tolerated).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import socket
import sys
import threading
import time
from datetime import timedelta

FEATURES = 16


def say(line: str) -> None:
    """One write per line: ranks sharing a pipe (torchrun workers, PYTHONUNBUFFERED=1, where
    ``print`` writes the text and the newline separately) never interleave mid-line."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="steps per epoch on every rank")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default=None)
    p.add_argument("--fail-rank", type=int, default=None)
    p.add_argument("--fail-step", type=int, default=None)
    p.add_argument(
        "--hang-rank", type=int, default=None, help="this rank blocks forever at --hang-step"
    )
    p.add_argument("--hang-step", type=int, default=None)
    p.add_argument("--sleep-per-step", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    p.add_argument("--print-args", action="store_true")
    args, unknown = p.parse_known_args(argv)
    if unknown and not args.print_args:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    if (args.fail_rank is None) != (args.fail_step is None):
        p.error("--fail-rank and --fail-step go together")
    if (args.hang_rank is None) != (args.hang_step is None):
        p.error("--hang-rank and --hang-step go together")
    return args


def stuck_loading_batch(rank: int, step: int) -> None:
    """A rank that never comes back (a dataloader deadlock, say): silent, alive, stuck."""
    say(f"rank {rank} step {step}: waiting for a batch that never comes")
    while True:
        time.sleep(3600)


def touch_progress_until(stop: threading.Event) -> None:
    """Say this rank moves on (fleetctl's ``FLEET_PROGRESS_FILE``) until ``stop``."""
    path = os.environ.get("FLEET_PROGRESS_FILE")
    while path and not stop.wait(0.5):
        with open(path, "a"):
            os.utime(path)


def main(argv: list[str]) -> int:
    # A native crash (SIGABRT from a C++ terminate, SIGSEGV) prints every thread's Python stack.
    faulthandler.enable()
    args = parse_args(argv)
    reached_hang = threading.Event()
    if args.hang_step is not None:
        threading.Thread(target=touch_progress_until, args=(reached_hang,), daemon=True).start()
    if args.print_args:
        say("argv-json: " + json.dumps(argv))
    try:
        import torch
        import torch.distributed as dist
        from torch import nn
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, TensorDataset
        from torch.utils.data.distributed import DistributedSampler
    except ImportError as e:
        print(f"ddp_train: torch is not installed: {e}", file=sys.stderr)
        return 2

    torch.set_num_threads(max(1, args.threads))
    backend = args.backend or os.environ.get("FLEET_BACKEND") or "auto"
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"

    timeout = timedelta(seconds=args.timeout)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        # Launcher (or fleetctl's plain plan) gave us our place: env:// reads MASTER_ADDR/PORT.
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        # Standalone: a world of one with an in-process store, no port to pick.
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    if backend == "nccl":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    master = f"{os.environ.get('MASTER_ADDR', '-')}:{os.environ.get('MASTER_PORT', '-')}"
    say(
        f"start rank={rank} world={world} local_rank={local_rank} backend={backend} "
        f"device={device} host={socket.gethostname()} master={master}"
    )

    # Same data and same initial weights on every rank (DDP broadcasts rank 0's anyway).
    gen = torch.Generator().manual_seed(args.seed)
    n = args.steps * args.batch_size * world
    x = torch.randn(n, FEATURES, generator=gen)
    w_true = torch.randn(FEATURES, 1, generator=gen)
    y = x @ w_true + 0.1 * torch.randn(n, 1, generator=gen)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(
        dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    step = 0
    epoch_loss = float("nan")
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)  # (sum of losses, number of batches)
        for xb, yb in loader:
            if rank == args.fail_rank and step == args.fail_step:
                raise RuntimeError(f"intentional failure at rank {rank} step {step}")
            if step == args.hang_step:
                reached_hang.set()  # from here on only the hang is silent
            if rank == args.hang_rank and step == args.hang_step:
                stuck_loading_batch(rank, step)  # the peers block in their next all-reduce
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            opt.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
            step += 1
            if args.sleep_per_step > 0:
                time.sleep(args.sleep_per_step)
        dist.all_reduce(total)
        epoch_loss = (total[0] / total[1].clamp(min=1)).item()
        if rank == 0:
            say(f"epoch={epoch} loss={epoch_loss:.6f}")

    dist.barrier()
    say(f"done rank={rank} world={world} loss={epoch_loss:.6f}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    rc = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: with torch 2.13, DDP keeps the gloo process group (and its worker
    # threads) alive past destroy_process_group, and a worker still releasing the last
    # collective's tensors while Python finalizes aborts the process ("terminate called without
    # an active exception", SIGABRT) after the job is done (pytorch/pytorch#179291).
    os._exit(rc)
