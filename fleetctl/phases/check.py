"""Preflight: find what would kill or hang a distributed job, on every host and every pair.

``check_fleet(fleet, options)`` opens one SSH connection per host (the fleet's, reused by the
later phases of ``fleetctl run``), pings every host from here, and runs ONE streamed remote
command per host: the stdlib probe (``fleetctl/remote/probe.py``), which reports the host's
facts and
then takes part in the N×N mesh test over the training NICs (ping + TCP to a short-lived
listener in the master port range). Everything runs in parallel, every wait is bounded.

The result is a ``CheckReport``: host × check → ok / warn / fail / skip with a reason, the mesh
failures as directed pairs, fleet-wide warnings, and the ``NodeFacts`` the plan needs (training
address, NIC, GPUs). Failed checks never raise: the report says; ``fleetctl run`` turns a failed
report into ``CheckError``. A passing report is cached for a short time per fleet + options so
``run`` right after ``check`` is instant.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shlex
import socket
import subprocess
import threading
import time
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import ConnectError, FleetctlError

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import NodeFacts
    from fleetctl.ssh.connection import Connection, SSHSettings, Stream
    from fleetctl.ssh.fleet import Fleet

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
    "port",
    "disk",
    "env",
    "clock",
)
GiB = 1 << 30
DEFAULT_MASTER_PORT = 29500
CACHE_VERSION = 1
TAG = "@@FLEETCTL"
BOOTSTRAP = (
    "import sys\n"
    "if sys.version_info < (3, 7):\n"
    "    sys.stdout.write('@@FLEETCTL OLD ' + sys.version.split()[0] + '\\n')\n"
    "    sys.exit(9)\n"
    "import base64, zlib\n"
    "exec(compile(zlib.decompress(base64.b64decode(sys.argv[1])), 'fleetctl-probe', 'exec'),"
    " {'__name__': '__main__'})\n"
)


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

    master_port: int = DEFAULT_MASTER_PORT
    reserved_ports: tuple[int, ...] = ()
    backend: str | None = None
    uniform_gpus: bool = False
    min_free_bytes: int = GiB
    env_archive_bytes: int | None = None
    env_dir: str | None = None
    env_imports: tuple[str, ...] = ()
    code_dir: str | None = None
    mesh: bool = True
    mesh_span: int = 64
    allow_loopback: bool = False
    max_clock_skew: float = 2.0
    ping: bool = True
    probe_timeout: float = 30.0
    tcp_timeout: float = 2.0
    cache_ttl: float = 120.0
    recheck: bool = False
    cache_dir: str | None = None

    def cache_fields(self) -> dict[str, Any]:
        skip = {"cache_ttl", "recheck", "cache_dir"}
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
    """Everything preflight found. ``ok`` is False when any cell failed or any pair failed.

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
    checked_at: float = 0.0
    elapsed: float = 0.0
    cached: bool = False

    @property
    def ok(self) -> bool:
        return not self.mesh_failures and all(h.ok for h in self.hosts.values())

    @property
    def failures(self) -> list[tuple[str, str, str]]:
        """(host, check, reason) for every failed cell, in rank and check order."""
        return [
            (h.name, k, c.detail)
            for h in self.hosts.values()
            for k, c in h.checks.items()
            if c.failed
        ]

    @property
    def failed_hosts(self) -> list[str]:
        return [h.name for h in self.hosts.values() if not h.ok]

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
        return "; ".join(parts)

    def prime(self, fleet: Fleet) -> None:
        """Give the fleet's open SSH connections the homes the probe reported (no SFTP lookup)."""
        for node in fleet.connected:
            home = self.homes.get(node.name)
            conn = fleet.connection(node)
            if home and hasattr(conn, "set_home"):
                conn.set_home(home)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
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
            "checked_at": self.checked_at,
            "elapsed": round(self.elapsed, 3),
            "cached": self.cached,
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
            checked_at=float(data.get("checked_at", 0.0)),
            elapsed=float(data.get("elapsed", 0.0)),
            cached=bool(data.get("cached", False)),
        )


def _facts_dict(f: NodeFacts) -> dict[str, Any]:
    d = dataclasses.asdict(f) if dataclasses.is_dataclass(f) else dict(vars(f))
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


# ------------------------------------------------------------------------------ probe command


def probe_source() -> bytes:
    return remote.source("probe.py")


def probe_command(python: str, args: Mapping[str, Any]) -> str:
    """One shell-quoted command line: ``python -c <bootstrap> <packed probe> <json args>``."""
    packed = base64.b64encode(zlib.compress(probe_source(), 9)).decode("ascii")
    argv = [*shlex.split(python or "python3"), "-c", BOOTSTRAP, packed, json.dumps(args)]
    return shlex.join(argv)


