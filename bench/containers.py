"""Measurement: what running in an image costs a job per node (``fleetctl run --image``).

Three rows take turns inside each repetition (the noise of a shared machine spread over all):
a bare ``podman run --rm --network host IMAGE python3 -c pass``, timed on a node by the node
itself; ``fleetctl run`` of a no-op script without an image; the same run with ``--image``.
An image's cost to a job is the difference of the last two; its overhead over a bare
``podman run`` is that cost minus the bare start (goal ≤ 0.5 s; nodes start in parallel, so
it is per node). The check's probe (one trivial container of the image per node) and the
image-id comparison are part of the cost, as in every real run.

Needs podman on the lab hosts and the test image in this machine's store, which the lab hosts
share (``pytest tests/lab/test_containers.py`` imports it); else the rows say why not.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from common import Result, SampleFailed, finish_row, repeat, run_timed, tail

IMAGE = "fleetctl-test:py3"
BARE = (
    "t0=$(date +%s.%N); podman run --rm --network host {image} python3 -c pass >/dev/null "
    "&& echo START $t0 $(date +%s.%N)"
)


class ContainerBench:
    """``fleetctl run --image`` against ``fleetctl run`` and a bare ``podman run``."""

    def __init__(self, phases: Any) -> None:
        self.p = phases  # phases.PhaseBench: the lab, inventories, run_job

    def start_overhead(self, repeats: int) -> list[Result]:
        if shutil.which("podman") is None:
            raise RuntimeError("podman is not installed (apt-get install podman runc)")
        if subprocess.run(["podman", "image", "exists", IMAGE], timeout=60).returncode != 0:
            raise RuntimeError(f"{IMAGE} is not imported (tests/lab/test_containers.py does it)")
        n = self.p.n(2 if self.p.quick else 8)
        bare = Result("containers", f"bare `podman run --rm {IMAGE}` (timed on node1)", 1)
        plain = Result("containers", "fleetctl run: no-op script, no image", n)
        image = Result("containers", f"fleetctl run --image {IMAGE}: no-op script", n)
        for _ in range(repeats):  # taking turns
            repeat(bare, 1, self._bare, finish=False)
            repeat(plain, 1, lambda: self._run(n, []), finish=False)
            repeat(image, 1, lambda: self._run(n, ["--image", IMAGE]), finish=False)
        if bare.samples and plain.samples and image.samples:
            cost = image.stats()[0] - plain.stats()[0]  # type: ignore[index]
            image.extra["image cost s (median - no-image median)"] = [round(cost, 3)]
            image.extra["overhead over bare podman run s (goal <= 0.5)"] = [
                round(cost - bare.stats()[0], 3)  # type: ignore[index]
            ]
        image.note = (
            "cost = this row's median - the no-image row's; overhead = cost - the bare start: "
            "the check's probe container, the image-id comparison, the supervisor's runtime "
            "calls (start, rank pid, end by label) and the container guard"
        )
        return [finish_row(bare), finish_row(plain), finish_row(image)]

    def _bare(self) -> float:
        inv = self.p.inventory(1, "/root/.fleetctl/bench-containers")
        t = run_timed(
            [*self.p.fl, "exec", "-i", inv, "--", "sh", "-c", BARE.format(image=IMAGE)],
            env=self.p.env,
            cwd=str(self.p.work),
            timeout=120,
        )
        words = next((ln.split() for ln in t.proc.stdout.splitlines() if "START " in ln), [])
        if t.proc.returncode != 0 or len(words) < 4:
            raise SampleFailed(f"bare podman run: exit {t.proc.returncode}: {tail(t.proc.stderr)}")
        return float(words[-1]) - float(words[-2])

    def _run(self, n: int, extra: list[str]) -> float:
        name = "containers-image" if extra else "containers-bare"
        r = self.p.run_job(n, "pass\n", [], name=name, extra=extra, timeout=300)
        if r["rc"] != 0 or r["job"].get("status") != "succeeded":
            raise SampleFailed(f"fleetctl run exit {r['rc']}: {r['why']}")
        return float(r["wall"])
