"""Preflight: find what would kill or hang a distributed job, on every host and every pair.

``check_fleet(fleet, options)`` opens one SSH connection per host (the fleet's, reused by the
later phases of ``fleetctl run``), pings every host from here, and runs ONE streamed remote
command per host: the stdlib probe (``fleetctl/remote/programs/probe.py``), which reports the host's
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

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import json
import re
import shlex
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import ConnectError
from fleetctl.phases.check.cache import load_cached, save_cached
from fleetctl.phases.check.health_gate import apply_health, record_collective
from fleetctl.phases.check.judge import build_report, fleet_clock_spread
from fleetctl.phases.check.mesh import Rendezvous, measure_again, peer_list
from fleetctl.phases.check.mesh_plan import MAX_SLOWDOWN, RANDOM_PEERS, mesh_mode
from fleetctl.phases.check.report import (
    CHECKS,
    CheckOptions,
    CheckReport,
    CheckResult,
    GiB,
    HeldProbe,
    HostReport,
    MeshFailure,
    ProbeOutcome,
    release_probes,
)
from fleetctl.phases.frames import PROBE_KINDS, FrameStream

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.connection import Connection, SSHSettings, Stream

__all__ = [
    "CHECKS",
    "CheckOptions",
    "CheckReport",
    "CheckResult",
    "GiB",
    "HostReport",
    "MeshFailure",
    "PingResult",
    "ProbeOutcome",
    "build_report",
    "cache_key",
    "check_fleet",
    "fleet_clock_spread",
    "load_cached",
    "ping_host",
    "probe_args",
    "probe_command",
    "probe_source",
    "save_cached",
]


CACHE_VERSION = 1
# the version check, then the installer's ARGV entrance (bootstrap.py says why)
BOOTSTRAP = remote.guarded(remote.source("bootstrap.py").decode("utf-8")) + remote.ARGV_HEAD
BOOTSTRAP += remote.INSTALLER


# ------------------------------------------------------------------------------ probe command


def probe_source() -> bytes:
    """The probe's bundle (it and the node modules it imports): its hash keys the cache."""
    return remote.bundle("probe.py")


def _packed_probe() -> str:
    return remote.packed("probe.py")


