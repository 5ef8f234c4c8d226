"""Judging: probe facts, controller pings and mesh results -> a :class:`CheckReport`, per
host and fleet-wide (GPU counts, NCCL versions, clocks, MTU, routes). Pure."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetctl.errors import ConnectError, FleetctlError
from fleetctl.phases.check.mesh_judge import judge_mesh, listing, route_warnings
from fleetctl.phases.check.report import (
    CHECKS,
    FAIL,
    OK,
    SKIP,
    WARN,
    CheckOptions,
    CheckReport,
    CheckResult,
    HostReport,
    ProbeOutcome,
)
from fleetctl.transport.loginshell import declared_type

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.phases.check.preflight import PingResult
    from fleetctl.plan.rankplan import NodeFacts


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
        shell = str(f.get("login_shell") or "")
        kind = declared_type(shell)
        if kind and node.shell_type is None:  # fish may run the probe, then garble a program
            c["python"] = CheckResult(
                FAIL,
                f"the login shell {shell} cannot read sh command lines: "
                f"set ansible_shell_type: {kind} for this host",
            )
        c["rsync"] = _judge_rsync(node, f)
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
    listed = {n.name: len(n.gpu_ids) for n in nodes if n.gpu_ids}
    _judge_fleet_gpus(rows, facts_by, options, listed)
    _judge_fleet_nccl(rows, report.nccl_versions, options)
    _judge_mtu(rows, facts_by, report.warnings)
    _judge_shared_workdirs(nodes, facts_by, report)
    if mesh_ran:
        judge_mesh(report, nodes, outcomes)
    elif options.mesh and len(nodes) > 1:
        for row in rows.values():
            if row.checks["mesh"].status == SKIP and row.checks["ssh"].status == OK:
                row.checks["mesh"] = CheckResult(SKIP, "mesh not run")
    elif len(nodes) == 1:
        only = rows[nodes[0].name].checks
        if only["ssh"].status == OK and not only["mesh"].detail:
            only["mesh"] = CheckResult(SKIP, "single host")
    route_warnings(report, nodes, outcomes)
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
    if node.shell_type is None and _csh_or_fish(out.tail):
        return (
            f"{reason}: the login shell cannot read sh command lines (csh or fish?): set "
            "ansible_shell_type: csh (or fish) for this host"
        )
    return f"{reason}" + (f": {_clip(last)}" if last else "")


def _csh_or_fish(tail: str) -> bool:
    """What csh/tcsh and fish say about a POSIX command line they were handed."""
    return any(s in tail for s in ("Unmatched '", 'Unmatched "', "Badly placed ()'s", "fish: "))


def _judge_python(f: Mapping[str, Any]) -> CheckResult:
    py = f.get("python") or {}
    launcher = f.get("launcher") or {}
    if launcher.get("error"):
        why = f"cannot import {launcher.get('module')}: {launcher['error']}"
        return CheckResult(FAIL, _clip(why))
    script = f.get("script_module") or {}
    if script.get("error"):  # neither in the pushed code nor installed
        why = (
            f"-m {script.get('module')}: not in the pushed code, and this python cannot find "
            f"it installed ({script['error']})"
        )
        return CheckResult(FAIL, _clip(why))
    if launcher.get("module"):
        top = str(launcher["module"]).split(".")[0]
        version = launcher.get("version")
        return CheckResult(OK, f"{py.get('version', '?')}, {top} {version or 'ok'}")
    return CheckResult(OK, f"{py.get('version', '?')}")


def _judge_rsync(node: Node, f: Mapping[str, Any]) -> CheckResult:
    r = f.get("rsync") or {}
    if not r.get("present") and node.local:  # the embedded node: push copies, no rsync
        return CheckResult(OK, "not needed (local node: push copies the files)")
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
    if node.gpu_ids:
        have = {str(x.get("index")) for x in gpus} | {str(x.get("uuid")) for x in gpus}
        missing = [i for i in node.gpu_ids if i not in have]
        if missing:
            shown = ",".join(str(x.get("index")) for x in gpus) or "none"
            return CheckResult(
                FAIL, f"fleetctl_gpus lists {','.join(missing)} but nvidia-smi shows {shown}"
            )
    elif declared is not None and declared != count:
        return CheckResult(FAIL, f"fleetctl_gpus={declared} but nvidia-smi shows {count} ({what})")
    if count == 0 and options.backend == "nccl":
        return CheckResult(FAIL, "nvidia-smi shows no GPU but backend is nccl")
    busy = busy_gpus(node, g)
    if busy:
        why = "busy: " + "; ".join(busy)
        if options.allow_busy_gpus:
            return CheckResult(WARN, why + " (--allow-busy-gpus)")
        return CheckResult(FAIL, _clip(why + " (another job's? --allow-busy-gpus to run anyway)"))
    return CheckResult(OK, what)


BUSY_MIB = 256  # memory in use on an idle GPU is a few MiB; more is someone's context


def busy_gpus(node: Node, g: Mapping[str, Any]) -> list[str]:
    """The GPUs this node's job would use that already have compute processes or memory in
    use, in words (``GPU 1: pid 4242 (2048 MiB)``). GPUs outside ``fleetctl_gpus`` don't count."""
    gpus = g.get("gpus") or []
    wanted = set(node.gpu_ids)
    apps = g.get("apps") or []
    out = []
    for x in gpus:
        index, uuid = str(x.get("index")), str(x.get("uuid") or "")
        if wanted and index not in wanted and uuid not in wanted:
            continue
        mine = [a for a in apps if uuid and a.get("gpu_uuid") == uuid]
        if mine:
            procs = ", ".join(f"pid {a.get('pid')} ({a.get('used_mib', 0)} MiB)" for a in mine)
            out.append(f"GPU {index}: {procs}")
        elif (x.get("used_mib") or 0) > BUSY_MIB:
            out.append(f"GPU {index}: {x['used_mib']} MiB in use")
    return out


