"""The collective preflight's node side: real torch.distributed traffic over the training NIC.

``python -c SOURCE '{"wait": S}'``, one process per node, started by the controller on every
node at once (``fleetctl.phases.check.collective``), while the check still runs: torch's import, the
slow part on a small node, overlaps the probe and the mesh. Stdlib at module level (it imports
on Python 3.8 without torch); torch is imported inside :func:`main`, on the node, with the
node's python, then the program waits (up to ``wait`` s) for its part: one JSON line on stdin
(rank, world, master, NIC, sizes, its own ``deadline``; the store's port for ranks > 0).

Rank 0 opens the rendezvous store on a free port of its training address and says ``R <port>``;
the controller passes the port on in the others' lines. Then, with
``nccl`` on GPUs and ``gloo`` otherwise (the NIC pinned by ``GLOO_SOCKET_IFNAME`` /
``NCCL_SOCKET_IFNAME``): an all-reduce of ``size`` bytes across all nodes, then one round of
send/recv per ring shift ``k`` (rank r sends to r+k and receives from r-k, every node at once,
each timed by its receiver): the all-reduce best of 2 rounds, or of ``iters`` while any rank's
best two differ by over ``SETTLED``; a shift best of 2, a link far below the median measured
again alone. ``P <json>`` after each step, ``D <json>`` the figures at the end. With several
GPUs the node's own all-reduce across them is its own figure (``intra``); InfiniBand ports are
read from sysfs (``ib``).

Bounded: past ``wait`` s without a part, or ``deadline`` s after it, a watchdog thread dumps
every thread's stack as ``K <json>`` and exits; a C-level faulthandler timer a little later
exits even when the interpreter is stuck. ``I <json>`` (first) gives the pid: a node silent
past its deadline (stopped, the GIL held) gets SIGABRT, and faulthandler, enabled on stdout,
writes every thread's stack as it dies. EOF on stdin (the controller gone or done) ends the
process at once.

Several parts in a row (the post-mortem's bisection rounds, ``fleetctl.job.diagnose.proof``): a part
with ``"more": true`` leaves the program waiting (up to ``wait`` s again) for the next one after
its ``D``, with torch imported once — on the lab an import is seconds of CPU per host and round,
the round's collective a fraction of one. Each part opens its own store and process group,
destroyed after its ``D``; each begins with ``I``, as the first.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import queue
import sys
import tempfile
import threading
import time
import warnings

from ..kit.health import IB_ROOT
from ..kit.health import ib_ports as health_ib_ports

REMEASURE_PASSES = 2
# the all-reduce: best of 2 rounds, and of up to ``iters`` while any rank's best two differ by
# more than SETTLED; a ring shift: best of 2 (a link far below the median runs again alone,
# below). On the 2-core lab every round is CPU (16 hosts' traffic through one kernel), and a
# third round that only confirmed the first two was a sixth of the benchmark's CPU
MIN_ROUNDS = 2
SETTLED = 0.15
IMPORT_NICE = 10
STORE_GRACE = 2.0  # s rank 0's watchdog waits after the others'
_out_lock = threading.Lock()


def say(kind: str, payload: object) -> None:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    with _out_lock:
        sys.stdout.write(kind + " " + text + "\n")
        sys.stdout.flush()


def ib_ports(root: str = IB_ROOT) -> list:
    """Every InfiniBand port under ``root``: device, port, state (``ACTIVE``…) and rate
    (Gb/s as the kernel writes it, ``100 Gb/sec (4X EDR)``). Empty without IB. Read by the
    health gate's one sysfs reader (``health.ib_ports``)."""
    out = []
    for p in health_ib_ports(root):
        dev, _, port = p["port"].partition("/")
        out.append(
            {
                "device": dev,
                "port": port,
                "state": p["state"],
                "rate": float(p["rate"]) if p["rate_text"] else None,
                "rate_text": p["rate_text"],
                "link_layer": p["link_layer"],
            }
        )
    return out


def _watch_stdin(parts: queue.Queue) -> None:
    """Each line: this node's next part (a JSON object; None when it is not one); EOF: the
    controller is gone (or done with this node), exit now."""
    stream = sys.stdin.buffer
    while True:
        line = stream.readline()
        if not line:
            os._exit(3)
        try:
            got = json.loads(line.decode())
        except ValueError:
            got = None
        parts.put(got if isinstance(got, dict) else None)


