"""Measurement: what running in an image costs a job per node (``fleetctl run --image``).

Three rows take turns inside each repetition (the noise of a shared machine spread over all): a
bare ``podman run --rm --network host IMAGE python3 -c pass`` on every node at once, each timed
by its node (the slowest counts: the lab's hosts share two cores, so N starts at once cost here
what one alone would not); ``fleetctl run`` of a no-op script without an image; the same run
with ``--image``. An image's cost to a job is the difference of the last two; its overhead over
a bare ``podman run`` is that cost minus the bare start (goal ≤ 0.5 s; nodes start in parallel,
so it is per node). The check's probe (one trivial container of the image per node) and the
image-id comparison are part of the cost, as in every real run.

Image push (``image_push``): ``fleetctl push --image`` to hosts that lack the image (each gets
an empty image store of its own through ``CONTAINERS_STORAGE_CONF`` in its shell, emptied
before every sample) against a parallel ``podman save | ssh HOST podman load`` per host. The
controller's egress is the lab bridge's tx bytes (frames the bridge forwards between hosts,
the peer waves, are not in it): goal ≤ 1.2× the image archive for fleetctl, N× for the loop.

Needs podman on the lab hosts and the test image in this machine's store, which the lab hosts
share (``pytest tests/lab/test_containers.py`` imports it); else the rows say why not.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from common import Result, SampleFailed, finish_row, repeat, run_timed, tail

IMAGE = "fleetctl-test:py3"
BARE = (
    "t0=$(date +%s.%N); podman run --rm --network host {image} python3 -c pass >/dev/null "
    "&& echo START $t0 $(date +%s.%N)"
)


STORE = "/tmp/bench-store"  # in each host's private /tmp (its host dir's tmp/)
STORE_CONF = f'[storage]\ndriver = "vfs"\ngraphroot = "{STORE}/graph"\nrunroot = "{STORE}/run"\n'


class ContainerBench:
    """``fleetctl run --image`` against ``fleetctl run`` and a bare ``podman run``; ``fleetctl
    push --image`` against a parallel ``podman save | ssh podman load``."""

    def __init__(self, phases: Any) -> None:
        self.p = phases  # phases.PhaseBench: the lab, inventories, run_job

    def all(self, repeats: int) -> list[Result]:
        return [*self.start_overhead(repeats), *self.image_push(repeats)]

    @staticmethod
    def _require() -> None:
        if shutil.which("podman") is None:
            raise RuntimeError("podman is not installed (apt-get install podman runc)")
        if subprocess.run(["podman", "image", "exists", IMAGE], timeout=60).returncode != 0:
            raise RuntimeError(f"{IMAGE} is not imported (tests/lab/test_containers.py does it)")

    def start_overhead(self, repeats: int) -> list[Result]:
        self._require()
        n = self.p.n(2 if self.p.quick else 8)
        bare = Result(
            "containers", f"bare `podman run --rm {IMAGE}` on every node at once (slowest)", n
        )
        plain = Result("containers", "fleetctl run: no-op script, no image", n)
        image = Result("containers", f"fleetctl run --image {IMAGE}: no-op script", n)
        for _ in range(repeats):  # taking turns
            repeat(bare, 1, lambda: self._bare(n), finish=False)
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
            "the image check's command (its trial container on a node's first run of the "
            "image), the image-id comparison, the supervisor's runtime calls (start; one "
            "listing by label at the end; the main pid is a file podman writes) and the "
            "container guard"
        )
        return [finish_row(bare), finish_row(plain), finish_row(image)]

    def _bare(self, n: int) -> float:
        """The same N container starts without fleetctl, each timed by its node, all at once:
        the lab's N hosts share two cores, so a start alone would hide what N at once cost
        here (a real node has its own cores). The slowest node's time, as a job waits for it."""
        inv = self.p.inventory(n, "/root/.fleetctl/bench-containers")
        t = run_timed(
            [*self.p.fl, "exec", "-i", inv, "--", "sh", "-c", BARE.format(image=IMAGE)],
            env=self.p.env,
            cwd=str(self.p.work),
            timeout=120,
        )
        spans = [
            float(w[-1]) - float(w[-2])
            for w in (ln.split() for ln in t.proc.stdout.splitlines() if "START " in ln)
            if len(w) >= 4
        ]
        if t.proc.returncode != 0 or len(spans) != n:
            raise SampleFailed(f"bare podman run: exit {t.proc.returncode}: {tail(t.proc.stderr)}")
        return max(spans)

    def _run(self, n: int, extra: list[str]) -> float:
        name = "containers-image" if extra else "containers-bare"
        r = self.p.run_job(n, "pass\n", [], name=name, extra=extra, timeout=300)
        if r["rc"] != 0 or r["job"].status != "succeeded":
            raise SampleFailed(f"fleetctl run exit {r['rc']}: {r['why']}")
        return float(r["wall"])

    # -- image push -----------------------------------------------------------------------
    def image_push(self, repeats: int) -> list[Result]:
        self._require()
        n = self.p.n(3 if self.p.quick else 16)
        hosts = [h.name for h in self.p.lab.hosts[:n]]
        inv = self.p.inventory(n, "/root/.fleetctl/bench-image")
        size = _archive_bytes()
        fleet = Result("containers", f"image push ({size / 1e6:.0f} MB): fleetctl push --image", n)
        loop = Result(
            "containers", f"image push ({size / 1e6:.0f} MB): parallel podman save | ssh load", n
        )
        saved = self._own_stores(hosts)
        try:
            for _ in range(repeats):  # taking turns
                repeat(fleet, 1, lambda: self._fleet_push(inv, hosts, size), finish=False)
                repeat(loop, 1, lambda: self._save_ssh_load(hosts, size), finish=False)
        finally:
            self._restore(hosts, saved)
        fleet.note = loop.note = (
            "controller egress = the lab bridge's tx bytes (peer waves between hosts are "
            "forwarded, not sent by this machine); goal for fleetctl <= 1.2x the archive"
        )
        return [finish_row(fleet), finish_row(loop)]

    def _own_stores(self, hosts: list[str]) -> dict[str, str]:
        """Each host an empty image store of its own (its shell exports the config)."""
        saved = {}
        for h in hosts:
            hd = Path(self.p.lab.host_dir(h))
            if not (hd / "bashrc").is_file():
                raise RuntimeError(f"{h} has no .bashrc of its own (lab up --machine-bashrc?)")
            (hd / "tmp" / "bench-storage.conf").write_text(STORE_CONF)
            saved[h] = (hd / "bashrc").read_text()
            conf = "export CONTAINERS_STORAGE_CONF=/tmp/bench-storage.conf\n"
            (hd / "bashrc").write_text(saved[h] + conf)
        return saved

    def _restore(self, hosts: list[str], saved: dict[str, str]) -> None:
        for h, text in saved.items():
            hd = Path(self.p.lab.host_dir(h))
            (hd / "bashrc").write_text(text)
        self._empty(hosts)

    def _empty(self, hosts: list[str]) -> None:
        for h in hosts:
            shutil.rmtree(Path(self.p.lab.host_dir(h)) / "tmp" / STORE.split("/")[-1], True)

    def _fleet_push(self, inv: str, hosts: list[str], size: int) -> tuple[float, dict]:
        self._empty(hosts)
        b0 = self.p.tx_bytes()
        t = run_timed(
            [*self.p.fl, "push", "-i", inv, "--image", IMAGE, "--json"],
            env=self.p.env,
            cwd=str(self.p.work),
            timeout=1800,
        )
        sent = self.p.tx_bytes() - b0
        if t.proc.returncode != 0:
            raise SampleFailed(
                f"fleetctl push --image exit {t.proc.returncode}: {tail(t.proc.stderr)}"
            )
        rep = json.loads(t.proc.stdout)
        loaded = [h for h, v in rep["nodes"].items() if v["status"] == "loaded"]
        if sorted(loaded) != sorted(hosts):
            raise SampleFailed(f"loaded on {loaded}, not on all of {hosts}")
        return t.seconds, {
            "controller egress / image (bridge)": round(sent / size, 2),
            "controller_bytes / archive_bytes (push report)": round(
                rep["controller_bytes"] / rep["archive_bytes"], 2
            ),
            "peer fetches": rep["peer_fetches"],
        }

    def _save_ssh_load(self, hosts: list[str], size: int) -> tuple[float, dict]:
        self._empty(hosts)
        cfg = shlex.quote(str(self.p.lab.ssh_config))
        line = " ".join(
            f"(podman save --format docker-archive {IMAGE} | ssh -F {cfg} {h} podman load "
            f">{self.p.work}/load-{h}.log 2>&1) &"
            for h in hosts
        )
        b0 = self.p.tx_bytes()
        t = run_timed(["bash", "-c", line + " wait"], timeout=1800)
        sent = self.p.tx_bytes() - b0
        logs = [(Path(self.p.work) / f"load-{h}.log").read_text() for h in hosts]
        bad = [x for x in logs if "Loaded image" not in x]
        if bad:
            raise SampleFailed(f"podman load: {tail(bad[0])}")
        return t.seconds, {"controller egress / image (bridge)": round(sent / size, 2)}


def _archive_bytes() -> int:
    """The size of the image's docker-archive, as push and the loop send it."""
    p = subprocess.run(
        f"podman save --format docker-archive {IMAGE} | wc -c",
        shell=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0 or not p.stdout.strip().isdigit():
        raise RuntimeError(f"podman save {IMAGE}: {tail(p.stderr)}")
    return int(p.stdout.strip())