def probe_args(
    node: Node,
    *,
    is_master: bool,
    options: CheckOptions,
    mesh: bool,
    allow_loopback: bool,
    mesh_wait: float,
) -> dict[str, Any]:
    ports = sorted(_reserved_ports(node, options) | ({options.master_port} if is_master else set()))
    return {
        "address": node.address,
        "nic": node.nic,
        "train_addr": node.train_addr,
        "workdir": node.workdir,
        "ports": ports,
        "allow_loopback": allow_loopback,
        "env_dir": options.env_dir,
        "env_imports": list(options.env_imports),
        "code_dir": options.code_dir,
        "mesh": mesh,
        "mesh_port": options.master_port + 1,
        "mesh_span": options.mesh_span,
        "avoid_ports": sorted(_reserved_ports(node, options) | {options.master_port}),
        "peer_wait": options.probe_timeout + 10,
        "mesh_timeout": options.tcp_timeout,
        "linger": mesh_wait + 10,
    }


def _reserved_ports(node: Node, options: CheckOptions) -> set[int]:
    extra = node.vars.get("fleetctl_ports") or ()
    if isinstance(extra, (int, str)):
        extra = [extra]
    ports = set(options.reserved_ports)
    for p in extra:
        with contextlib.suppress(TypeError, ValueError):
            ports.add(int(p))
    return ports


# ------------------------------------------------------------------------------- node session


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