def _watchdog(progress: dict) -> None:
    """At the deadline (``progress["deadline"]``, moved once the part came): every thread's
    stack as one ``K`` frame, then exit."""
    while True:
        left = progress["deadline"] - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(left, 1.0))
    import faulthandler

    with tempfile.TemporaryFile(mode="w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        stacks = f.read()
    say("K", {"step": progress.get("step"), "stacks": stacks})
    os._exit(4)


def load_torch() -> object:
    """torch and torch.distributed, imported for ~20% less CPU (at 16 lab hosts on 2 cores,
    the imports are three quarters of ``check --collective``): the collector off while the
    import allocates (its ~350 collections are ~10% of it) and its objects frozen after, so
    no later collection walks them; numpy kept out (torch imports it only for array
    conversions, which the benchmark never makes; without it torch warns, silenced here)."""
    keep_out = "numpy" not in sys.modules
    if keep_out:
        sys.modules["numpy"] = None  # type: ignore[assignment]  # ModuleNotFoundError
    gc.disable()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            import torch
            import torch.distributed
    except ImportError as e:  # a torch that needs numpy to import: say why it is missing
        if keep_out and "numpy" in str(e):
            raise ImportError(f"{e} (numpy is kept out of the collective's torch import)") from e
        raise
    finally:
        if keep_out and sys.modules.get("numpy", 0) is None:
            del sys.modules["numpy"]
        gc.freeze()
        gc.enable()
    return torch


def _import_torch(wait: float) -> object:
    """torch and torch.distributed imported in a thread at nice 10 (on Linux a thread's own):
    started while the check's probe and mesh still run on this node, the import yields the
    CPU to them, while the benchmark, in the main thread, keeps the node's priority. The
    module, or the exception the import raised."""
    got: list = []

    def work() -> None:
        with contextlib.suppress(AttributeError, OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), IMPORT_NICE)
        try:
            got.append(load_torch())
        except BaseException as e:  # any import failure is the answer
            got.append(e)

    t = threading.Thread(target=work, name="import-torch", daemon=True)
    t.start()
    t.join(wait)
    return got[0] if got else TimeoutError(f"import torch took over {wait:.0f} s")


def _best(times: list) -> float:
    return min(t for t in times if t > 0) if times else 0.0


def settled(times: list, spread: float = SETTLED) -> bool:
    """This rank's best two times agree within ``spread``: a further round would not move
    its best by more."""
    best = sorted(t for t in times if t > 0)[:2]
    return len(best) == 2 and best[1] <= best[0] * (1 + spread)


def best_rounds(one, most: int, everyone) -> list:
    """``one()``'s times (s): ``MIN_ROUNDS`` rounds, and more up to ``most`` until
    ``everyone(settled(times))`` (every rank's answer, the same on every rank) is true."""
    times: list = []
    for i in range(max(1, most)):
        times.append(one())
        if MIN_ROUNDS <= i + 1 < most and everyone(settled(times)):
            break
    return times


