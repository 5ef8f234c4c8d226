"""The check's ``health`` column: each host's GPU and link health (``fleetctl.health.judge``)
judged against its last check's figures, which are then replaced; a failing host is recorded
in the health ledger (source ``gate``), and a host the ledger holds says so (a warning: the
gate judges what it sees now; ``run --nodes N`` is what leaves ledger hosts out)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from fleetctl.errors import HealthLedgerError
from fleetctl.phases.check.report import (
    FAIL,
    OK,
    SKIP,
    WARN,
    CheckReport,
    CheckResult,
    ProbeOutcome,
)

if TYPE_CHECKING:
    from fleetctl.node import Node


def apply_health(
    report: CheckReport,
    nodes: Sequence[Node],
    outcomes: Mapping[str, ProbeOutcome | BaseException],
    job_id: str | None = None,
) -> None:
    """Fill every row's ``health`` cell; record the hosts that fail it."""
    from fleetctl.health.judge import judge_health
    from fleetctl.health.ledger import Ledger, load_last, save_last

    ledger = Ledger()
    try:
        held = ledger.status()
    except HealthLedgerError as e:
        report.warnings.append(f"health ledger not read: {e}")
        held = {}
    for node in nodes:
        row = report.hosts.get(node.name)
        if row is None:
            continue
        out = outcomes.get(node.name)
        facts = out.facts if isinstance(out, ProbeOutcome) else None
        health = (facts or {}).get("health")
        status = held.get(node.name)
        if not isinstance(health, dict):
            if status is not None:
                row.checks["health"] = CheckResult(WARN, f"in the health ledger: {status.why()}")
            else:
                row.checks["health"] = CheckResult(SKIP, "no health figures")
            continue
        verdict = judge_health(health, load_last(node.name))
        try:
            save_last(node.name, verdict.baseline)
            if verdict.failed:
                first = verdict.failed[0]
                ledger.record(
                    node.name,
                    source="gate",
                    reason=f"{first.where}: {first.cause.split(';')[0]}",
                    evidence="; ".join(f.line() for f in verdict.failed),
                    job_id=job_id,
                )
        except HealthLedgerError as e:
            report.warnings.append(f"{node.name}: health ledger not written: {e}")
        if verdict.failed:
            more = len(verdict.failed) - 1
            extra = f" (+{more} more: fleetctl health)" if more else ""
            row.checks["health"] = CheckResult(FAIL, verdict.failed[0].line() + extra)
        elif verdict.warnings:
            row.checks["health"] = CheckResult(WARN, "; ".join(f.line() for f in verdict.warnings))
        elif status is not None:
            row.checks["health"] = CheckResult(WARN, f"in the health ledger: {status.why()}")
        else:
            row.checks["health"] = CheckResult(OK, verdict.summary)


def record_collective(report: CheckReport, job_id: str | None = None) -> None:
    """The hosts ``--collective`` named (slow, hung, failing) into the health ledger (source
    ``collective``), so ``run --nodes N`` leaves them out next time too; a ledger that cannot
    be written is a warning, never the check's verdict."""
    from fleetctl.health.ledger import Ledger

    coll = report.collective
    if coll is None or coll.ok:
        return
    ledger = Ledger()
    whys: dict[str, list[str]] = {}
    for host, why in coll.failures:
        whys.setdefault(host, []).append(why)
    for host, reasons in whys.items():
        try:
            ledger.record(
                host,
                source="collective",
                reason=reasons[0].split(" busbw ")[0],
                evidence="; ".join(reasons),
                job_id=job_id,
            )
        except HealthLedgerError as e:
            report.warnings.append(f"{host}: health ledger not written: {e}")