def probe_command(python: str, args: Mapping[str, Any]) -> str:
    """One shell-quoted command line: ``python -c <bootstrap> <install path> <packed probe>
    <json args>``. The probe runs from its file under the workdir, installed the first time
    (without a workdir in ``args``: from the packed source only)."""
    workdir = args.get("workdir")
    path = remote.installed_path(workdir, "probe.py") if workdir else ""
    argv = [*shlex.split(python or "python3"), remote.NO_SITE, "-c", BOOTSTRAP, path]
    argv += [_packed_probe(), json.dumps(args)]
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
    master = {options.rdzv_port} if is_master and options.check_rdzv_port else set()
    ports = sorted(_reserved_ports(node, options) | master)
    on_host = node.name not in options.container_hosts  # else the image check asks
    return {
        "address": node.address,
        "nic": node.nic,
        "train_addr": node.train_addr,
        "workdir": node.workdir,
        "ports": ports,
        "allow_loopback": allow_loopback,
        "env_dir": options.env_dir,
        "env_imports": list(options.env_imports),
        "launcher_module": options.launcher_module if on_host else None,
        "script_module": options.script_module if on_host else None,
        "torch_version": options.torch_version and on_host,
        "envinfo": remote.inline("envinfo.py") if options.env_dir else None,
        "code_dir": options.code_dir,
        "mesh": mesh,
        "mesh_port": options.rdzv_port + 1,
        "mesh_span": options.mesh_span,
        "avoid_ports": sorted(_reserved_ports(node, options) | {options.rdzv_port}),
        "peer_wait": options.probe_timeout + 10,
        "mesh_timeout": options.tcp_timeout,
        "max_slowdown": MAX_SLOWDOWN,
        "linger": 2 * mesh_wait + 10,  # the second round's request comes after the first
        "hold": options.hold,
        "health": options.health,
        "dcgm": options.dcgm,
        "ib_root": node.vars.get("fleetctl_ib_root"),  # where its IB sysfs is (a lab's fake)
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


def _session(
    node: Node,
    conn: Connection,
    command: str,
    rv: Rendezvous | None,
    probe_timeout: float,
    hold_until: float | None = None,
) -> ProbeOutcome:
    """One node: start the probe, read its facts, join the mesh, close the stream (with
    ``hold_until``: keep it open once the probe passed, as ``out.held``)."""
    out = ProbeOutcome()
    arrived = rv is None
    in_mesh = False
    stream = conn.start(command)
    lines = FrameStream(stream, PROBE_KINDS, json_kinds=PROBE_KINDS)
    try:
        got = lines.next("DV", time.monotonic() + probe_timeout)
        if got is None or got.kind == "V":
            if got is not None:
                out.old_python = str(got.data())
            elif not lines.eof:
                out.error = (
                    f"python probe did not answer in {probe_timeout:g} s; raise --probe-timeout"
                )
            return out
        out.received_at = time.time()
        facts = got.data()
        if not isinstance(facts, dict):
            out.error = "probe printed unreadable facts"
            return out
        out.facts = facts
        if rv is None:
            if hold_until is not None:
                out.held = HeldProbe(stream, node.python, hold_until, facts.get("pid"))
            return out
        got = lines.next("RN", time.monotonic() + 10)
        if got is None or got.kind != "R":
            out.noready = str(got.data()) if got else "probe ended before its mesh listener was up"
            return out
        addr = (out.facts.get("nic") or {}).get("addr")
        out.listener = (str(addr), int(got.data()))
        rv.arrive(node.name, out.listener, (out.facts.get("nic") or {}).get("up") is not False)
        arrived = True
        members = rv.peers()
        if node.name not in members:
            out.mesh_error = "listener came up after the mesh started"
            return out
        in_mesh = True
        out.mesh_peers = list(rv.plan.get(node.name, []))
        peers = peer_list(out.mesh_peers, members, rv.no_link)
        try:
            stream.send((json.dumps({"peers": peers}) + "\n").encode())
        except OSError:
            out.mesh_error = "probe ended before the mesh test"
            return out
        got = lines.next("M", rv.done_by)
        if got is None:
            out.mesh_error = "no mesh result in time"
        else:
            mesh = got.data()
            if not isinstance(mesh, dict):
                out.mesh, out.mesh_error = None, "unreadable mesh result"
            else:
                out.mesh = mesh
                if "error" in out.mesh:
                    out.mesh_error = out.mesh["error"]
        rv.tested(node.name)
        rv.wait_all_tested()
        if out.mesh is not None:
            measure_again(stream, lines, out, members, rv, node.name)
        rv.measured_again(node.name)
        rv.wait_all_measured_again()
        if hold_until is not None and out.mesh is not None:
            with contextlib.suppress(OSError):
                stream.send(b"\n")  # the mesh is over: the probe closes its listener and waits
                out.held = HeldProbe(stream, node.python, hold_until, facts.get("pid"))
        return out
    finally:
        if not arrived and rv is not None:
            rv.arrive(node.name, None)
        if in_mesh and rv is not None:
            rv.tested(node.name)
            rv.measured_again(node.name)
        if out.held is None:
            _close_probe(stream, lines, out)


def _close_probe(stream: Stream, lines: FrameStream, out: ProbeOutcome) -> None:
    """EOF to the probe, its exit code and, when it gave no facts, what it printed."""
    stream.close_stdin()
    code = stream.exit_code(3.0)
    if out.facts is None:
        # Drain what is left so the error can show it.
        with contextlib.suppress(Exception):
            lines.next((), time.monotonic() + (1.0 if code is not None else 0.2))
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
    """ICMP from this machine; where ICMP is not allowed, a TCP connect to the SSH port.
    Where to, or whether at all, the node's transport says (``Connection.ping_target``)."""
    from fleetctl.transport.connection import transport

    target = transport(node).ping_target(node, settings)
    if target.skip:
        return PingResult("skip", target.skip)
    host, port = target.host, target.port
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as e:
        return PingResult("unresolved", f"cannot resolve {host}: {getattr(e, 'strerror', e)}")
    ip = infos[0][4][0]
    if infos[0][0] == socket.AF_INET:
        got = _icmp_echo(ip, timeout)
        if isinstance(got, float):
            return PingResult("ok", f"{got * 1000:.3f} ms")
        if got == "timeout":
            return PingResult("noreply", f"no reply to ping {ip}")
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


def _icmp_echo(ip: str, timeout: float) -> float | str | None:
    """One echo from this process (the probe's own, ``fleetctl.remote.kit.icmp.icmp_echo``):
    the round trip in seconds, ``"timeout"``, or None where ICMP sockets are not allowed here (or
    fail otherwise): then the ``ping`` binary decides, as before."""
    from fleetctl.remote.kit import icmp

    start = time.monotonic()
    got = icmp.icmp_echo("", ip, timeout)
    if got == "ok":
        return time.monotonic() - start
    return "timeout" if got == "timeout" else None


def _tcp_ping(ip: str, port: int, why: str) -> PingResult:
    try:
        with socket.create_connection((ip, port), timeout=2.0):
            pass
    except ConnectionRefusedError:
        return PingResult("ok", f"TCP {port} refused, host up ({why})")
    except OSError as e:
        return PingResult("noreply", f"TCP {port}: {e.strerror or 'timed out'} ({why})")
    return PingResult("ok", f"TCP {port} ok ({why})")


# -------------------------------------------------------------------------------------- cache


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


# ----------------------------------------------------------------------------------- entry


def check_fleet(fleet: FanOut, options: CheckOptions | None = None) -> CheckReport:
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
    # a benchmark's figures are wanted now, not a minute ago
    cached = load_cached(key, options) if options.collective is None else None
    # The next phases need the connections anyway; a host that stopped answering since makes
    # the cached verdict stale, so then everything is checked again.
    if cached is not None and fleet.connect().ok:
        cached.prime(fleet)
        return cached
    # Pings run beside the SSH work; never wait for a hung resolver when leaving.
    pool = cf.ThreadPoolExecutor(
        max_workers=min(fleet.fanout, max(1, len(nodes))), thread_name_prefix="ping"
    )
    ahead = None
    try:
        ping_futs = {
            n.name: pool.submit(ping_host, n, fleet.settings) for n in nodes if options.ping
        }
        connected = fleet.connect()
        connect_errors = dict(connected.failed)
        for name in connected.cancelled:
            connect_errors[name] = ConnectError(name, "connect did not finish")
        reachable = [n for n in nodes if n.name not in connect_errors]
        ahead = _start_collective(fleet, reachable, options)
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
    except BaseException:
        if ahead is not None:
            ahead.close()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    held = {k: o.held for k, o in outcomes.items() if isinstance(o, ProbeOutcome) and o.held}
    try:
        report = build_report(
            nodes,
            options,
            connect_errors=connect_errors,
            outcomes=outcomes,
            pings=pings,
            mesh_ran=options.mesh and len(reachable) > 1,
        )
        if options.health:
            apply_health(report, nodes, outcomes)
    except BaseException:
        release_probes(held.values())
        if ahead is not None:
            ahead.close()
        raise
    report.held = held
    if options.collective is not None:
        try:
            report.collective = _collective(fleet, nodes, report, options, ahead)
            if options.health:
                record_collective(report)
        except BaseException:
            report.release()
            raise
        finally:
            if ahead is not None:
                ahead.close()
    if not report.ok:  # nothing to launch: the probes may go
        report.release()
    report.elapsed = time.monotonic() - started
    report.prime(fleet)
    save_cached(key, report, options)
    return report


def _start_collective(fleet: FanOut, nodes: Sequence[Node], options: CheckOptions) -> Any:
    """``--collective``: the node programs started now, so torch imports while the check runs
    (the slow part on small nodes); None without it."""
    if options.collective is None or len(nodes) < 2:
        return None
    from fleetctl.phases.check.collective import start_programs

    mesh = options.mesh and len(nodes) > 1
    wait = options.probe_timeout + 20 + (2 * _mesh_wait(options, len(nodes)) if mesh else 0)
    return start_programs(fleet, nodes, wait)


def _collective(
    fleet: FanOut,
    nodes: Sequence[Node],
    report: CheckReport,
    options: CheckOptions,
    started: Any = None,
) -> Any:
    """``--collective`` over the hosts that passed (a failed host is named already; spares
    need the rest measured), when two or more did."""
    from fleetctl.phases.check.collective import run_collective
    from fleetctl.phases.check.collective_judge import CollectiveReport

    bad = set(report.failed_hosts)
    good = [n for n in nodes if n.name not in bad]
    # a cut link already failed the check, and would only stall the collective
    if len(good) < 2 or options.collective is None or report.mesh_failures:
        return CollectiveReport(order=[n.name for n in good])
    return run_collective(fleet, good, report.facts, options.collective, started)


def _mesh_wait(options: CheckOptions, n: int) -> float:
    """How long a probe's mesh test may take: its batches of 32 peers, then failed pairs once
    more with timeouts up to 2 x MAX_SLOWDOWN longer (a loaded host answers late)."""
    tested = n - 1 if mesh_mode(options.mesh_mode, n) == "full" else RANDOM_PEERS + 2
    batches = max(1, -(-max(tested, 1) // 32))
    retry = 2.0 * MAX_SLOWDOWN * options.tcp_timeout + 3.0
    return 10.0 + batches * (options.tcp_timeout + 3.0 + retry)


def _run_sessions(
    fleet: FanOut, nodes: Sequence[Node], options: CheckOptions
) -> dict[str, ProbeOutcome | BaseException]:
    mesh = options.mesh and len(nodes) > 1
    allow_lo = options.allow_loopback or len(fleet.nodes) == 1
    wait = _mesh_wait(options, len(nodes))
    master = fleet.nodes[0].name
    rv = (
        Rendezvous(
            [n.name for n in nodes],
            time.monotonic() + options.probe_timeout + 10,
            wait,
            options.mesh_mode,
            again=options.mesh_again,
        )
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

    # the launch uses a held probe only within half the time the probe waits for it
    hold_until = time.monotonic() + options.hold / 2 if options.hold > 0 else None

    def work(node: Node, conn: Connection) -> ProbeOutcome:
        try:
            return _session(node, conn, commands[node.name], rv, options.probe_timeout, hold_until)
        except BaseException:
            if rv is not None:
                rv.arrive(node.name, None)
                rv.tested(node.name)
            raise

    total = options.probe_timeout + 20 + (2 * wait if mesh else 0)  # two rounds at most
    # The mesh needs every probe's listener up at once: sessions past --fanout would only
    # start after the first ones gave up waiting for them (at 128 hosts, half the fleet "came
    # up after the mesh started"). Connections were opened --fanout at a time already; each
    # session thread here mostly waits on its stream.
    width = len(nodes) if mesh else fleet.fanout
    result = fleet.map(work, timeout=total, nodes=nodes, width=width)
    return dict(result.outcomes)
