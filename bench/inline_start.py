"""A node program's start CPU sent as plain ``python -c`` code and compressed, taking turns.

``fleetctl.remote.inline`` compresses code over ``COMPRESS_OVER`` (zlib, base64); this measures
what that costs a start: each program is run both ways by the node's Python 3.8 (``-S``, as a
node runs it) ``--repeat`` times, interleaved, and its children's user+sys CPU taken.

    FLEETCTL_PYTHON38=/path/to/python3.8 python bench/inline_start.py --repeat 40
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleetctl import remote

# a mode each program refuses at once, after importing everything it ships with
PROGRAMS = {"supervisor.py": ["no-such-mode"], "exec_timeout.py": ["--help"]}


def both(name: str) -> dict[str, str]:
    """The program's -c code plain and compressed, whichever ``inline`` sends."""
    saved = remote.COMPRESS_OVER
    try:
        remote.inline.cache_clear()
        remote.COMPRESS_OVER = 1 << 30
        plain = remote.inline(name)
        remote.inline.cache_clear()
        remote.COMPRESS_OVER = 0
        packed = remote.inline(name)
    finally:
        remote.COMPRESS_OVER = saved
        remote.inline.cache_clear()
    return {"plain": plain, "compressed": packed}


def cpu(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, capture_output=True, stdin=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=40)
    py = os.environ["FLEETCTL_PYTHON38"]
    n = ap.parse_args().repeat
    print("| program | sent | argument | start CPU, median | min |")
    print("|---|---|---|---|---|")
    for name, args in PROGRAMS.items():
        codes = both(name)
        samples: dict[str, list[float]] = {k: [] for k in codes}
        for _ in range(n):
            for k, code in codes.items():
                samples[k].append(cpu([py, remote.NO_SITE, "-c", code, *args]))
        for k, v in samples.items():
            print(
                f"| {name} | {k} | {len(codes[k].encode())} B | "
                f"{statistics.median(v) * 1e3:.1f} ms | {min(v) * 1e3:.1f} ms |"
            )


if __name__ == "__main__":
    main()
