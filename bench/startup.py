"""What a command costs before its first byte to a node: CPU and modules at its first connection,
for several checkouts, taking turns (A, B, C, A, B, C, …).

    python bench/startup.py --repeat 11 /var/tmp/old . -- run -i INV --launcher plain job.py

Each sample runs ``python -m fleetctl ARGS`` of one checkout in a fresh interpreter (in a
scratch folder holding ``job.py`` and ``hosts.yml``: one loopback host, ``-i hosts.yml``); an
audit hook stops it at the first TCP connect (before the syscall: nothing is sent) or, for a
local run, at exit. It reports the process's CPU then (``time.process_time``: user + sys), the
CPU spent executing module bodies (each ``exec_module``'s own, imports inside it excluded:
``-X importtime`` is wall time, useless on a loaded machine) and the modules loaded, all and
fleetctl's. Medians. Each checkout is byte-compiled first, as ``pip install`` leaves it.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, os, runpy, socket, sys, time
import importlib._bootstrap_external as be
out, root, stop, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
sys.path.insert(0, root)
own, stack = [0.0], []
real_exec = be._LoaderBasics.exec_module
def exec_module(self, module):
    t0 = time.process_time(); stack.append(0.0)
    try:
        return real_exec(self, module)
    finally:
        dt = time.process_time() - t0
        own[0] += dt - stack.pop()
        if stack: stack[-1] += dt
be._LoaderBasics.exec_module = exec_module
def write():
    cpu = time.process_time()
    names = list(sys.modules)
    with open(out, "w") as f:
        json.dump({"cpu": cpu, "imports": own[0], "modules": len(names),
                   "fleetctl": sum(n.split(".")[0] == "fleetctl" for n in names)}, f)
def hook(event, a):
    if stop == "connect" and event == "socket.connect" and a[0].family == socket.AF_INET:
        write(); os._exit(0)
sys.addaudithook(hook)
real_exit = os._exit
def at_exit(code):
    write(); real_exit(code)
os._exit = at_exit
sys.argv = ["fleetctl", *args]
runpy.run_module("fleetctl", run_name="__main__", alter_sys=True)
"""

INVENTORY = "all:\n  hosts:\n    node0: {ansible_host: 127.0.0.1, ansible_port: 9}\n"


def sample(root: Path, args: list[str], stop: str, work: Path) -> dict[str, float]:
    out = work / "sample.json"
    out.unlink(missing_ok=True)
    subprocess.run(
        [sys.executable, "-c", PROBE, str(out), str(root), stop, *args],
        cwd=work,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkouts", nargs="+", type=Path)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--stop", choices=("connect", "exit"), default="connect")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    opts, args = ap.parse_args(argv[:cut]), argv[cut + 1 :]
    roots = [c.resolve() for c in opts.checkouts]
    for root in roots:
        compileall.compile_dir(root / "fleetctl", quiet=1)
    runs: dict[Path, list[dict[str, float]]] = {r: [] for r in roots}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "hosts.yml").write_text(INVENTORY)
        (work / "job.py").write_text("print('hi')\n")
        for root in roots:  # untimed: the first run of a folder fills the code's hash cache
            sample(root, args, opts.stop, work)
        for _ in range(opts.repeat):
            for root in roots:
                runs[root].append(sample(root, args, opts.stop, work))
    print(f"`fleetctl {' '.join(args)}`, stop at {opts.stop}, {opts.repeat} samples each, ", end="")
    print(f"load {os.getloadavg()[0]:.0f}\n")
    print("| checkout | CPU | of which module bodies | modules (fleetctl) |\n|---|---|---|---|")
    for root, rs in runs.items():
        cpu, imp = (statistics.median(r[k] for r in rs) * 1000 for k in ("cpu", "imports"))
        last = rs[-1]
        print(f"| {root} | {cpu:.0f} ms | {imp:.0f} ms | {last['modules']} ({last['fleetctl']}) |")


if __name__ == "__main__":
    main()