def suspect_links(shifts: list, seconds: list, fraction: float, rounds: int, budget: float) -> list:
    """``(shift, receiving rank)`` of every link to measure again: below ``fraction`` of the
    fleet's upper-median link bandwidth (``seconds[rank][i]`` receiving ``shifts[i]``, the
    same bytes everywhere), the cheapest first while their ``rounds`` more fit in ``budget``
    s. A really slow node's links do not fit, and the judge names it anyway; the links that
    were slow only because their round waited on it are measured again alone."""
    flat = sorted(t for row in seconds for t in row if t > 0)
    if not flat:
        return []
    median = flat[(len(flat) - 1) // 2]  # the lower median time: the upper median bandwidth
    slow = [
        (row[i], k, dst)
        for i, k in enumerate(shifts)
        for dst, row in enumerate(seconds)
        if row[i] > 0 and median / row[i] < fraction
    ]
    out, cost = [], 0.0
    for t, k, dst in sorted(slow):
        if cost + t * rounds > budget:
            break
        out.append((k, dst))
        cost += t * rounds
    return sorted(out)


def _intra(torch, size: int, iters: int) -> dict | None:
    """All-reduce across this node's own GPUs in one process (NVLink / PCIe): its busbw."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        return None
    import torch.cuda.nccl as tnccl

    g = torch.cuda.device_count()
    n = max(1, size // 4)
    bufs = [torch.ones(n, dtype=torch.float32, device=f"cuda:{i}") for i in range(g)]
    tnccl.all_reduce(bufs)
    times = []
    for _ in range(iters):
        for i in range(g):
            torch.cuda.synchronize(i)
        t0 = time.perf_counter()
        tnccl.all_reduce(bufs)
        for i in range(g):
            torch.cuda.synchronize(i)
        times.append(time.perf_counter() - t0)
    t = _best(times)
    algbw = n * 4 / t if t else 0.0
    return {"gpus": g, "bytes": n * 4, "seconds": t, "busbw": algbw * 2 * (g - 1) / g}


def main(start: dict) -> int:
    wait = float(start["wait"])
    progress = {"step": "import", "deadline": time.monotonic() + wait}
    import faulthandler

    say("I", {"pid": os.getpid()})  # for the controller's SIGABRT, should we go silent
    faulthandler.enable(file=sys.stdout, all_threads=True)  # SIGABRT: every stack, on stdout
    # the backstop: even an interpreter stuck without the GIL leaves, stacks on stdout
    faulthandler.dump_traceback_later(wait + 5, exit=True, file=sys.stdout)
    threading.Thread(target=_watchdog, args=(progress,), daemon=True).start()
    parts: queue.Queue = queue.Queue()
    threading.Thread(target=_watch_stdin, args=(parts,), daemon=True).start()
    ib = ib_ports(start.get("ib_root") or IB_ROOT)
    torch = _import_torch(wait)
    if isinstance(torch, BaseException):
        say("D", {"error": f"cannot import torch with {sys.executable}: {torch}", "ib": ib})
        return 0
    first = True
    while True:
        progress["step"] = "waiting for its part"
        try:
            args = parts.get(timeout=max(0.0, progress["deadline"] - time.monotonic()))
        except queue.Empty:
            args = None
        if not args:
            say("D", {"error": "no part from the controller", "ib": ib})
            return 0
        if not first:
            say("I", {"pid": os.getpid()})
        first = False
        try:
            part(torch, args, progress, ib)
        except Exception as e:  # one part's failure is data; the next part starts clean
            if not args.get("more"):
                raise
            say("D", {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"})
            with contextlib.suppress(Exception):
                torch.distributed.destroy_process_group()
        if not args.get("more"):
            return 0
        progress["deadline"] = time.monotonic() + wait  # the next part, as the first
        faulthandler.cancel_dump_traceback_later()
        faulthandler.dump_traceback_later(wait + 5, exit=True, file=sys.stdout)


def part(torch, args: dict, progress: dict, ib: list) -> None:
    """One part: its store and process group, the benchmark, ``D``, the group destroyed."""
    import datetime
    import faulthandler

    dist = torch.distributed
    rank, world = int(args["rank"]), int(args["world"])
    # rank 0 serves the store: it speaks last, so its exit does not cut a peer's store
    # connection (an error) before that peer's own watchdog said its stacks
    limit = float(args["deadline"]) + (STORE_GRACE if rank == 0 else 0.0)
    progress["deadline"] = time.monotonic() + limit
    faulthandler.cancel_dump_traceback_later()
    faulthandler.dump_traceback_later(limit + 5, exit=True, file=sys.stdout)
    progress["step"] = "rendezvous"
    nic = args.get("nic")
    if nic:  # read by the process group's creation, below
        os.environ["GLOO_SOCKET_IFNAME"] = nic
        os.environ.setdefault("NCCL_SOCKET_IFNAME", nic)
    cuda = torch.cuda.is_available()
    backend = args.get("backend") or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        say("D", {"error": "backend nccl but torch sees no GPU", "ib": ib})
        return
    device = "cuda:0" if backend == "nccl" else "cpu"
    # past the watchdog's deadline: a peer stuck in a collective says its stacks (``K``), not
    # gloo's timeout error, so the silent node stays the one named
    op_timeout = datetime.timedelta(seconds=max(1.0, float(args["op_timeout"])) + 5)
    master = args["master_addr"]
    if rank == 0:
        store = dist.TCPStore(master, 0, world, True, timeout=op_timeout, wait_for_workers=False)
        say("R", str(store.port))
    else:
        if not args.get("port"):
            say("D", {"error": "no rendezvous port from the controller", "ib": ib})
            return
        store = dist.TCPStore(master, int(args["port"]), world, False, timeout=op_timeout)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=op_timeout)
    iters = max(1, int(args.get("iters", 3)))
    n = max(1, int(args["size"]) // 4)
    buf = torch.ones(n, dtype=torch.float32, device=device)
    small = torch.ones(1, dtype=torch.float32, device=device)

    def sync() -> None:
        if device != "cpu":
            torch.cuda.synchronize()

    def step(name: str) -> None:
        progress["step"] = name
        say("P", {"step": name})

    def everyone(mine: bool) -> bool:
        """True on every rank when ``mine`` is true on every rank (one small all-reduce)."""
        flag = torch.tensor([0.0 if mine else 1.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return float(flag.item()) == 0.0

    dist.all_reduce(small)  # every connection made before anything is timed
    step("init")

    def allreduce_once() -> float:
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        sync()
        return time.perf_counter() - t0

    t = _best(best_rounds(allreduce_once, iters, everyone))
    algbw = n * 4 / t if t else 0.0
    allreduce = {"bytes": n * 4, "seconds": t, "algbw": algbw}
    allreduce["busbw"] = algbw * 2 * (world - 1) / world if world > 1 else algbw
    step("allreduce")
    # zeros, not empty: its pages are touched here, not in the first timed receive
    recv = torch.zeros(n, dtype=torch.float32, device=device)
    tok_in, tok_out = torch.zeros(1, device=device), torch.ones(1, device=device)

    def shift_round(k: int, rounds: int) -> float:
        """Rank r sends to r+k and receives from r-k, ``rounds`` times; the best receive
        time."""
        dst, src = (rank + k) % world, (rank - k) % world
        dist.barrier()
        # one untimed small exchange makes the pair's connection before the clock runs
        reqs = [dist.isend(small, dst), dist.irecv(small, src)]
        for r in reqs:
            r.wait()

        def once() -> float:
            dist.barrier()
            sync()
            # the receiver's clock starts as it tells its sender "go", not at the barrier,
            # whose uneven release would count as transfer time on short transfers; and
            # before the "go" leaves, or a receiver preempted right after it (16 lab hosts
            # on 2 cores) would miss the start of its transfer and time a link too fast
            go = dist.irecv(tok_in, dst, tag=1)
            rr = dist.irecv(recv, src, tag=2)
            t0 = time.perf_counter()
            ready = dist.isend(tok_out, src, tag=1)
            go.wait()
            rs = dist.isend(buf, dst, tag=2)
            rr.wait()
            sync()
            took = time.perf_counter() - t0
            rs.wait()
            ready.wait()
            return took

        return _best([once() for _ in range(rounds)])

    def pair_round(src: int, dst: int, rounds: int) -> float:
        """``src`` sends to ``dst`` alone, ``rounds`` times; the receiver's best time."""
        times = []
        for _ in range(rounds):
            dist.barrier()
            sync()
            if rank == src:
                dist.recv(tok_in, dst, tag=1)
                dist.send(buf, dst, tag=2)
            t0 = time.perf_counter()
            if rank == dst:
                dist.send(tok_out, src, tag=1)
                dist.recv(recv, src, tag=2)
            sync()
            times.append(time.perf_counter() - t0)
        return _best(times)

    ks = list(args.get("shifts", []))
    best = {}
    for k in ks:
        best[k] = shift_round(k, min(iters, MIN_ROUNDS))
        step(f"shift {k}")
    # best-of-N where N grows with the spread: a link that fell below the re-measure fraction
    # of the fleet median runs again alone (the others wait), so a core busy with its
    # neighbours' traffic is not named a slow link, while a slow cable stays slow alone
    fraction = float(args.get("remeasure_below") or 0.0)
    budget = float(args.get("remeasure_budget") or 0.0)
    rounds = iters
    for _ in range(REMEASURE_PASSES if fraction > 0 and ks and world > 2 else 0):
        mine = torch.tensor([best[k] for k in ks], dtype=torch.float64)
        every = [torch.zeros_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)  # every rank decides the same from the same figures
        again = suspect_links(ks, [x.tolist() for x in every], fraction, rounds, budget)
        if not again:
            break
        for k, dst in again:
            src = (dst - k) % world
            t = pair_round(src, dst, rounds)
            if rank == dst:
                best[k] = min(best[k], t)
        rounds *= 2
        step("remeasure")
    links = [
        {"src": (rank - k) % world, "dst": rank, "shift": k, "seconds": best[k], "bytes": n * 4}
        for k in ks
    ]
    intra = _intra(torch, int(args["size"]), iters) if cuda else None
    dist.barrier()
    say(
        "D",
        {
            "rank": rank,
            "backend": backend,
            "torch": torch.__version__,
            "allreduce": allreduce,
            "links": links,
            "intra": intra,
            "ib": ib,
        },
    )
    dist.destroy_process_group()


def program() -> None:
    try:
        code = main(json.loads(sys.argv[1]))
    except Exception as e:  # every failure is data for the controller
        say("D", {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"})
        code = 0
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    program()
