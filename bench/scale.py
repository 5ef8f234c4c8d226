"""Measurement 7: listing and planning a large fleet — no lab, no network, only the CLI.

An INI inventory of N hosts (``gpu0 … gpuN-1``, ``ansible_host`` 10.0.x.y, 8 GPUs, one NIC,
the shape of issue 14's 5,000-host report) is read by ``fleetctl inventory`` and planned by
``fleetctl run --dry-run``, each as the table and as ``--json`` (and ``--full``, every node
written out whole). stdout goes to a file, as in ``fleetctl … > plan.json``: wall time, CPU
and peak RSS of the process, and the bytes it printed; a sample whose output lacks a node is
a failure, not a number.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import Result, SampleFailed, finish_row, fleetctl_argv, repeat, tail

SIZES = (1000, 5000)
QUICK_SIZES = (200,)
SRC = Path(__file__).resolve().parent.parent  # the checkout whose fleetctl is measured


def address(i: int) -> str:
    return f"10.0.{i // 250}.{i % 250 + 1}"


def write_inventory(folder: Path, hosts: int) -> Path:
    lines = ["[gpu]", *(f"gpu{i} ansible_host={address(i)}" for i in range(hosts))]
    lines += ["", "[gpu:vars]", "fleetctl_gpus=8", "fleetctl_nic=ib0", "ansible_user=train"]
    path = folder / f"hosts{hosts}.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


# (row name, fleetctl arguments after -i INV, how a complete output is recognised)
CASES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("fleetctl inventory (table)", ("inventory",), "table"),
    ("fleetctl inventory --json", ("inventory", "--json"), "inventory json"),
    ("fleetctl run --dry-run (table)", ("run", "--dry-run", "train.py"), "plan table"),
    ("fleetctl run --dry-run --json", ("run", "--dry-run", "--json", "train.py"), "plan json"),
    (
        "fleetctl run --dry-run --json --full",
        ("run", "--dry-run", "--json", "--full", "train.py"),
        "plan json",
    ),
)


def _complete(kind: str, out: bytes, hosts: int) -> str | None:
    """Why the output is not a whole answer for ``hosts`` nodes (None: it is)."""
    last = hosts - 1
    if kind == "table":
        ok = f"{hosts} nodes, digest".encode() in out and re.search(
            rb"\n +%d +gpu%d +%s " % (last, last, address(last).encode()), out
        )
    elif kind == "inventory json":
        ok = out.count(b'"rank": ') == hosts
    elif kind == "plan table":
        ok = f"[{last} gpu{last}] $ ".encode() in out and b"nothing was started" in out
    else:
        ok = out.count(b'"node_rank": ') == hosts
    return None if ok else f"{kind}: output does not hold all {hosts} nodes"


class ScaleBench:
    """The inventory and dry-run rows at each size, fleetctl started as users start it."""

    def __init__(self, work: Path, *, src: Path = SRC) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="scale-", dir=work))
        (self.dir / "train.py").write_text("print('hi')\n")
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), *_pythonpath()])}
        self.env.pop("COLUMNS", None)  # stdout is a file: the width of a pipe, as for users
        self.fl = fleetctl_argv()

    def run(self, sizes: Sequence[int], times: int) -> list[Result]:
        results = []
        try:
            for hosts in sizes:
                inv = write_inventory(self.dir, hosts)
                for name, args, kind in CASES:
                    argv = [*self.fl, args[0], "-i", str(inv), *args[1:]]
                    row = Result("scale", name, hosts, note=_note(args))
                    results.append(
                        repeat(row, times, lambda a=argv, k=kind, h=hosts: self._one(a, k, h))
                    )
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return [finish_row(r) for r in results]

    def _one(self, argv: list[str], kind: str, hosts: int) -> tuple[float, dict[str, Any]]:
        out, err = self.dir / "stdout", self.dir / "stderr"
        seconds, status, usage = _timed(argv, self.env, self.dir, out, err)
        if status != 0:
            raise SampleFailed(f"exit {status}: {tail(err.read_text(errors='replace'))}")
        size = out.stat().st_size
        why = _complete(kind, out.read_bytes(), hosts)
        if why:
            raise SampleFailed(why)
        extra = {
            "output MB": round(size / 1e6, 3),
            "CPU s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak RSS MB": round(usage.ru_maxrss / 1024, 1),
        }
        return seconds, extra


def _timed(
    argv: list[str], env: dict[str, str], cwd: Path, out: Path, err: Path, timeout: float = 600
) -> tuple[float, int, Any]:
    """Wall time, exit status and the child's own rusage (wait4: its peak RSS, not the largest
    of every child this process ever had, which RUSAGE_CHILDREN would give)."""
    with out.open("wb") as fo, err.open("wb") as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if seconds >= timeout:
        raise SampleFailed(f"timed out after {timeout:g}s")
    return seconds, proc.returncode, usage


def _note(args: tuple[str, ...]) -> str:
    return "every node written out whole (plan.json's form)" if "--full" in args else ""


def _pythonpath() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def main(argv: list[str] | None = None) -> int:
    """``python bench/scale.py [--src DIR]``: these rows alone, as a markdown table on stdout,
    for any checkout (``--src``: e.g. an older commit's tree, to measure before and after)."""
    import argparse

    from report import _table

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--src", type=Path, default=SRC, help="checkout whose fleetctl to measure")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="host counts, comma list")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="fleetctl-bench-"))
    try:
        rows = ScaleBench(work, src=args.src.resolve()).run(sizes, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n".join(_table(rows, ratio_to=None)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
