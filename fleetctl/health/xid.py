"""What an NVIDIA XID means, how bad it is and what to do: the common ones of NVIDIA's XID
catalog (docs.nvidia.com/deploy/xid-errors), severities as Azure's ND-series health checks
(azurehpc-health-checks) treat them: a hardware or driver fault fails the host, one that
usually is the application's bug (13, 31, 43) warns."""

from __future__ import annotations

from typing import NamedTuple


class Xid(NamedTuple):
    meaning: str
    fatal: bool  # the host fails the gate; else a warning
    action: str


XIDS: dict[int, Xid] = {
    13: Xid("graphics engine exception", False, "usually the application (an illegal access)"),
    31: Xid("GPU memory page fault", False, "usually the application (an illegal address)"),
    43: Xid("GPU stopped processing", False, "usually the application; reset if it repeats"),
    45: Xid("preemptive cleanup after an earlier error", False, "see the XID before it"),
    48: Xid("double-bit ECC error", True, "reset the GPU; replace it if it recurs"),
    61: Xid("internal micro-controller breakpoint", True, "reset the GPU"),
    62: Xid("internal micro-controller halt", True, "reset the GPU"),
    63: Xid("ECC page retirement or row remap recorded", False, "reset the GPU to apply it"),
    64: Xid("ECC page retirement or row remap failed", True, "replace the GPU"),
    74: Xid("NVLink error", True, "reset the GPU; check NVLink/NVSwitch"),
    79: Xid("GPU has fallen off the bus", True, "reboot; reseat or replace the GPU"),
    92: Xid("high single-bit ECC error rate", False, "watch it; replace if it grows"),
    94: Xid("contained ECC error", True, "reset the GPU (the process on it was stopped)"),
    95: Xid("uncontained ECC error", True, "reset the GPU and reboot the node"),
    119: Xid("GSP RPC timeout", True, "reset the GPU; update the driver"),
    120: Xid("GSP error", True, "reset the GPU; update the driver"),
}


def describe(xid: int) -> Xid:
    """The entry for ``xid``; an unknown one warns and points at the catalog."""
    return XIDS.get(xid, Xid("see NVIDIA's XID catalog", False, "look it up"))
