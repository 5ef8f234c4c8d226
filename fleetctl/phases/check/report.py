"""What a check takes and gives: :class:`CheckOptions`, the per-host :class:`ProbeOutcome`,
and the :class:`CheckReport` (host x check -> ok / warn / fail / skip, mesh failures)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.plan.userinput import PROBE_TIMEOUT

if TYPE_CHECKING:
    from fleetctl.phases.check.collective_judge import CollectiveReport
    from fleetctl.plan.collective import CollectiveOptions
    from fleetctl.plan.rankplan import NodeFacts
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Stream


OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
CHECKS = (
    "ssh",
    "ping",
    "python",
    "rsync",
    "nic",
    "addr",
    "mesh",
    "gpu",
    "health",
    "port",
    "disk",
    "env",
    "clock",
)
GiB = 1 << 30
DEFAULT_MASTER_PORT = 29500
# ------------------------------------------------------------------------------------ options


@dataclass(frozen=True)
class CheckOptions:
    """What to check and how long to wait. Everything but the cache knobs keys the cache.

    ``uniform_gpus``: the launcher runs the same number of processes on every node (torchrun,
    paddle, deepspeed with ``--nproc-per-node auto``), so GPU counts must agree.
    ``backend``: ``nccl`` makes a node without nvidia-smi an error. ``env_dir``/``code_dir``:
    remote paths (relative to the node workdir, or absolute/``~``) whose presence the probe
    reports, so push can skip what is already there. ``env_archive_bytes``: the disk check then
    needs at least twice that (archive + unpacked) where the env is not there yet.
    """

    rdzv_port: int = DEFAULT_MASTER_PORT  # free on node 0 (--master-port); the mesh test above
    check_rdzv_port: bool = True  # False: run claims a free one itself after the check
    allow_busy_gpus: bool = False  # GPUs with another job's processes/memory: warn, not fail
    reserved_ports: tuple[int, ...] = ()
    backend: str | None = None
    uniform_gpus: bool = False
    min_free_bytes: int = GiB
    env_archive_bytes: int | None = None
    env_dir: str | None = None
    env_imports: tuple[str, ...] = ()
    # The launcher's module, imported by the node python (where no env is pushed): a node
    # that cannot start the launcher fails the check, not the run.
    launcher_module: str | None = None
    # ``run -m MODULE`` of a module not in the pushed code: the node python must find it
    # installed (looked up, not imported: importing ``pkg.__main__`` would run the job).
    script_module: str | None = None
    # Learn the node python's torch version without a launcher importing it (plain): the
    # flight recorder's variable is named by it (fleetctl.plan.flight_recorder).
    torch_version: bool = False
    # Hosts whose launcher runs in an image (--image): their python only runs the supervisor,
    # so neither of the two above is asked of it (the image check asks the image's python).
    container_hosts: tuple[str, ...] = ()
    code_dir: str | None = None
    mesh: bool = True
    mesh_mode: str = "auto"  # which pairs (fleetctl.phases.check.mesh_plan): auto, full, sparse
    mesh_span: int = 64
    allow_loopback: bool = False
    max_clock_skew: float = 2.0
    ping: bool = True
    probe_timeout: float = PROBE_TIMEOUT  # s for a node's python to answer (--probe-timeout)
    tcp_timeout: float = 2.0
    # a mesh pair that failed is measured once more after every host's first round (load at
    # the fleet's size fails pairs that can talk); a post-mortem within 2 s takes one round
    mesh_again: bool = True
    # the GPU and link health gate (fleetctl.health.judge) and, where dcgmi is installed and
    # this is set, DCGM's level-1 diagnostics (a minute or more)
    health: bool = True
    dcgm: bool = False
    cache_ttl: float = 120.0
    recheck: bool = False
    cache_dir: str | None = None
    # s each passing probe stays after the check, its channel held for the launch to start the
    # supervisor in (``fleetctl run``; CheckReport.held). 0: probes exit after the check.
    hold: float = 0.0
    # --collective: a torch.distributed benchmark over the training NICs after a passing check
    # (fleetctl.phases.check.collective); None: none
    collective: CollectiveOptions | None = None

    @classmethod
    def within(cls, limit: float, **job: Any) -> CheckOptions:
        """A fresh check that must answer within ``limit`` seconds (the post-mortem's):
        uncached, one mesh round (a second would not fit), and the job's own port not asked to
        be free (it may linger in TIME_WAIT)."""
        return cls(
            probe_timeout=limit,
            mesh_again=False,
            cache_ttl=0,
            recheck=True,
            check_rdzv_port=False,
            **job,
        )

    def cache_fields(self) -> dict[str, Any]:
        skip = {"cache_ttl", "recheck", "cache_dir", "hold", "probe_timeout"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


# ------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class CheckResult:
    """One cell of the table: a check's status on one host and why."""

    status: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclass
class HostReport:
    """One row: every check of one host, in ``CHECKS`` order."""

    name: str
    label: str
    checks: dict[str, CheckResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks.values())

    @property
    def failed(self) -> list[str]:
        return [k for k, c in self.checks.items() if c.failed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.name,
            "label": self.label,
            "ok": self.ok,
            "checks": {k: {"status": c.status, "detail": c.detail} for k, c in self.checks.items()},
        }


@dataclass(frozen=True)
class MeshFailure:
    """A directed pair that cannot talk over the training network: ``src → dst: problems``."""

    src: str
    dst: str
    problems: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.src} → {self.dst}: {', '.join(self.problems)}"


