"""The GPU and link health gate: one host's health figures (``fleetctl.remote.kit.health``) and
its last check's figures -> findings, each naming the GPU or port, the evidence and the cause.
Pure: golden-tested with captured outputs.

Thresholds (docs/health.md says why; Azure's ND-series health checks are the reference):

* XIDs since the last check (since boot on the first check, or after a reboot): the fatal ones
  of ``fleetctl.health.xid`` fail, the rest warn;
* ECC: any volatile uncorrectable error fails (aggregate ones only warn: history), as do
  retired pages or remapped rows pending a reset and a row-remap failure;
* clocks: HW slowdown, HW thermal slowdown and HW power brake fail, SW thermal slowdown warns;
* PCIe: a link narrower than its maximum fails; a lower generation warns, and only on a GPU
  that is not idle (idle GPUs drop their link's generation to save power);
* IB/RoCE: a port not ACTIVE/LinkUp, or slower than the host's fastest port of its link
  layer, fails; ``link_downed`` moving since the last check (a flap) fails, the other error
  counters moving warn;
* DCGM level 1 (with ``dcgmi``): a failed test fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl.health.xid import describe

FAIL, WARN = "fail", "warn"
HW_THROTTLE = {
    "hw_slowdown": "HW slowdown (the board's power or thermal alarm)",
    "hw_thermal_slowdown": "HW thermal slowdown (GPU too hot)",
    "hw_power_brake_slowdown": "HW power brake (the chassis asserted it)",
}
SW_THROTTLE = {"sw_thermal_slowdown": "SW thermal slowdown (above its target temperature)"}
IB_WARN_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "local_link_integrity_errors",
    "port_rcv_errors",
    "excessive_buffer_overrun_errors",
)


@dataclass(frozen=True)
class Finding:
    """One thing wrong: ``where`` (``GPU 3``, ``mlx5_0/1``), the evidence and the cause."""

    severity: str
    where: str
    evidence: str
    cause: str

    def line(self) -> str:
        return f"{self.where}: {self.evidence} — {self.cause}"


@dataclass
class Verdict:
    """The gate's answer for one host, and the figures the next check compares with."""

    findings: list[Finding] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == FAIL]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARN]


def judge_health(health: Mapping[str, Any], last: Mapping[str, Any] | None) -> Verdict:
    """Judge one host's ``health`` facts against ``last`` (its previous check's baseline, or
    None on the first)."""
    last = last or {}
    out = Verdict()
    if health.get("error"):
        out.findings.append(Finding(WARN, "health", str(health["error"]), "a source broke"))
        return out
    gpus = list(health.get("gpus") or [])
    by_pci = {str(g.get("pci_key")): g for g in gpus}
    same_boot = bool(health.get("boot_id")) and health.get("boot_id") == last.get("boot_id")
    out.baseline = {"boot_id": health.get("boot_id"), "ib": {}}
    if health.get("smi_error"):
        out.findings.append(Finding(WARN, "nvidia-smi", str(health["smi_error"]), "no figures"))
    for g in gpus:
        out.findings += _gpu_findings(g)
    kernel = health.get("kernel") or {}
    xids = list(kernel.get("xids") or [])
    since = float(last.get("xid_t") or 0.0) if same_boot else -1.0
    newest = max([since, *(float(x.get("t", 0)) for x in xids)])
    out.baseline["xid_t"] = newest if newest >= 0 else 0.0
    for x in xids:
        if float(x.get("t", 0)) <= since:
            continue
        g = by_pci.get(str(x.get("pci")))
        where = f"GPU {g['index']}" if g is not None else f"GPU at PCI {x.get('pci')}"
        info = describe(int(x.get("xid", 0)))
        evidence = f"XID {x.get('xid')} at {float(x.get('t', 0)):.0f} s after boot: {x.get('text')}"
        out.findings.append(
            Finding(FAIL if info.fatal else WARN, where, evidence, f"{info.meaning}; {info.action}")
        )
    ports = list(health.get("ib") or [])
    out.findings += _ib_findings(ports, (last.get("ib") or {}) if same_boot else {})
    out.baseline["ib"] = {str(p.get("port")): dict(p.get("counters") or {}) for p in ports}
    dcgm = health.get("dcgm") or {}
    if dcgm.get("error"):
        out.findings.append(Finding(WARN, "dcgmi", str(dcgm["error"]), "DCGM diag did not run"))
    for t in dcgm.get("failed") or []:
        where = f"GPU {t['gpu']}" if t.get("gpu") not in (None, "", []) else "DCGM"
        out.findings.append(
            Finding(FAIL, where, f"DCGM diag -r 1 {t.get('test')}: failed", str(t.get("info")))
        )
    n_gpu, n_ib = len(gpus), len(ports)
    kernel_note = "" if kernel.get("source") else ", kernel log not readable"
    out.summary = f"{n_gpu} GPU(s), {n_ib} IB port(s){kernel_note}"
    return out