def _gpu_count(f: Mapping[str, Any]) -> int | None:
    g = f.get("gpu") or {}
    if not g.get("present"):
        return 0
    if g.get("error"):
        return None
    return len(g.get("gpus") or [])


def _judge_fleet_gpus(
    rows: Mapping[str, HostReport],
    facts: Mapping[str, Mapping[str, Any]],
    options: CheckOptions,
    listed: Mapping[str, int] | None = None,
) -> None:
    """``listed``: hosts whose job uses the GPUs of its ``fleetctl_gpus`` list, not all."""
    if not options.uniform_gpus:
        return
    listed = listed or {}
    counts = {h: c for h, f in facts.items() if (c := listed.get(h, _gpu_count(f))) is not None}
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
        role = "master port " if is_master and str(options.rdzv_port) in ports else ""
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


def _judge_shared_workdirs(
    nodes: Sequence[Node], facts: Mapping[str, Mapping[str, Any]], report: CheckReport
) -> None:
    """Hosts that read one workdir id see one folder (an NFS home). Not a failure: each node
    keeps its own run folder (``runs/<job>/<rank>-<host>``), the code and env caches are
    content-addressed and made once, and the job's work folder is shared as on Slurm."""
    groups: dict[str, list[str]] = {}
    for n in nodes:
        wid = (facts.get(n.name) or {}).get("workdir_id")
        if isinstance(wid, str) and wid:
            groups.setdefault(wid, []).append(n.name)
    for names in groups.values():
        if len(names) < 2:
            continue
        report.shared_workdirs.append(names)
        where = (facts.get(names[0]) or {}).get("workdir") or "the workdir"
        report.warnings.append(
            f"{listing(names)} share {where} (one filesystem, e.g. an NFS home): each keeps "
            "its own run folder; the code, env and the job's work folder are shared"
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
    launcher = f.get("launcher") or {}
    torch = None
    if str(launcher.get("module") or "").split(".")[0] == "torch" and not launcher.get("error"):
        torch = str(launcher.get("version") or "") or None
    # deepspeed's import brings torch; plain imports nothing: the probe looks it up
    torch = torch or launcher.get("torch") or (f.get("torch") or {}).get("version") or None
    return NodeFacts(
        train_addr=nic.get("addr") if nic.get("ok") else None,
        nic=nic.get("name") if nic.get("ok") else None,
        gpu_count=_gpu_count(f),
        gpu_names=tuple(str(x.get("name")) for x in gpus),
        torch=torch,
    )