@dataclass
class CheckReport:
    """Everything preflight found. ``ok`` is False when any cell failed or any pair failed;
    ``exit_code``, ``failed`` (host → what) and ``to_dict()`` complete the one result
    protocol (``fleetctl.results.Outcome``).

    ``facts`` feeds ``make_plan``; ``homes`` lets later phases skip the SFTP home lookup
    (see ``prime``); ``code_present``/``env_present`` let push skip a round trip.
    """

    hosts: dict[str, HostReport]
    mesh_failures: list[MeshFailure] = field(default_factory=list)
    mesh_skipped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict[str, NodeFacts] = field(default_factory=dict)
    homes: dict[str, str] = field(default_factory=dict)
    code_present: dict[str, bool] = field(default_factory=dict)
    env_present: dict[str, bool] = field(default_factory=dict)
    nccl_versions: dict[str, str | None] = field(default_factory=dict)
    mesh_ports: dict[str, int] = field(default_factory=dict)
    # hosts that see one workdir (an NFS home): groups of two or more, in inventory order
    shared_workdirs: list[list[str]] = field(default_factory=list)
    checked_at: float = 0.0
    elapsed: float = 0.0
    cached: bool = False
    # with CheckOptions.hold, on a passing check: each node's probe, waiting on its channel to
    # become the node supervisor (:class:`HeldProbe`); never cached or saved
    held: dict[str, HeldProbe] = field(default_factory=dict, repr=False, compare=False)
    # CheckOptions.collective: the benchmark's figures and verdict (never cached)
    collective: CollectiveReport | None = None

    def release(self) -> None:
        """Let every held probe go (EOF: it exits)."""
        held, self.held = self.held, {}
        release_probes(held.values())

    @property
    def ok(self) -> bool:
        coll_ok = self.collective is None or self.collective.ok
        return not self.mesh_failures and all(h.ok for h in self.hosts.values()) and coll_ok

    @property
    def failures(self) -> list[tuple[str, str, str]]:
        """(host, check, reason) for every failed cell, in rank and check order."""
        return [
            (h.name, k, c.detail)
            for h in self.hosts.values()
            for k, c in h.checks.items()
            if c.failed
        ] + [(h, "collective", why) for h, why in (self.collective or _NO_COLL).failures]

    @property
    def exit_code(self) -> int:
        """The command's: 0 when every check passed, else ``CheckError``'s (3)."""
        from fleetctl.errors import CheckError

        return 0 if self.ok else CheckError.exit_code

    @property
    def failed(self) -> dict[str, str]:
        """Host → what failed there, in rank order: its failed cells (``disk: 0.4 GiB
        free; gpu: …``), a mesh pair under its source (``mesh → node3: tcp``), the
        collective's verdict on it; the one result protocol's shape. Empty when ok."""
        what: dict[str, list[str]] = {}
        for host, check, reason in self.failures:
            what.setdefault(host, []).append(f"{check}: {reason}" if reason else check)
        for f in self.mesh_failures:
            what.setdefault(f.src, []).append(f"mesh → {f.dst}: {', '.join(f.problems)}")
        rank = {h: i for i, h in enumerate(self.hosts)}
        hosts = sorted(what, key=lambda h: rank.get(h, len(rank)))
        return {h: "; ".join(what[h]) for h in hosts}

    @property
    def failed_hosts(self) -> list[str]:
        coll = set(self.collective.failed_hosts) if self.collective else set()
        return [h.name for h in self.hosts.values() if not h.ok or h.name in coll]

    def summary(self) -> str:
        """The one-line verdict."""
        n = len(self.hosts)
        if self.ok:
            extra = f", {len(self.warnings)} warning(s)" if self.warnings else ""
            return f"all {n} host(s) ready{extra}"
        bad = self.failed_hosts
        parts = [f"{len(bad)} of {n} host(s) failed" if bad else f"{n} host(s) checked"]
        if self.mesh_failures:
            parts.append(f"{len(self.mesh_failures)} mesh pair(s) failed")
        if self.collective is not None and not self.collective.ok:
            parts.append(self.collective.summary())
        return "; ".join(parts)

    def prime(self, fleet: FanOut) -> None:
        """Give the fleet's open connections the homes the probe reported (no SFTP lookup, no
        srun step)."""
        for node in fleet.connected:
            home = self.homes.get(node.name)
            if home:
                fleet.connection(node).remember_home(home)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "failed": self.failed,
            "summary": self.summary(),
            "checks": list(CHECKS),
            "hosts": [h.to_dict() for h in self.hosts.values()],
            "failures": [{"host": h, "check": c, "reason": r} for h, c, r in self.failures],
            "mesh_failures": [
                {"src": f.src, "dst": f.dst, "problems": list(f.problems), "text": str(f)}
                for f in self.mesh_failures
            ],
            "mesh_skipped": list(self.mesh_skipped),
            "warnings": list(self.warnings),
            "facts": {k: _facts_dict(v) for k, v in self.facts.items()},
            "homes": dict(self.homes),
            "code_present": dict(self.code_present),
            "env_present": dict(self.env_present),
            "nccl_versions": dict(self.nccl_versions),
            "mesh_ports": dict(self.mesh_ports),
            "shared_workdirs": [list(g) for g in self.shared_workdirs],
            "checked_at": self.checked_at,
            "elapsed": round(self.elapsed, 3),
            "cached": self.cached,
            "collective": self.collective.to_dict() if self.collective is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckReport:
        from fleetctl.plan.rankplan import NodeFacts

        hosts = {}
        for h in data["hosts"]:
            checks = {k: CheckResult(v["status"], v["detail"]) for k, v in h["checks"].items()}
            hosts[h["host"]] = HostReport(h["host"], h["label"], checks)
        return cls(
            hosts=hosts,
            mesh_failures=[
                MeshFailure(f["src"], f["dst"], tuple(f["problems"]))
                for f in data.get("mesh_failures", [])
            ],
            mesh_skipped=list(data.get("mesh_skipped", [])),
            warnings=list(data.get("warnings", [])),
            facts={k: NodeFacts.from_dict(v) for k, v in data.get("facts", {}).items()},
            homes=dict(data.get("homes", {})),
            code_present=dict(data.get("code_present", {})),
            env_present=dict(data.get("env_present", {})),
            nccl_versions=dict(data.get("nccl_versions", {})),
            mesh_ports={k: int(v) for k, v in data.get("mesh_ports", {}).items()},
            shared_workdirs=[list(g) for g in data.get("shared_workdirs", [])],
            checked_at=float(data.get("checked_at", 0.0)),
            elapsed=float(data.get("elapsed", 0.0)),
            cached=bool(data.get("cached", False)),
        )


