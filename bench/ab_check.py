"""Before/after of `fleetctl check`: a healthy lab, then one host's data link cut, taking turns.

bench/fleet.py's check and cut_link rows, but from several checkouts on one lab, in turns inside
every repetition (A, B, C, A, B, C, …), so the noise of a shared two-core machine falls on all
alike. Every checkout is byte-compiled first (one that cannot be written must be so already).

    python bench/ab_check.py old=/var/tmp/old new=. --sizes 16,64 --repeat 3

A healthy sample must pass; a cut-link sample (the data link of host N/2+1, as bench/fleet.py
cuts it) must fail naming that host alone. Per checkout: the check's wall time (the JSON's
``elapsed`` and the process's), the controller's CPU (with children) and, healthy, the lab
hosts' CPU per node (bench/fleet.py ``remote_cpu``). Medians as a markdown table; raw samples as
JSON with ``--json``.
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
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))  # the lab comes from this checkout

from common import SampleFailed, run_timed, tail  # noqa: E402
from fleet import _blamed, _failures, remote_cpu  # noqa: E402
from phases import sized_lab  # noqa: E402


def _check(root: Path, inv: str, lab: Any, cache: Path) -> tuple[dict[str, float], Any]:
    env = dict(os.environ)
    env.pop("SSH_AUTH_SOCK", None)
    env["FLEETCTL_SSH_CONFIG"] = "/dev/null"
    env["FLEETCTL_CACHE_DIR"] = str(cache)
    env["PYTHONPATH"] = str(root)
    r0 = remote_cpu(lab)
    # this interpreter as started (a venv's python), not common.PY: its realpath leaves the venv
    argv = [sys.executable, "-m", "fleetctl", "check", "-i", inv, "--json", "--recheck"]
    # cwd: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH
    t = run_timed(argv, env=env, cwd=str(root))
    remote = remote_cpu(lab) - r0
    try:
        report = json.loads(t.proc.stdout)
    except ValueError as e:
        why = f"exit {t.proc.returncode}, no JSON: {tail(t.proc.stderr)}"
        raise SampleFailed(f"{root}: {why}") from e
    n = len(lab.hosts)
    sample = {
        "elapsed": float(report.get("elapsed") or 0.0),
        "wall": t.seconds,
        "cpu": t.cpu,
        "remote_ms_per_node": 1000 * remote / n,
        "rc": float(t.proc.returncode),
    }
    if os.environ.get("AB_CHECK_KEEP"):  # the reports, for a look at what each side said
        keep = Path(os.environ["AB_CHECK_KEEP"])
        keep.mkdir(parents=True, exist_ok=True)
        (keep / f"{cache.name}-n{n}.json").write_text(t.proc.stdout)
    return sample, report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sides", nargs="+", help="NAME=CHECKOUT, measured in this order")
    p.add_argument("--sizes", default="16,64", help="lab host counts (comma list)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rows", default="healthy,cut", help="healthy, cut or both")
    p.add_argument("--json", type=Path, default=None, help="write the raw samples here")
    args = p.parse_args(argv)
    sides = {s.split("=", 1)[0]: Path(s.split("=", 1)[1]).resolve() for s in args.sides}
    for root in sides.values():
        if os.access(root / "fleetctl", os.W_OK):
            compileall.compile_dir(str(root / "fleetctl"), quiet=1)
    rows = args.rows.split(",")
    raw: dict[str, dict[str, list[dict[str, float]]]] = {}
    failures: list[str] = []
    for n in [int(x) for x in args.sizes.split(",")]:
        with sized_lab(n, "fleetctl-abcheck-", "/root/.fleetctl/bench-abcheck") as lab_etc:
            lab, _, inv, tmp = lab_etc
            victim = lab.hosts[n // 2].name
            for row in rows:
                got: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
                if row == "cut":
                    lab.cut_link(victim, "data")
                try:
                    for i in range(args.repeat):
                        for side, root in sides.items():
                            try:
                                s, rep = _check(root, inv, lab, tmp / f"c-{side}-{i}")
                                if row == "healthy" and s["rc"] != 0:
                                    raise SampleFailed(f"failed: {_failures(rep)}")
                                if row == "cut" and _blamed(rep) != [victim]:
                                    raise SampleFailed(f"blamed {_blamed(rep)}, not {victim}")
                                got[side].append(s)
                            except (SampleFailed, subprocess.TimeoutExpired) as e:
                                failures.append(f"{row} N={n} {side}: {e}")
                finally:
                    if row == "cut":
                        lab.heal_link(victim, "data")
                raw[f"{row} N={n}"] = got
    keys = ("elapsed", "wall", "cpu", "remote_ms_per_node")
    print("| row | side | samples | " + " | ".join(keys) + " |")
    print("|---|---|---:|" + "---:|" * len(keys))
    for name, got in raw.items():
        for side, samples in got.items():
            if not samples:
                continue
            cells = []
            for k in keys:
                vals = [s[k] for s in samples]
                lo, hi = min(vals), max(vals)
                cells.append(f"{statistics.median(vals):.2f} ({lo:.2f}–{hi:.2f})")
            print(f"| {name} | {side} | {len(samples)} | " + " | ".join(cells) + " |")
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
