"""Which peers each host tests in the check's mesh. Pure.

Every pair is tested up to ``FULL_UP_TO`` hosts: N×(N-1) probes, one short TCP connect and
ICMP echo each, is cheap there. Past it the pairs grow with N² while the faults they find do
not: a host whose training link is down fails with *every* peer, so a few peers per host find
it. ``sparse`` gives each host its two ring neighbours (so every host is tested from two sides
and by two others) plus ``k`` peers drawn with a seed from the host list (the same plan for
the same fleet, so a re-check tests the same pairs). ``full`` forces N×N at any size.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

MESH_MODES = ("auto", "full", "sparse", "off")
FULL_UP_TO = 32  # auto: every pair up to this many hosts, sparse beyond
RANDOM_PEERS = 3  # sparse: peers per host besides its ring neighbours
# A failed pair is tried again with timeouts 2 x the probing host's slowdown (its 1-minute
# load per CPU, at most this): loaded hosts answer late, cut links never answer.
MAX_SLOWDOWN = 2.0


def mesh_mode(mode: str, n: int) -> str:
    """``auto`` resolved for a fleet of ``n`` hosts: ``full`` or ``sparse``."""
    if mode == "auto":
        return "full" if n <= FULL_UP_TO else "sparse"
    return mode


def mesh_peers(
    names: Sequence[str], mode: str = "auto", *, k: int = RANDOM_PEERS
) -> dict[str, list[str]]:
    """Host -> the peers it tests (inventory order). ``off``: nobody tests anybody."""
    names = list(names)
    resolved = mesh_mode(mode, len(names))
    if resolved == "off":
        return {a: [] for a in names}
    if resolved == "full":
        return {a: [b for b in names if b != a] for a in names}
    seed = hashlib.sha256("\0".join(names).encode()).hexdigest()
    rng = random.Random(seed)
    n = len(names)
    out: dict[str, list[str]] = {}
    for i, a in enumerate(names):
        chosen = {names[(i + 1) % n], names[(i - 1) % n]} - {a}
        rest = [b for b in names if b != a and b not in chosen]
        chosen.update(rng.sample(rest, min(k, len(rest))))
        out[a] = [b for b in names if b in chosen]
    return out