class _NoCollective:
    failures: tuple[tuple[str, str], ...] = ()


_NO_COLL = _NoCollective()


def _facts_dict(f: NodeFacts) -> dict[str, Any]:
    d = dataclasses.asdict(f) if dataclasses.is_dataclass(f) else dict(vars(f))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


@dataclass
class HeldProbe:
    """A passing node's probe, still on its channel after the check: the launch sends it the
    supervisor's start (``fleetctl.phases.launch.start_node``), saving the node a remote command,
    a shell and an interpreter start. Used only before ``until`` (monotonic): the probe waits
    twice as long, so it is never handed a start just as it gives up."""

    stream: Stream
    python: str  # the node python the probe runs on: the supervisor's must be the same
    until: float
    pid: int | None = None  # the probe's process on the node, which the supervisor becomes

    def usable(self, python: str, now: float) -> bool:
        return python == self.python and now < self.until

    def close(self) -> None:
        self.stream.close()


def release_probes(held: Iterable[HeldProbe]) -> None:
    """Close each held probe's channel (EOF: it exits); one that fails to close is gone."""
    for h in held:
        with contextlib.suppress(Exception):
            h.close()


@dataclass
class ProbeOutcome:
    """What one node's probe session produced (raw; judged by ``build_report``)."""

    facts: dict[str, Any] | None = None
    received_at: float | None = None
    error: str | None = None  # the probe did not deliver facts
    exit_code: int | None = None
    tail: str = ""
    old_python: str | None = None
    listener: tuple[str, int] | None = None
    noready: str | None = None
    mesh: dict[str, Any] | None = None
    mesh_error: str | None = None
    mesh_peers: list[str] | None = None  # the peers this host was to test (None: all)
    held: HeldProbe | None = None  # CheckOptions.hold: the probe stays for the launch