class _Lines:
    """Tagged lines from a probe stream; untagged output is kept as a diagnostic tail."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.buf = b""
        self.other: list[str] = []
        self.eof = False

    def next(self, kinds: Sequence[str], deadline: float) -> tuple[str, str] | None:
        while True:
            while b"\n" in self.buf:
                raw, self.buf = self.buf.split(b"\n", 1)
                line = raw.decode(errors="replace").rstrip("\r")
                if line.startswith(TAG + " "):
                    kind, _, payload = line[len(TAG) + 1 :].partition(" ")
                    if kind in kinds:
                        return kind, payload
                    if kind == "OLD":
                        return kind, payload
                elif line.strip():
                    self.other = [*self.other[-19:], line]
            if self.eof:
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            chunk = self.stream.recv(min(left, 0.5))
            if chunk == b"":
                self.eof = True
                if self.buf:
                    self.buf += b"\n"
            elif chunk:
                self.buf += chunk

    @property
    def tail(self) -> str:
        return "\n".join(self.other[-5:])


class _Rendezvous:
    """Where node sessions meet: all listeners up (or given up on) → peers; all tested → done."""

    def __init__(self, names: Sequence[str], ready_by: float, mesh_wait: float) -> None:
        self.cond = threading.Condition()
        self.waiting = set(names)
        self.ready: dict[str, tuple[str, int]] = {}
        self.ready_by = ready_by
        self.mesh_wait = mesh_wait
        self.members: dict[str, tuple[str, int]] | None = None
        self.testing: set[str] = set()
        self.done_by = 0.0

    def arrive(self, name: str, listener: tuple[str, int] | None) -> None:
        with self.cond:
            self.waiting.discard(name)
            if listener is not None and self.members is None:
                self.ready[name] = listener
            self.cond.notify_all()

    def peers(self) -> dict[str, tuple[str, int]]:
        """The frozen mesh membership, once every session arrived or the deadline passed."""
        with self.cond:
            while self.waiting and self.members is None:
                left = self.ready_by - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            if self.members is None:
                self.members = dict(self.ready)
                self.testing = set(self.members)
                self.done_by = time.monotonic() + self.mesh_wait
                self.cond.notify_all()
            return self.members

    def tested(self, name: str) -> None:
        with self.cond:
            self.testing.discard(name)
            self.cond.notify_all()

    def wait_all_tested(self) -> None:
        with self.cond:
            while self.testing:
                left = self.done_by - time.monotonic()
                if left <= 0:
                    return
                self.cond.wait(left)


def _session(
    node: Node,
    conn: Connection,
    command: str,
    rv: _Rendezvous | None,
    probe_timeout: float,
) -> ProbeOutcome:
    """One node: start the probe, read its facts, join the mesh, always close the stream."""
    out = ProbeOutcome()
    arrived = rv is None
    in_mesh = False
    stream = conn.start(command)
    lines = _Lines(stream)
    try:
        got = lines.next(["FACTS"], time.monotonic() + probe_timeout)
        if got is None or got[0] == "OLD":
            if got is not None:
                out.old_python = got[1]
            elif not lines.eof:
                out.error = f"probe gave no answer within {probe_timeout:g}s"
            return out
        out.received_at = time.time()
        try:
            out.facts = json.loads(got[1])
        except ValueError:
            out.error = "probe printed unreadable facts"
            return out
        if rv is None:
            return out
        got = lines.next(["READY", "NOREADY"], time.monotonic() + 10)
        if got is None or got[0] != "READY":
            out.noready = got[1] if got else "probe ended before its mesh listener was up"
            return out
        addr = (out.facts.get("nic") or {}).get("addr")
        out.listener = (str(addr), int(got[1]))
        rv.arrive(node.name, out.listener)
        arrived = True
        members = rv.peers()
        if node.name not in members:
            out.mesh_error = "listener came up after the mesh started"
            return out
        in_mesh = True
        peers = [
            {"name": n, "addr": a, "port": p} for n, (a, p) in members.items() if n != node.name
        ]
        try:
            stream.send((json.dumps({"peers": peers}) + "\n").encode())
        except OSError:
            out.mesh_error = "probe ended before the mesh test"
            return out
        got = lines.next(["MESH"], rv.done_by)
        if got is None:
            out.mesh_error = "no mesh result in time"
        else:
            try:
                out.mesh = json.loads(got[1])
            except ValueError:
                out.mesh, out.mesh_error = None, "unreadable mesh result"
            else:
                if "error" in out.mesh:
                    out.mesh_error = out.mesh["error"]
        rv.tested(node.name)
        rv.wait_all_tested()
        return out
    finally:
        if not arrived and rv is not None:
            rv.arrive(node.name, None)
        if in_mesh and rv is not None:
            rv.tested(node.name)
        stream.close_stdin()
        code = stream.exit_code(3.0)
        if out.facts is None:
            # Drain what is left so the error can show it.
            with contextlib.suppress(Exception):
                lines.next(["__END__"], time.monotonic() + (1.0 if code is not None else 0.2))
        out.exit_code = code
        out.tail = lines.tail
        if out.facts is None and out.error is None and out.old_python is None:
            out.error = f"probe exited {code}" if code is not None else "probe did not answer"
        stream.close()


# ----------------------------------------------------------------------------- controller ping


@dataclass(frozen=True)
class PingResult:
    """Controller → host reachability: ``state`` ok / noreply / unresolved / skip."""

    state: str
    detail: str


def ping_host(node: Node, settings: SSHSettings, timeout: float = 1.0) -> PingResult:
    """ICMP from this machine; where ICMP is not allowed, a TCP connect to the SSH port."""
    if node.local:
        return PingResult("skip", "local")
    from fleetctl.ssh import sshconfig

    target = sshconfig.resolve(node, settings)  # the connection's own answer, ssh_config aliases
    host, port = target.hostname, target.port
    if target.proxied:
        return PingResult("skip", "behind a jump host")
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        return PingResult("unresolved", f"cannot resolve {host}: {getattr(e, 'strerror', e)}")
    ip = infos[0][4][0]
    try:
        proc = subprocess.run(
            ["ping", "-n", "-c1", f"-W{max(1, int(timeout))}", ip],
            capture_output=True,
            timeout=timeout + 3,
            stdin=subprocess.DEVNULL,
        )
        code, text = proc.returncode, (proc.stdout + proc.stderr).decode(errors="replace")
    except FileNotFoundError:
        code, text = -1, "no ping"
    except subprocess.TimeoutExpired:
        code, text = 1, ""
    if code == 0:
        m = re.search(r"time[=<]([\d.]+) ?ms", text)
        return PingResult("ok", f"{m.group(1)} ms" if m else "ok")
    low = text.lower()
    if code == -1 or "not permitted" in low or "permission denied" in low or "socket:" in low:
        why = "no ping command" if code == -1 else "ICMP not permitted here"
        return _tcp_ping(ip, port, why)
    if code == 1:
        return PingResult("noreply", f"no reply to ping {ip}")
    last = text.strip().splitlines()[-1:] or [f"ping exited {code}"]
    return PingResult("noreply", last[0])


def _tcp_ping(ip: str, port: int, why: str) -> PingResult:
    try:
        with socket.create_connection((ip, port), timeout=2.0):
            pass
    except ConnectionRefusedError:
        return PingResult("ok", f"TCP {port} refused, host up ({why})")
    except OSError as e:
        return PingResult("noreply", f"TCP {port}: {e.strerror or 'timed out'} ({why})")
    return PingResult("ok", f"TCP {port} ok ({why})")


# ------------------------------------------------------------------------------------ judging


def build_report(
    nodes: Sequence[Node],
    options: CheckOptions,
    *,
    connect_errors: Mapping[str, BaseException],
    outcomes: Mapping[str, ProbeOutcome | BaseException],
    pings: Mapping[str, PingResult],
    mesh_ran: bool,
    controller_time: float | None = None,
) -> CheckReport:
    """Judge raw probe outcomes into the host × check table. Pure: unit-tested without SSH."""
    rows: dict[str, HostReport] = {}
    facts_by: dict[str, dict[str, Any]] = {}
    offsets: dict[str, float] = {}  # node clock minus this machine's, when both are known
    report = CheckReport(hosts=rows, checked_at=controller_time or time.time())
    master = nodes[0].name if nodes else None
    for node in nodes:
        row = HostReport(node.name, node.label, {k: CheckResult(SKIP) for k in CHECKS})
        rows[node.name] = row
        c = row.checks
        ping = pings.get(node.name)
        err = connect_errors.get(node.name)
        if err is not None:
            c["ssh"] = CheckResult(FAIL, _connect_reason(err))
        else:
            c["ssh"] = CheckResult(OK, "ok" if not node.local else "local")
        c["ping"] = _judge_ping(ping, ssh_ok=err is None)
        if err is not None:
            c["mesh"] = CheckResult(SKIP, "no SSH")
            continue
        out = outcomes.get(node.name)
        if isinstance(out, ConnectError):  # connected, but no channel (or the link dropped)
            c["ssh"] = CheckResult(FAIL, _connect_reason(out))
            c["mesh"] = CheckResult(SKIP, "no SSH")
            continue
        if isinstance(out, BaseException):
            msg = (
                out.one_line() if isinstance(out, FleetctlError) else f"{type(out).__name__}: {out}"
            )
            c["python"] = CheckResult(FAIL, f"probe failed: {_clip(msg)}")
            continue
        if out is None:
            c["python"] = CheckResult(FAIL, "probe did not run")
            continue
        if out.facts is None:
            c["python"] = CheckResult(FAIL, _probe_failure(node, out))
            continue
        f = out.facts
        facts_by[node.name] = f
        report.homes[node.name] = str(f.get("home") or "")
        if "code_present" in f:
            report.code_present[node.name] = bool(f["code_present"])
        c["python"] = _judge_python(f)
        c["rsync"] = _judge_rsync(f)
        c["nic"] = _judge_nic(f)
        c["addr"] = _judge_addr(node, f, c["nic"], len(nodes), options)
        c["gpu"] = _judge_gpu(node, f, options)
        c["port"] = _judge_ports(node, f, is_master=node.name == master, options=options)
        c["disk"] = _judge_disk(f, options)
        c["env"] = _judge_env(f, options)
        if options.env_dir and f.get("env") is not None:
            report.env_present[node.name] = bool(f["env"].get("present"))
            report.nccl_versions[node.name] = f["env"].get("nccl")
        c["clock"] = _judge_clock(f, out.received_at, options)
        if out.received_at is not None and f.get("time") is not None:
            offsets[node.name] = float(f["time"]) - out.received_at
        report.facts[node.name] = _node_facts(f)
    spread = fleet_clock_spread(offsets, options.max_clock_skew)
    if spread:
        report.warnings.append(spread)
    _judge_fleet_gpus(rows, facts_by, options)
    _judge_fleet_nccl(rows, report.nccl_versions, options)
    _judge_mtu(rows, facts_by, report.warnings)
    if mesh_ran:
        _judge_mesh(report, nodes, outcomes)
    elif options.mesh and len(nodes) > 1:
        for row in rows.values():
            if row.checks["mesh"].status == SKIP and row.checks["ssh"].status == OK:
                row.checks["mesh"] = CheckResult(SKIP, "mesh not run")
    elif len(nodes) == 1:
        only = rows[nodes[0].name].checks
        if only["ssh"].status == OK and not only["mesh"].detail:
            only["mesh"] = CheckResult(SKIP, "single host")
    _route_warnings(report, nodes, outcomes)
    for row in rows.values():
        for k, cell in row.checks.items():
            if cell.status == WARN:
                report.warnings.append(f"{row.name}: {k}: {cell.detail}")
    return report


def _clip(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _connect_reason(err: BaseException) -> str:
    if isinstance(err, ConnectError):
        return err.reason + (f" ({err.hint})" if err.hint else "")
    if isinstance(err, FleetctlError):
        return err.one_line()
    return f"{type(err).__name__}: {err}"


def _judge_ping(ping: PingResult | None, *, ssh_ok: bool) -> CheckResult:
    if ping is None:
        return CheckResult(SKIP, "not run")
    if ping.state == "ok":
        return CheckResult(OK, ping.detail)
    if ping.state in ("skip", "unresolved"):
        return CheckResult(SKIP, ping.detail)
    # SSH works, so the host is up: a silent ping is a filtered ICMP, not a dead host.
    if ssh_ok:
        return CheckResult(WARN, f"{ping.detail} (SSH works: ICMP filtered?)")
    return CheckResult(FAIL, ping.detail)


def _probe_failure(node: Node, out: ProbeOutcome) -> str:
    if out.old_python:
        return f"{node.python} is Python {out.old_python}; need ≥ 3.7"
    tail = out.tail.strip().splitlines()
    last = tail[-1] if tail else ""
    if out.exit_code == 127 or "command not found" in last or "No such file" in last:
        return f"{node.python} not found on the host" + (f": {_clip(last)}" if last else "")
    reason = out.error or f"probe exited {out.exit_code}"
    return f"{reason}" + (f": {_clip(last)}" if last else "")


def _judge_python(f: Mapping[str, Any]) -> CheckResult:
    py = f.get("python") or {}
    return CheckResult(OK, f"{py.get('version', '?')}")


def _judge_rsync(f: Mapping[str, Any]) -> CheckResult:
    r = f.get("rsync") or {}
    if not r.get("present"):
        why = r.get("error") or "rsync not found on PATH"
        return CheckResult(FAIL, f"{why} (push needs it)")
    return CheckResult(OK, str(r.get("version") or "present"))


def _judge_nic(f: Mapping[str, Any]) -> CheckResult:
    nic = f.get("nic") or {}
    if not nic.get("ok"):
        return CheckResult(FAIL, nic.get("error") or "no training NIC")
    bits = [str(nic.get("name")), str(nic.get("addr"))]
    if nic.get("mtu"):
        bits.append(f"mtu {nic['mtu']}")
    if nic.get("speed_mbps"):
        bits.append(_speed(int(nic["speed_mbps"])))
    return CheckResult(OK, " ".join(bits))


def _speed(mbps: int) -> str:
    return f"{mbps // 1000} Gb/s" if mbps >= 1000 and mbps % 1000 == 0 else f"{mbps} Mb/s"


def _judge_addr(
    node: Node, f: Mapping[str, Any], nic: CheckResult, n_nodes: int, options: CheckOptions
) -> CheckResult:
    addr = (f.get("nic") or {}).get("addr")
    if nic.status == FAIL or not addr:
        return CheckResult(SKIP, "no training NIC")
    if _is_loopback(addr) and n_nodes > 1 and not options.allow_loopback:
        return CheckResult(FAIL, f"announced address {addr} is loopback")
    if node.train_addr and node.train_addr != addr:
        return CheckResult(FAIL, f"announces {addr}, the plan uses fleetctl_addr {node.train_addr}")
    return CheckResult(OK, addr)


def _is_loopback(addr: str) -> bool:
    return addr.startswith("127.") or addr in ("::1", "localhost")


def _judge_gpu(node: Node, f: Mapping[str, Any], options: CheckOptions) -> CheckResult:
    g = f.get("gpu") or {}
    declared = node.gpus
    if not g.get("present"):
        if declared:
            return CheckResult(FAIL, f"fleetctl_gpus={declared} but no nvidia-smi on the host")
        if options.backend == "nccl":
            return CheckResult(FAIL, "no nvidia-smi (CPU node) but backend is nccl")
        return CheckResult(OK, "none (CPU node)")
    if g.get("error"):
        return CheckResult(FAIL, _clip(str(g["error"])))
    gpus = g.get("gpus") or []
    count = len(gpus)
    names = Counter(str(x.get("name")) for x in gpus)
    what = ", ".join(f"{n}× {name}" for name, n in names.items()) or "0"
    if declared is not None and declared != count:
        return CheckResult(FAIL, f"fleetctl_gpus={declared} but nvidia-smi shows {count} ({what})")
    if count == 0 and options.backend == "nccl":
        return CheckResult(FAIL, "nvidia-smi shows no GPU but backend is nccl")
    return CheckResult(OK, what)


def _gpu_count(f: Mapping[str, Any]) -> int | None:
    g = f.get("gpu") or {}
    if not g.get("present"):
        return 0
    if g.get("error"):
        return None
    return len(g.get("gpus") or [])


def _judge_fleet_gpus(
    rows: Mapping[str, HostReport], facts: Mapping[str, Mapping[str, Any]], options: CheckOptions
) -> None:
    if not options.uniform_gpus:
        return
    counts = {h: c for h, f in facts.items() if (c := _gpu_count(f)) is not None}
    if len(set(counts.values())) <= 1:
        return
    tally = Counter(counts.values())
    first = next(iter(counts.values()))
    normal = first if tally[first] == max(tally.values()) else tally.most_common(1)[0][0]
    for host, count in counts.items():
        if count != normal and rows[host].checks["gpu"].status != FAIL:
            rows[host].checks["gpu"] = CheckResult(
                FAIL,
                f"{count} GPU(s) while the others have {normal}; the launcher runs the "
                "same number of processes on every node",
            )


def _judge_ports(
    node: Node, f: Mapping[str, Any], *, is_master: bool, options: CheckOptions
) -> CheckResult:
    ports: Mapping[str, str | None] = f.get("ports") or {}
    if not ports:
        return CheckResult(SKIP, "none reserved")
    busy = [f"{p} {why}" for p, why in sorted(ports.items(), key=lambda x: int(x[0])) if why]
    if busy:
        role = "master port " if is_master and str(options.master_port) in ports else ""
        return CheckResult(FAIL, f"{role}{', '.join(busy)}")
    return CheckResult(OK, ", ".join(sorted(ports, key=int)) + " free")


def _judge_disk(f: Mapping[str, Any], options: CheckOptions) -> CheckResult:
    d = f.get("disk") or {}
    if d.get("error"):
        return CheckResult(FAIL, f"cannot stat {d.get('checked')}: {d['error']}")
    free = int(d.get("free") or 0)
    need = options.min_free_bytes
    env = f.get("env") or {}
    if options.env_archive_bytes and not env.get("present"):
        need = max(need, 2 * options.env_archive_bytes)
    where = d.get("path")
    if not d.get("writable", True):
        return CheckResult(FAIL, f"{d.get('checked')} is not writable (workdir {where})")
    if free < need:
        return CheckResult(FAIL, f"{_size(free)} free in {where}, need {_size(need)}")
    return CheckResult(OK, f"{_size(free)} free")


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _judge_env(f: Mapping[str, Any], options: CheckOptions) -> CheckResult:
    if not options.env_dir:
        return CheckResult(SKIP, "no env")
    env = f.get("env") or {}
    if not env.get("present"):
        return CheckResult(SKIP, "not pushed yet")
    if env.get("error"):
        return CheckResult(FAIL, _clip(str(env["error"])))
    bad = {m: v for m, v in (env.get("imports") or {}).items() if str(v).startswith("error")}
    if bad:
        return CheckResult(FAIL, "; ".join(f"import {m}: {v[7:]}" for m, v in bad.items()))
    nccl = env.get("nccl")
    if not nccl and options.backend == "nccl":
        return CheckResult(FAIL, "no libnccl.so.2 in the env but backend is nccl")
    return CheckResult(OK, f"python {env.get('python')}" + (f", NCCL {nccl}" if nccl else ""))


def _judge_fleet_nccl(
    rows: Mapping[str, HostReport], versions: Mapping[str, str | None], options: CheckOptions
) -> None:
    known = {h: v for h, v in versions.items() if v}
    if len(set(known.values())) <= 1:
        return
    normal = Counter(known.values()).most_common(1)[0][0]
    for host, v in known.items():
        if v != normal:
            rows[host].checks["env"] = CheckResult(FAIL, f"NCCL {v} while the others have {normal}")


def _judge_clock(
    f: Mapping[str, Any], received_at: float | None, options: CheckOptions
) -> CheckResult:
    if received_at is None or f.get("time") is None:
        return CheckResult(SKIP, "unknown")
    skew = float(f["time"]) - received_at
    text = f"{abs(skew):.1f} s {'ahead of' if skew > 0 else 'behind'} this machine"
    if abs(skew) > options.max_clock_skew:
        return CheckResult(WARN, text + " (timestamps in merged logs will lie)")
    return CheckResult(OK, f"{skew:+.2f} s")


def fleet_clock_spread(offsets: Mapping[str, float], limit: float) -> str | None:
    """Node-to-node skew: two nodes each within ``limit`` of this machine can still be up to
    twice that apart, and it is their merged logs that must line up. None when within."""
    if len(offsets) < 2:
        return None
    early = min(offsets, key=lambda h: offsets[h])
    late = max(offsets, key=lambda h: offsets[h])
    gap = offsets[late] - offsets[early]
    if gap <= limit:
        return None
    return (
        f"node clocks differ by {gap:.1f} s: {late} ({offsets[late]:+.1f} s) vs {early} "
        f"({offsets[early]:+.1f} s) against this machine; timestamps in merged logs will lie"
    )


def _judge_mtu(
    rows: Mapping[str, HostReport], facts: Mapping[str, Mapping[str, Any]], warnings: list[str]
) -> None:
    mtus = {
        h: int(f["nic"]["mtu"])
        for h, f in facts.items()
        if (f.get("nic") or {}).get("ok") and (f.get("nic") or {}).get("mtu")
    }
    if len(set(mtus.values())) <= 1:
        return
    normal = Counter(mtus.values()).most_common(1)[0][0]
    listing = ", ".join(f"{h} {m}" for h, m in mtus.items())
    warnings.append(f"training NIC MTUs differ ({listing})")
    for host, mtu in mtus.items():
        cell = rows[host].checks["nic"]
        if mtu != normal and cell.status == OK:
            rows[host].checks["nic"] = CheckResult(WARN, f"{cell.detail} (others use mtu {normal})")


def _node_facts(f: Mapping[str, Any]) -> NodeFacts:
    from fleetctl.plan.rankplan import NodeFacts

    nic = f.get("nic") or {}
    g = f.get("gpu") or {}
    gpus = g.get("gpus") or []
    return NodeFacts(
        train_addr=nic.get("addr") if nic.get("ok") else None,
        nic=nic.get("name") if nic.get("ok") else None,
        gpu_count=_gpu_count(f),
        gpu_names=tuple(str(x.get("name")) for x in gpus),
    )


def _judge_mesh(
    report: CheckReport, nodes: Sequence[Node], outcomes: Mapping[str, ProbeOutcome | BaseException]
) -> None:
    """Directed pair failures, then blame: a host failing with every peer is the culprit."""
    rows = report.hosts
    members: dict[str, ProbeOutcome] = {}
    for node in nodes:
        row = rows[node.name]
        out = outcomes.get(node.name)
        if row.checks["ssh"].status != OK:
            report.mesh_skipped.append(f"{node.name}: no SSH")
            continue
        if not isinstance(out, ProbeOutcome) or out.facts is None:
            report.mesh_skipped.append(f"{node.name}: probe failed")
            row.checks["mesh"] = CheckResult(SKIP, "probe failed")
            continue
        if out.listener is None:
            nic_failed = row.checks["nic"].status == FAIL
            reason = out.noready or out.mesh_error or "no listener"
            report.mesh_skipped.append(f"{node.name}: {reason}")
            row.checks["mesh"] = (
                CheckResult(SKIP, "no training NIC") if nic_failed else CheckResult(FAIL, reason)
            )
            continue
        members[node.name] = out
        report.mesh_ports[node.name] = out.listener[1]
    if len(members) < 2:
        for name in members:
            rows[name].checks["mesh"] = CheckResult(SKIP, "no peer to test")
        return
    bad_pairs: dict[frozenset[str], list[MeshFailure]] = {}
    ping_only: list[str] = []
    icmp_na: set[str] = set()
    silent: set[str] = set()
    for src, out in members.items():
        if out.mesh is None or out.mesh_error:
            silent.add(src)
            continue
        results = out.mesh.get("peers") or {}
        for dst, dst_out in members.items():
            if dst == src:
                continue
            res = results.get(dst)
            port = dst_out.listener[1] if dst_out.listener else "?"
            if res is None:
                problems: tuple[str, ...] = ("not tested",)
            else:
                problems = ()
                ping = str(res.get("ping", ""))
                tcp = str(res.get("tcp", ""))
                if ping.startswith("n/a"):
                    icmp_na.add(src)
                elif ping != "ok":
                    problems += (f"ping {ping}",)
                if tcp != "ok":
                    problems += (f"TCP {port} {tcp}",)
                elif problems:
                    ping_only.append(f"{src} → {dst}: {', '.join(problems)} (TCP {port} ok)")
                    continue
            if problems:
                fail = MeshFailure(src, dst, problems)
                report.mesh_failures.append(fail)
                bad_pairs.setdefault(frozenset((src, dst)), []).append(fail)
    for src in silent:
        out = members[src]
        rows[src].checks["mesh"] = CheckResult(FAIL, out.mesh_error or "no mesh result")
    report.warnings.extend(ping_only)
    # Blame: with 3+ hosts, one failing with every other host is the culprit and the others
    # are fine; a failing pair not explained that way blames both ends.
    tested = [n for n in members if n not in silent]
    partners: dict[str, set[str]] = {n: set() for n in tested}
    for pair in bad_pairs:
        a, b = tuple(pair)
        if a in partners and b in partners:
            partners[a].add(b)
            partners[b].add(a)
    blamed = (
        {n for n, p in partners.items() if len(p) == len(tested) - 1 and p}
        if len(tested) > 2
        else {n for n, p in partners.items() if p}
    )
    for n in tested:
        others = partners[n] - blamed
        if n in blamed or others:
            bad_with = sorted(partners[n]) if n in blamed else sorted(others)
            rows[n].checks["mesh"] = CheckResult(
                FAIL, f"cannot talk to {', '.join(bad_with)} over the training network"
            )
        else:
            note = f" (except {', '.join(sorted(partners[n]))})" if partners[n] else ""
            na = " ICMP n/a, TCP only" if n in icmp_na else ""
            rows[n].checks["mesh"] = CheckResult(
                OK, f"{len(tested) - 1 - len(partners[n])}/{len(tested) - 1} peers{na}{note}"
            )


def _route_warnings(
    report: CheckReport, nodes: Sequence[Node], outcomes: Mapping[str, ProbeOutcome | BaseException]
) -> None:
    """Self address: traffic to the master's training address must leave from our own."""
    if not nodes:
        return
    master = nodes[0].name
    for node in nodes[1:]:
        out = outcomes.get(node.name)
        if not isinstance(out, ProbeOutcome) or out.mesh is None or out.listener is None:
            continue
        res = (out.mesh.get("peers") or {}).get(master) or {}
        src = res.get("route_src")
        cell = report.hosts[node.name].checks["addr"]
        if src and src != out.listener[0] and cell.status == OK:
            report.hosts[node.name].checks["addr"] = CheckResult(
                WARN, f"{out.listener[0]}, but traffic to {master} would leave from {src}"
            )


