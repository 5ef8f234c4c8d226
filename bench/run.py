#!/usr/bin/env python3
"""One command for every benchmark: ``python bench/run.py --hosts 32 --out docs/benchmarks.md``.

Starts a namespace lab (root), runs each measurement ``--repeat`` times (median/min/max), tears
the lab down in ``finally`` and writes the markdown table. ``--quick`` is a smoke run with tiny
sizes. Nothing here asserts speed: the numbers are reported, never judged, and a measurement
that cannot run says ``not measured: <reason>`` instead of a number. ``scale`` needs no lab
(nor root): ``--only scale`` starts none. ``--merge docs/benchmarks.json`` puts the rows of
the measurements run into an earlier run's results, marked *re-measured* with this run's
command, date and commit, and rewrites the page from them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

from common import Result, machine_facts, measure_this_checkout  # noqa: E402
from report import write_report  # noqa: E402

MEASUREMENTS = (
    "fanout",
    "ssh",
    "teardown",
    "lost",
    "elastic",
    "stall",
    "push",
    "logs",
    "before",
    "pipeline",
    "containers",
    "slurm",
    "scale",
    "fleet",
)
# measured without the shared lab: scale needs none, fleet brings up labs of its own sizes
NO_LAB = frozenset({"scale", "fleet"})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=16, help="lab size; fan-out runs at 8/16/32 ≤ it")
    p.add_argument("--repeat", type=int, default=None, help="samples per row (default 5; quick 1)")
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one sample")
    p.add_argument("--out", default=str(HERE.parent / "docs" / "benchmarks.md"))
    p.add_argument(
        "--only", default=",".join(MEASUREMENTS), help=f"comma list of {','.join(MEASUREMENTS)}"
    )
    p.add_argument("--lab-dir", default=None, help="lab folder (default: a fresh one)")
    p.add_argument(
        "--fleet-sizes",
        type=lambda v: [int(x) for x in v.split(",")],
        default=None,
        help="host counts of the fleet measurement (default 64,128; quick 8)",
    )
    p.add_argument(
        "--render",
        metavar="JSON",
        default=None,
        help="measure nothing: rewrite --out from the raw results of an earlier run (its .json)",
    )
    p.add_argument(
        "--merge",
        metavar="JSON",
        default=None,
        help="put this run's rows into an earlier run's raw results (its .json), marked "
        "re-measured, and write --out from the merged results",
    )
    args = p.parse_args(argv)
    args.only = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = set(args.only) - set(MEASUREMENTS)
    if bad:
        p.error(f"unknown measurement(s): {', '.join(sorted(bad))}")
    if args.hosts < 1:
        p.error("--hosts must be ≥ 1")
    if args.repeat is None:
        args.repeat = 1 if args.quick else 5
    return args


def fanout_sizes(hosts: int, quick: bool) -> list[int]:
    if quick:
        return [hosts]
    sizes = [n for n in (8, 16, 32) if n <= hosts]
    return sizes or [hosts]


def fleet_sizes(args: argparse.Namespace) -> tuple[int, ...]:
    from fleet import QUICK_SIZES, SIZES

    return tuple(args.fleet_sizes) if args.fleet_sizes else QUICK_SIZES if args.quick else SIZES


def _measure(group: str) -> str:
    return {"startup": "ssh", "handshake": "ssh", "openssh": "ssh", "remote": "ssh"}.get(
        group, group
    )


def render(src: Path, out: Path) -> int:
    """Re-render the markdown from a run's raw results (report wording changed, same numbers)."""
    data = json.loads(src.read_text())
    results = [Result(**r) for r in data["results"]]
    write_report(out, data["meta"], data["facts"], results, data["skipped"])
    if out.with_suffix(".json").resolve() != src.resolve():
        out.with_suffix(".json").write_text(src.read_text())
    print(f"bench: rendered {out} from {src}", file=sys.stderr)
    return 0


def precompile() -> str:
    """Compile fleetctl's bytecode once, as `pip install` does for the tools it is compared with.

    With PYTHONDONTWRITEBYTECODE set (it is, on our machines) an editable checkout is
    recompiled from source on every `fleetctl` start (~0.1 s of CPU), while paramiko, asyncssh
    and the rest load the .pyc files pip wrote at install time.
    """
    import compileall

    import fleetctl

    root = Path(fleetctl.__file__).parent
    ok = compileall.compile_dir(str(root), quiet=1)
    env = "set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "not set"
    return f"precompiled {'ok' if ok else 'with errors'} (PYTHONDONTWRITEBYTECODE {env})"


