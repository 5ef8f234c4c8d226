"""Before/after: the same fan-out and no-op run from two checkouts of fleetctl, taking turns.

A refactor must not make the tool slower (issue 35's acceptance: "behaviour and benchmarks are
not worse than before — measure before and after"). Both checkouts run on one lab, in turns
inside every repetition (A, B, A, B, …), so the noise of a shared two-core machine falls on
both alike; each checkout is byte-compiled first, as `pip install` would leave it.

    python bench/ab.py --before /var/tmp/fleetctl-before --after . --sizes 8,64 --repeat 5

Rows: ``fleetctl exec -i INV hostname`` (every host must answer with its own name) and a
no-op ``fleetctl run`` (check included: a check cache of its own per sample; the push is a no-op
after one untimed run per checkout). Printed as a markdown table; the raw samples as JSON.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the lab comes from the after checkout

from common import SampleFailed, run_timed, tail  # noqa: E402
from phases import NOOP_SCRIPT, sized_lab  # noqa: E402


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


def _noop(checkout: Path, inv: str, work: Path, tag: str) -> tuple[float, float]:
    argv, env = _argv(checkout)
    code = work / "code"
    env["FLEETCTL_CACHE_DIR"] = str(work / f"cache-{tag}")  # the check really runs
    cmd = [*argv, "run", "-i", inv, "--launcher", "plain", "--code-dir", str(code)]
    cmd += ["--runs-dir", str(work / f"runs-{checkout.name}"), str(code / "job.py")]
    t = run_timed(cmd, env=env, timeout=600, cwd=str(checkout))
    if t.proc.returncode != 0:
        raise SampleFailed(f"{checkout}: run exit {t.proc.returncode}: {tail(t.proc.stderr)}")
    return t.seconds, t.cpu


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
    args = p.parse_args(argv)
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
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
            for side, root in sides.items():  # untimed: the push is a no-op after it
                _noop(root, inv, work, f"warm-{side}")
            for i in range(args.repeat):
                for side, root in sides.items():
                    try:
                        fan[side].append(_fanout(root, inv, names))
                        run[side].append(_noop(root, inv, work, f"{side}-{i}"))
                    except (SampleFailed, subprocess.TimeoutExpired) as e:
                        failures.append(f"N={n} {side}: {e}")
            raw[f"exec hostname N={n}"] = fan
            raw[f"no-op run N={n}"] = run
            lines.append(_row("fleetctl exec hostname", n, fan))
            lines.append(_row("fleetctl run no-op job", n, run))
    print("\n".join(lines))
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
