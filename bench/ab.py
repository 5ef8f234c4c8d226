"""Before/after: the same fan-out and no-op run from two checkouts of fleetctl, taking turns.

A refactor must not make the tool slower (issue 35's acceptance: "behaviour and benchmarks are
not worse than before — measure before and after"). Both checkouts run on one lab, in turns
inside every repetition (A, B, A, B, …), so the noise of a shared two-core machine falls on
both alike; each checkout is byte-compiled first, as `pip install` would leave it.

    python bench/ab.py --before /var/tmp/fleetctl-before --after . --sizes 8,64 --repeat 5

Rows: ``fleetctl exec -i INV hostname`` (every host must answer with its own name) and a
no-op ``fleetctl run`` (check included: a check cache of its own per sample; the push is a no-op
after one untimed run per checkout). Printed as a markdown table; the raw samples as JSON.

``--phases``: where the no-op run's time goes, by side — each sample's job.json ``phases`` (when
each phase began, the controller's CPU then) cut into start-up (the process's start to the first
phase), each phase (named by its text's first word) and the end (the last mark, ``done: …``, to
the process's exit), medians in a second table. How issue 35's last 8-host difference was split
(bench/by_hand.md).
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the lab comes from the after checkout

from common import SampleFailed, run_timed, tail  # noqa: E402
from phases import NOOP_SCRIPT, sized_lab  # noqa: E402

Sample = tuple[float, float]  # wall s, CPU s


def _argv(checkout: Path) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    env.pop("SSH_AUTH_SOCK", None)
    env["FLEETCTL_SSH_CONFIG"] = "/dev/null"
    env["PYTHONPATH"] = str(checkout)  # and cwd=checkout: `python -m` puts the working
    # directory first on sys.path, ahead of PYTHONPATH (run from a checkout, every side ran it)
    # this interpreter as started (a venv's python): common.PY, its realpath, leaves the venv
    return [sys.executable, "-m", "fleetctl"], env


def _fanout(checkout: Path, inv: str, names: set[str]) -> tuple[float, float]:
    argv, env = _argv(checkout)
    t = run_timed([*argv, "exec", "-i", inv, "hostname"], env=env, timeout=300, cwd=str(checkout))
    if t.proc.returncode != 0:
        raise SampleFailed(f"{checkout}: exec exit {t.proc.returncode}: {tail(t.proc.stderr)}")
    missing = [n for n in names if n not in t.proc.stdout]
    if missing:
        raise SampleFailed(f"{checkout}: no answer from {', '.join(missing[:4])}")
    return t.seconds, t.cpu


def _noop(
    checkout: Path, inv: str, work: Path, tag: str, split: list | None = None, extra: tuple = ()
) -> Sample:
    """One no-op run's wall and CPU; with ``split``, its phases (:func:`phase_split`) too;
    ``extra``: more ``run`` options (``--after-run-args``)."""
    argv, env = _argv(checkout)
    code = work / "code"
    env["FLEETCTL_CACHE_DIR"] = str(work / f"cache-{tag}")  # the check really runs
    runs = work / f"runs-{checkout.name}-{tag}"  # this sample's run folder alone
    cmd = [*argv, "run", "-i", inv, "--launcher", "plain", "--code-dir", str(code)]
    cmd += ["--runs-dir", str(runs), *extra, str(code / "job.py")]
    began = time.time()
    t = run_timed(cmd, env=env, timeout=600, cwd=str(checkout))
    if t.proc.returncode != 0:
        raise SampleFailed(f"{checkout}: run exit {t.proc.returncode}: {tail(t.proc.stderr)}")
    if split is not None:
        (job,) = runs.glob("*/job.json")
        split.append(phase_split(json.loads(job.read_text())["phases"], began, began + t.seconds))
    return t.seconds, t.cpu


def phase_split(phases: list[dict], began: float, ended: float) -> dict[str, tuple[float, float]]:
    """A run's (wall s, controller CPU s) by phase from job.json's ``phases`` (each entry: its
    text, when it began, the process's own and its children's CPU so far): ``start`` from the
    process's start (``began``) to the first phase, all the CPU then; each phase named by its
    text's first word, to the next entry; ``end`` from the last entry (``done: …``) to the exit
    (``ended``; wall only: the CPU after it is not recorded)."""

    def at(p: dict) -> float:
        return dt.datetime.fromisoformat(p["at"].replace("Z", "+00:00")).timestamp()

    def cpu(p: dict) -> float:
        return float(p["cpu"]) + float(p["child_cpu"])

    out = {"start": (at(phases[0]) - began, cpu(phases[0]))}
    for p, q in itertools.pairwise(phases):
        name = p["phase"].split(" ")[0].rstrip(":")
        wall, used = out.get(name, (0.0, 0.0))  # a phase that comes twice: its sum
        out[name] = (wall + at(q) - at(p), used + cpu(q) - cpu(p))
    out["end"] = (ended - at(phases[-1]), 0.0)
    return out


def _phase_table(splits: dict[str, list[dict[str, tuple[float, float]]]]) -> list[str]:
    """Medians per phase and side, in the order the phases came (ms)."""
    names = list(dict.fromkeys(k for side in splits.values() for s in side for k in s))
    lines = [
        "| phase | before wall ms | before CPU ms | after wall ms | after CPU ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in names:
        cells = []
        for side in ("before", "after"):
            got = [s[name] for s in splits[side] if name in s]
            for i in (0, 1):
                cells.append(f"{1000 * statistics.median(g[i] for g in got):.0f}" if got else "—")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def _row(name: str, n: int, samples: dict[str, list[tuple[float, float]]]) -> str:
    cells = []
    for side in ("before", "after"):
        got = samples[side]
        if not got:
            cells += ["—", "—"]
            continue
        cells.append(f"{statistics.median(s for s, _ in got):.3f}")
        cells.append(f"{statistics.median(c for _, c in got):.3f}")
    return f"| {name} | {n} | " + " | ".join(cells) + f" | {len(samples['after'])} |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", required=True, type=Path, help="checkout measured first")
    p.add_argument("--after", required=True, type=Path, help="checkout measured second")
    p.add_argument("--sizes", default="8,64", help="lab host counts (comma list)")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", type=Path, default=None, help="write the raw samples here")
    p.add_argument("--phases", action="store_true", help="the no-op run's phases, per side")
    p.add_argument(
        "--after-run-args",
        default="",
        help="more options for the after side's no-op run (shell words), e.g. "
        "'--no-report --on-slow off': what features the before side lacks cost",
    )
    args = p.parse_args(argv)
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    extra = {"before": (), "after": tuple(shlex.split(args.after_run_args))}
    for root in sides.values():
        compileall.compile_dir(str(root / "fleetctl"), quiet=1)
    raw: dict[str, dict[str, list[tuple[float, float]]]] = {}
    lines = [
        "| row | N | before median s | before CPU s | after median s | after CPU s | samples |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    failures: list[str] = []
    for n in [int(x) for x in args.sizes.split(",")]:
        with sized_lab(n, "fleetctl-ab-", "/root/.fleetctl/bench-ab") as (lab, _, inv, work):
            (work / "code").mkdir()
            (work / "code" / "job.py").write_text(NOOP_SCRIPT)
            names = {h.name for h in lab.hosts[:n]}
            fan: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
            run: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
            splits: dict[str, list] = {"before": [], "after": []}
            for side, root in sides.items():  # untimed: the push is a no-op after it
                _noop(root, inv, work, f"warm-{side}", extra=extra[side])
            for i in range(args.repeat):
                for side, root in sides.items():
                    try:
                        fan[side].append(_fanout(root, inv, names))
                        keep = splits[side] if args.phases else None
                        sample = _noop(root, inv, work, f"{side}-{i}", keep, extra[side])
                        run[side].append(sample)
                    except (SampleFailed, subprocess.TimeoutExpired) as e:
                        failures.append(f"N={n} {side}: {e}")
            raw[f"exec hostname N={n}"] = fan
            raw[f"no-op run N={n}"] = run
            lines.append(_row("fleetctl exec hostname", n, fan))
            lines.append(_row("fleetctl run no-op job", n, run))
            if args.phases:
                lines += ["", f"no-op run, N={n}, by phase (medians):", "", *_phase_table(splits)]
                lines.append("")
    print("\n".join(lines))
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
