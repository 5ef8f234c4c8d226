"""Where a no-op run's remote CPU goes: trees A/B on one lab, per process (issue 35).

    python bench/remotecpu.py --hosts 16 --repeat 4 \\
        --trees old=/var/tmp/old,after=. [--lab DIR] [--json out.json]

For each tree in turn inside every repetition (A, B, A, B, …): ``fleetctl check --recheck``
and a no-op ``fleetctl run`` (a check cache of its own per sample, so its check runs; the push
is a no-op after one untimed run per tree), each with the lab hosts' CPU (bench/fleet.py's
``remote_cpu``: what their init and sshd listener reaped). During the run, BSD process
accounting (``acct(2)``, this machine's PID namespace, off again at once) records every process
that ends; those under a lab host's init or sshd listener are that host's: how many of each
program a host ran and their CPU (acct rounds each process down to 10 ms, so its sum is lower
than ``remote_cpu``'s). A tree is its checkout root, put first on PYTHONPATH and run by this
venv's python; one without bytecode is byte-compiled first (docs/performance.md, issue 35).
Root only (the lab, ``acct``). Printed as a markdown table; raw samples with ``--json``.
"""

from __future__ import annotations

import argparse
import collections
import compileall
import ctypes
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from common import SampleFailed, run_timed, tail  # noqa: E402
from fleet import remote_cpu  # noqa: E402
from phases import NOOP_SCRIPT, PhaseBench, parse_iso  # noqa: E402

ACCT = struct.Struct("=BBHIIIIIIf8H16s")  # struct acct_v3 (linux/acct.h), 64 bytes
AFORK = 0x01  # forked, never exec'd


def _comp(c: int) -> int:
    """comp_t: 13-bit mantissa, 3-bit base-8 exponent (ticks of AHZ = 100 Hz)."""
    return (c & 0x1FFF) << (3 * ((c >> 13) & 7))


def read_acct(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    out = []
    for off in range(0, len(data) - ACCT.size + 1, ACCT.size):
        f = ACCT.unpack_from(data, off)
        out.append(
            {
                "flag": f[0],
                "pid": f[6],
                "ppid": f[7],
                "cpu": (_comp(f[10]) + _comp(f[11])) / 100,
                "comm": f[18].split(b"\0")[0].decode(errors="replace"),
            }
        )
    return out


def _acct(path: Path | None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(None if path is None else str(path).encode()) != 0 and path is not None:
        raise OSError(ctypes.get_errno(), f"acct({path})")


def _env(tree: Path, extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SSH_AUTH_SOCK", None)
    env["FLEETCTL_SSH_CONFIG"] = "/dev/null"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), extra]))
    return env


def _fleetctl(tree: Path, extra: str, args: list[str], cache: Path) -> Any:
    env = _env(tree, extra)
    env["FLEETCTL_CACHE_DIR"] = str(cache)  # the check really runs
    # the venv's python as it is named (not resolved): the venv's packages
    # cwd: not a checkout (``-m`` puts the current folder before PYTHONPATH)
    t = run_timed([sys.executable, "-m", "fleetctl", *args], env=env, timeout=900, cwd="/")
    if t.proc.returncode != 0:
        raise SampleFailed(f"{tree}: {args[0]} exit {t.proc.returncode}: {tail(t.proc.stderr)}")
    return t


def _phases(runs: Path) -> dict[str, float]:
    job = max(runs.glob("*/job.json"), key=lambda p: p.stat().st_mtime)
    marks: dict[str, float] = {}
    for p in json.loads(job.read_text()).get("phases", []):
        first = str(p.get("phase", "")).split(" ")[0]
        marks.setdefault(first, parse_iso(p["at"]))
    return marks


def _by_host(recs: list[dict[str, Any]], roots: dict[int, str]) -> list[dict[str, Any]]:
    parent = {r["pid"]: r["ppid"] for r in recs}
    out = []
    for r in recs:
        pid, hops = r["ppid"], 0
        while pid and pid not in roots and hops < 64:
            pid, hops = parent.get(pid, 0), hops + 1
        if pid in roots:
            out.append(dict(r, host=roots[pid]))
    return out


