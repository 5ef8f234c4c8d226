"""Judging the mesh: each member's directed pair results -> the mesh cell per host, with the
blame (a host failing with every peer is the culprit), and the self-route warnings. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fleetctl.phases.check.report import (
    FAIL,
    OK,
    SKIP,
    WARN,
    CheckReport,
    CheckResult,
    MeshFailure,
    ProbeOutcome,
)

if TYPE_CHECKING:
    from fleetctl.node import Node


def listing(names: Sequence[str], limit: int = 8) -> str:
    more = len(names) - limit
    return ", ".join(names[:limit]) + (f" and {more} more" if more > 0 else "")


def pair_problems(res: object, port: object) -> tuple[tuple[str, ...], str | None, bool]:
    """One directed pair's result: its failures (TCP not ok, with the ping's), a ping problem
    alone (a warning when TCP got through), and whether ICMP was not available there."""
    if not isinstance(res, dict):
        return ("not tested",), None, False
    ping = str(res.get("ping", ""))
    tcp = str(res.get("tcp", ""))
    na = ping.startswith("n/a")
    ping_problem = None if na or ping in ("ok", "not tried") else f"ping {ping}"
    if tcp == "ok":
        return (), ping_problem, na
    return ((ping_problem,) if ping_problem else ()) + (f"TCP {port} {tcp}",), None, na


def judge_mesh(
    report: CheckReport, nodes: Sequence[Node], outcomes: Mapping[str, ProbeOutcome | BaseException]
) -> None:
    """Directed pair failures, then blame: a host failing with every peer is the culprit. A
    pair that failed the first round and was measured again (``mesh["again"]``, after every
    host finished the first) is judged by the second: one that passes then is a warning, not
    a failure (a loaded host answered late); one that fails twice is blamed."""
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
    paired: dict[str, set[str]] = {n: set() for n in members}  # who tested whom, both ways
    ping_only: list[str] = []
    icmp_na: set[str] = set()
    silent: set[str] = set()
    passed_again: list[str] = []  # failed the first round, passed when measured again
    for src, out in members.items():
        if out.mesh is None or out.mesh_error:
            silent.add(src)
            continue
        results = out.mesh.get("peers") or {}
        again = out.mesh.get("again") or {}  # the second round: pairs that failed the first
        planned = out.mesh_peers if out.mesh_peers is not None else list(members)
        for dst in planned:
            dst_out = members.get(dst)
            if dst == src or dst_out is None:
                continue
            paired[src].add(dst)
            paired[dst].add(src)
            port = dst_out.listener[1] if dst_out.listener else "?"
            problems, ping_problem, na = pair_problems(results.get(dst), port)
            if problems and isinstance(again.get(dst), dict):
                problems, ping_problem, na = pair_problems(again[dst], port)
                if not problems:
                    passed_again.append(f"{src} → {dst}")
                else:
                    problems += ("measured twice",)
            if na:
                icmp_na.add(src)
            if not problems and ping_problem:
                ping_only.append(f"{src} → {dst}: {ping_problem} (TCP {port} ok)")
            if problems:
                fail = MeshFailure(src, dst, problems)
                report.mesh_failures.append(fail)
                bad_pairs.setdefault(frozenset((src, dst)), []).append(fail)
    for src in silent:
        out = members[src]
        rows[src].checks["mesh"] = CheckResult(FAIL, out.mesh_error or "no mesh result")
    report.warnings.extend(ping_only)
    if passed_again:
        report.warnings.append(
            f"{len(passed_again)} pair(s) failed the mesh once and passed when measured again "
            f"(loaded hosts?): {listing(passed_again, 4)}"
        )
    # Blame: with 3+ hosts, one failing with every peer it was paired with (all others in a
    # full mesh) is the culprit and the others are fine; a failing pair not explained that
    # way blames both ends.
    tested = [n for n in members if n not in silent]
    partners: dict[str, set[str]] = {n: set() for n in tested}
    for pair in bad_pairs:
        a, b = tuple(pair)
        if a in partners and b in partners:
            partners[a].add(b)
            partners[b].add(a)
    peers_of = {n: paired[n] & set(tested) for n in tested}
    blamed = (
        {n for n, p in partners.items() if p and p >= peers_of[n] and len(peers_of[n]) > 1}
        if len(tested) > 2
        else {n for n, p in partners.items() if p}
    )
    for n in tested:
        others = partners[n] - blamed
        if n in blamed or others:
            bad_with = sorted(partners[n]) if n in blamed else sorted(others)
            rows[n].checks["mesh"] = CheckResult(
                FAIL, f"cannot talk to {listing(bad_with)} over the training network"
            )
        else:
            note = f" (except {', '.join(sorted(partners[n]))})" if partners[n] else ""
            na = " ICMP n/a, TCP only" if n in icmp_na else ""
            total = len(peers_of[n])
            rows[n].checks["mesh"] = CheckResult(
                OK, f"{total - len(partners[n])}/{total} peers{na}{note}"
            )


def route_warnings(
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