def _gpu_findings(g: Mapping[str, Any]) -> list[Finding]:
    where = f"GPU {g.get('index')}"
    out: list[Finding] = []
    if g.get("ecc_volatile_unc"):
        out.append(
            Finding(
                FAIL,
                where,
                f"{g['ecc_volatile_unc']} uncorrectable ECC error(s) since the driver loaded",
                "GPU memory is failing; reset the GPU, replace it if it recurs",
            )
        )
    elif g.get("ecc_aggregate_unc"):
        out.append(
            Finding(
                WARN,
                where,
                f"{g['ecc_aggregate_unc']} uncorrectable ECC error(s) in its lifetime",
                "past memory faults; watch for new ones",
            )
        )
    if g.get("remap_failure"):
        out.append(Finding(FAIL, where, "row remapping failed", "replace the GPU"))
    elif g.get("remap_pending") or g.get("retired_pending"):
        what = "remapped rows" if g.get("remap_pending") else "retired pages"
        out.append(Finding(FAIL, where, f"{what} pending", "reset the GPU to apply them"))
    reasons = list(g.get("throttle") or [])
    for r in reasons:
        if r in HW_THROTTLE:
            out.append(Finding(FAIL, where, f"clocks throttled: {r}", HW_THROTTLE[r]))
        elif r in SW_THROTTLE:
            out.append(Finding(WARN, where, f"clocks throttled: {r}", SW_THROTTLE[r]))
    width, wmax = int(g.get("pcie_width") or 0), int(g.get("pcie_width_max") or 0)
    if width and wmax and width < wmax:
        out.append(
            Finding(FAIL, where, f"PCIe link x{width}, its maximum x{wmax}", "a degraded link")
        )
    gen, gmax = int(g.get("pcie_gen") or 0), int(g.get("pcie_gen_max") or 0)
    if gen and gmax and gen < gmax and "gpu_idle" not in reasons:
        out.append(
            Finding(WARN, where, f"PCIe gen {gen} while busy, its maximum gen {gmax}", "slow link")
        )
    return out


def _ib_findings(ports: list[Mapping[str, Any]], last: Mapping[str, Any]) -> list[Finding]:
    out: list[Finding] = []
    best: dict[str, float] = {}
    for p in ports:
        if p.get("state") == "ACTIVE":
            layer = str(p.get("link_layer"))
            best[layer] = max(best.get(layer, 0.0), float(p.get("rate") or 0))
    for p in ports:
        where = str(p.get("port"))
        state, phys = str(p.get("state")), str(p.get("phys") or "")
        if state != "ACTIVE" or (phys and phys != "LinkUp"):
            out.append(Finding(FAIL, where, f"port {state or '?'} ({phys or '?'})", "link down"))
            continue
        top = best.get(str(p.get("link_layer")), 0.0)
        rate = float(p.get("rate") or 0)
        if rate and rate < top:
            out.append(
                Finding(
                    FAIL,
                    where,
                    f"rate {p.get('rate_text')}, the host's other ports {top:g} Gb/sec",
                    "a degraded link (cable, transceiver or switch port)",
                )
            )
        before = last.get(where) or {}
        now = p.get("counters") or {}
        moved = {k: int(now[k]) - int(before[k]) for k in now if k in before}
        if moved.get("link_downed", 0) > 0:
            out.append(
                Finding(
                    FAIL,
                    where,
                    f"link_downed +{moved['link_downed']} since the last check",
                    "the link flapped (cable, transceiver or switch port)",
                )
            )
        errs = {k: v for k, v in moved.items() if k in IB_WARN_COUNTERS and v > 0}
        if errs:
            text = ", ".join(f"{k} +{v}" for k, v in errs.items())
            out.append(Finding(WARN, where, f"{text} since the last check", "a noisy link"))
    return out