def lab_steps(lab: Any, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The measurements that need the lab, by name."""
    from containers import ContainerBench
    from elastic import ElasticBench
    from fanout import FanoutBench, ssh_profile
    from phases import PhaseBench
    from slurm import SlurmBench

    fan = FanoutBench(lab, work)
    phases = PhaseBench(lab, work, quick=args.quick)
    return {
        "fanout": lambda: fan.fanout(
            fanout_sizes(args.hosts, args.quick), args.repeat, warmup=not args.quick
        ),
        "ssh": lambda: ssh_profile(lab, work, args.repeat, quick=args.quick),
        "teardown": lambda: phases.teardown(args.repeat),
        "lost": lambda: phases.lost_node(args.repeat),
        "elastic": lambda: ElasticBench(phases).run(args.repeat),
        "stall": lambda: phases.stall(args.repeat),
        "push": lambda: phases.push(args.repeat),
        "logs": lambda: phases.logs(args.repeat),
        "before": lambda: phases.before(args.repeat),
        "pipeline": lambda: phases.pipeline(args.repeat),
        "containers": lambda: ContainerBench(phases).all(args.repeat),
        "slurm": lambda: SlurmBench(lab, phases.fl).run(args.repeat),
    }


def commit_id() -> str:
    """The checkout measured (``-dirty``: with uncommitted changes), read before anything is
    written."""
    return subprocess.run(
        ["git", "-C", str(HERE), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()


def merged(
    earlier: dict[str, Any],
    meta: dict[str, Any],
    facts: dict[str, str],
    results: list[Result],
    ran: list[str],
    skipped: dict[str, str],
) -> dict[str, Any]:
    """An earlier run's raw results (read before this run wrote anything) with the rows of the
    measurements in ``ran`` put in place of theirs, each marked re-measured with this run's
    command, date, commit and machine load."""
    doc = json.loads(json.dumps(earlier))
    keep = [r for r in doc["results"] if _measure(r["group"]) not in ran]
    doc["results"] = keep + [r.__dict__ for r in results]
    doc["skipped"] = {m: why for m, why in doc.get("skipped", {}).items() if m not in ran}
    doc["skipped"].update({m: why for m, why in skipped.items() if m in ran})  # failed now
    took = facts.get("benchmark wall time", "still running")
    said = (
        f"the rows below were measured on {meta['date']} (took {took}) with "
        f"`{meta['command']}` at commit {meta['commit'] or 'unknown'}, {meta['repeat']} samples "
        f"per row{' (PARTIAL: the run was still going)' if meta.get('partial') else ''}; "
        f"{facts['CPU']}, python {facts['python']}; load average at start "
        f"{facts['load average at start']}, at end {facts.get('load average at end', '—')}."
    )
    doc["meta"].setdefault("remeasured", {}).update({m: said for m in ran})
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        return render(Path(args.render), Path(args.out))
    from fanout import make_work
    from fleet import FleetBench
    from scale import QUICK_SIZES, SIZES, ScaleBench

    from fleetctl.lab import Lab

    started = time.time()
    earlier = json.loads(Path(args.merge).read_text()) if args.merge else None
    facts = machine_facts()
    facts["fleetctl measured"] = measure_this_checkout()
    facts["fleetctl bytecode"] = precompile()
    results: list[Result] = []
    skipped: dict[str, str] = {}
    work = make_work()
    lab = None
    out = Path(args.out)
    meta = {
        "command": "python bench/run.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "repeat": args.repeat,
        "quick": args.quick,
        "sizes": fanout_sizes(args.hosts, args.quick),
        "hosts": args.hosts,
        "commit": commit_id(),
    }

    def save(final: bool) -> None:
        """The report so far (after every measurement, so a long run is never lost)."""
        meta["partial"] = not final
        if final:
            facts["load average at end"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            facts["benchmark wall time"] = f"{time.time() - started:.0f} s"
        if earlier is not None:
            ran = [m for m in MEASUREMENTS if m in args.only]
            doc = merged(earlier, meta, facts, results, ran, skipped)
            rows = [Result(**r) for r in doc["results"]]
            write_report(out, doc["meta"], doc["facts"], rows, doc["skipped"])
            out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
            return
        pending = {
            m: "not measured: run still in progress"
            for m in MEASUREMENTS
            if m not in skipped and not any(_measure(r.group) == m for r in results)
        }
        write_report(out, meta, facts, results, skipped if final else {**pending, **skipped})
        out.with_suffix(".json").write_text(
            json.dumps(
                {
                    "meta": meta,
                    "facts": facts,
                    "skipped": skipped,
                    "results": [r.__dict__ for r in results],
                },
                indent=1,
            )
            + "\n"
        )

    try:
        steps: dict[str, Any] = {
            "scale": lambda: ScaleBench(work).run(
                QUICK_SIZES if args.quick else SIZES, args.repeat
            ),
            "fleet": lambda: FleetBench(work, quick=args.quick).run(fleet_sizes(args), args.repeat),
        }
        if any(m not in NO_LAB for m in args.only):
            t0 = time.perf_counter()
            lab = Lab.up(args.hosts, dir=args.lab_dir, networks=1)
            facts["lab"] = f"{args.hosts} hosts, up in {time.perf_counter() - t0:.2f} s"
            print(f"bench: lab {lab.name} up ({args.hosts} hosts) in {lab.dir}", file=sys.stderr)
            steps.update(lab_steps(lab, work, args))
        for name in MEASUREMENTS:
            if name not in args.only:
                skipped[name] = "not selected (--only)"
                continue
            print(f"bench: {name} …", file=sys.stderr)
            t1 = time.perf_counter()
            try:
                results.extend(steps[name]())
            except Exception as e:
                traceback.print_exc()
                skipped[name] = f"not measured: {type(e).__name__}: {' '.join(str(e).split())}"[
                    :400
                ]
            print(f"bench: {name} took {time.perf_counter() - t1:.1f} s", file=sys.stderr)
            save(final=False)
    finally:
        if lab is not None:
            try:
                lab.down()
            except Exception as e:
                print(f"bench: lab down failed: {e}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
    save(final=True)
    print(f"bench: wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