# -------------------------------------------------------------------------------------- cache


def cache_dir(options: CheckOptions) -> Path:
    if options.cache_dir:
        return Path(options.cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "fleetctl" / "check"


def cache_key(nodes: Sequence[Node], settings: SSHSettings, options: CheckOptions) -> str:
    """Digest of everything a check depends on: nodes (with vars), SSH settings, options."""

    def node_data(n: Node) -> dict[str, Any]:
        d = {f.name: getattr(n, f.name) for f in dataclasses.fields(n)}
        return d

    blob = json.dumps(
        {
            "v": CACHE_VERSION,
            "probe": hashlib.sha256(probe_source()).hexdigest(),
            "nodes": [node_data(n) for n in nodes],
            "settings": dataclasses.asdict(settings),
            "options": options.cache_fields(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def load_cached(key: str, options: CheckOptions) -> CheckReport | None:
    if options.recheck or options.cache_ttl <= 0:
        return None
    path = cache_dir(options) / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        age = time.time() - float(data["checked_at"])
        if not 0 <= age <= options.cache_ttl or not data.get("ok"):
            return None
        report = CheckReport.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    report.cached = True
    return report


def save_cached(key: str, report: CheckReport, options: CheckOptions) -> None:
    """Only passing reports are kept: a failure must be re-checked once fixed."""
    if options.cache_ttl <= 0 or not report.ok:
        return
    folder = cache_dir(options)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(report.to_dict(), fh)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        return  # a cache that cannot be written only costs time


# ----------------------------------------------------------------------------------- entry


def check_fleet(fleet: Fleet, options: CheckOptions | None = None) -> CheckReport:
    """Check every host and every pair of hosts; never raises for a failed check.

    Connects the fleet (connections stay open for the next phases), pings from here, runs the
    probe + mesh session on every reachable host in parallel, and judges the outcomes. A passing
    report cached for the same nodes/settings/options within ``cache_ttl`` is returned instead
    (``.cached``) once every host connects again; ``recheck`` skips the cache.
    """
    options = options or CheckOptions()
    nodes = list(fleet.nodes)
    key = cache_key(nodes, fleet.settings, options)
    started = time.monotonic()
    cached = load_cached(key, options)
    # The next phases need the connections anyway; a host that stopped answering since makes
    # the cached verdict stale, so then everything is checked again.
    if cached is not None and fleet.connect().ok:
        cached.prime(fleet)
        return cached
    # Pings run beside the SSH work; never wait for a hung resolver when leaving.
    pool = cf.ThreadPoolExecutor(
        max_workers=min(fleet.fanout, max(1, len(nodes))), thread_name_prefix="ping"
    )
    try:
        ping_futs = {
            n.name: pool.submit(ping_host, n, fleet.settings) for n in nodes if options.ping
        }
        connected = fleet.connect()
        connect_errors = dict(connected.failed)
        for name in connected.cancelled:
            connect_errors[name] = ConnectError(name, "connect did not finish")
        reachable = [n for n in nodes if n.name not in connect_errors]
        outcomes = _run_sessions(fleet, reachable, options) if reachable else {}
        pings = {}
        deadline = time.monotonic() + 10
        for name, fut in ping_futs.items():
            try:
                pings[name] = fut.result(timeout=max(0.0, deadline - time.monotonic()))
            except cf.TimeoutError:
                pings[name] = PingResult("noreply", "ping did not finish in time")
            except Exception as e:  # a broken ping is data, not a crash
                pings[name] = PingResult("noreply", f"ping failed: {e}")
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    mesh_ran = options.mesh and len(reachable) > 1
    report = build_report(
        nodes,
        options,
        connect_errors=connect_errors,
        outcomes=outcomes,
        pings=pings,
        mesh_ran=mesh_ran,
    )
    report.elapsed = time.monotonic() - started
    report.prime(fleet)
    save_cached(key, report, options)
    return report


def _mesh_wait(options: CheckOptions, n: int) -> float:
    batches = max(1, -(-max(n - 1, 1) // 32))
    return 10.0 + batches * (options.tcp_timeout + 3.0)


def _run_sessions(
    fleet: Fleet, nodes: Sequence[Node], options: CheckOptions
) -> dict[str, ProbeOutcome | BaseException]:
    mesh = options.mesh and len(nodes) > 1
    allow_lo = options.allow_loopback or len(fleet.nodes) == 1
    wait = _mesh_wait(options, len(nodes))
    master = fleet.nodes[0].name
    rv = (
        _Rendezvous([n.name for n in nodes], time.monotonic() + options.probe_timeout + 10, wait)
        if mesh
        else None
    )
    commands = {
        n.name: probe_command(
            n.python,
            probe_args(
                n,
                is_master=n.name == master,
                options=options,
                mesh=mesh,
                allow_loopback=allow_lo,
                mesh_wait=wait,
            ),
        )
        for n in nodes
    }

    def work(node: Node, conn: Connection) -> ProbeOutcome:
        try:
            return _session(node, conn, commands[node.name], rv, options.probe_timeout)
        except BaseException:
            if rv is not None:
                rv.arrive(node.name, None)
                rv.tested(node.name)
            raise

    total = options.probe_timeout + 20 + (wait if mesh else 0)
    result = fleet.map(work, timeout=total, nodes=nodes)
    return dict(result.outcomes)