def sample(lab: Any, tree: Path, extra: str, inv: str, work: Path, tag: str) -> list[dict]:
    """One check and one no-op run of ``tree``: remote CPU per node, acct rows of the run."""
    n = len(lab.hosts)
    got = []
    r0 = remote_cpu(lab)
    t = _fleetctl(tree, extra, ["check", "-i", inv, "--json", "--recheck"], work / f"c-{tag}")
    r1 = remote_cpu(lab)
    got.append({"kind": "check", "wall": t.seconds, "cpu": t.cpu, "remote": (r1 - r0) / n})
    code, runs = work / "code", work / f"runs-{tag.rsplit('-', 1)[0]}"
    argv = ["run", "-i", inv, "--launcher", "plain", "--code-dir", str(code)]
    argv += ["--runs-dir", str(runs), str(code / "job.py")]
    acct = work / f"acct-{tag}"
    acct.write_bytes(b"")
    roots = {p: h.name for h in lab.hosts for p in (h.init_pid, lab.sshd_pid(h.name)) if p}
    r0 = remote_cpu(lab)
    _acct(acct)
    try:
        t = _fleetctl(tree, extra, argv, work / f"r-{tag}")
        time.sleep(1.0)  # the sessions the run closed: ended and reaped
    finally:
        _acct(None)
    r1 = remote_cpu(lab)
    marks = _phases(runs)
    got.append(
        {
            "kind": "run",
            "wall": t.seconds,
            "cpu": t.cpu,
            "remote": (r1 - r0) / n,
            "launch_to_exit": marks.get("collecting", 0.0) - marks.get("launching", 0.0),
            "procs": _by_host(read_acct(acct), roots),
        }
    )
    acct.unlink()
    return got


def table(raw: dict[str, list[dict]], n: int) -> str:
    med = statistics.median
    lines = [
        "| tree | check: remote CPU ms/node | no-op run: remote CPU ms/node | run − check "
        "| run wall s | run controller CPU s | launch→exit s | samples |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for name, got in raw.items():
        cs = [1000 * g["remote"] for g in got if g["kind"] == "check"]
        rs = [g for g in got if g["kind"] == "run"]
        rr = [1000 * g["remote"] for g in rs]
        if not cs or not rr:
            continue
        lines.append(
            f"| {name} | {med(cs):.0f} ({min(cs):.0f}–{max(cs):.0f}) "
            f"| {med(rr):.0f} ({min(rr):.0f}–{max(rr):.0f}) | {med(rr) - med(cs):.0f} "
            f"| {med(g['wall'] for g in rs):.2f} | {med(g['cpu'] for g in rs):.2f} "
            f"| {med(g['launch_to_exit'] for g in rs):.2f} | {len(rs)} |"
        )
        agg: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for g in rs:
            for p in g["procs"]:
                k = p["comm"] + (" (fork)" if p["flag"] & AFORK else "")
                agg[k][0] += 1
                agg[k][1] += p["cpu"]
        per = len(rs) * n
        notes.append(
            f"{name}, processes per host in a run (count, acct CPU ms): "
            + ", ".join(
                f"{k} {c / per:.2f}× {1000 * s / per:.0f}" for k, (c, s) in sorted(agg.items())
            )
        )
    return "\n".join([*lines, "", *notes])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True, help="name=checkout,… measured in this order")
    p.add_argument("--hosts", type=int, default=16)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--lab", default=None, help="a running lab's folder (else one is made)")
    p.add_argument("--extra-path", default="", help="more PYTHONPATH for every tree")
    p.add_argument("--work", type=Path, default=Path("/tmp/fleetctl-remotecpu"))
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    trees = {k: Path(v).resolve() for k, v in (t.split("=", 1) for t in args.trees.split(","))}
    for root in trees.values():  # one compiled before (a shared baseline) is taken as it is
        if not (root / "fleetctl" / "__pycache__").is_dir():
            compileall.compile_dir(str(root / "fleetctl"), quiet=1)
    from fleetctl.lab import Lab

    lab = Lab.load(args.lab) if args.lab else Lab.up(args.hosts, networks=2)
    raw: dict[str, list[dict]] = {k: [] for k in trees}
    try:
        work = args.work
        (work / "code").mkdir(parents=True, exist_ok=True)
        (work / "code" / "job.py").write_text(NOOP_SCRIPT)
        inv = PhaseBench(lab, work, quick=False).inventory(len(lab.hosts), "/root/.fleetctl/rcpu")
        code = work / "code"
        for name, root in trees.items():  # untimed: the push is a no-op after it
            warm = ["run", "-i", inv, "--launcher", "plain", "--code-dir", str(code)]
            warm += ["--runs-dir", str(work / f"runs-{name}"), str(code / "job.py")]
            _fleetctl(root, args.extra_path, warm, work / f"warm-{name}")
        for i in range(args.repeat):
            for name, root in trees.items():
                raw[name] += sample(lab, root, args.extra_path, inv, work, f"{name}-{i}")
                print(f"{name} {i}: {[round(1000 * g['remote']) for g in raw[name][-2:]]}")
    finally:
        _acct(None)
        if not args.lab:
            lab.down()
    print(table(raw, len(lab.hosts)))
    if args.json:
        args.json.write_text(json.dumps(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
