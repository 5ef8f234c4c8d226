"""GPU and link health faults on lab hosts: what ``fleetctl lab fault gpu-xid|ecc|throttle|
ib-flap HOST`` changes, and the fake sources the health gate reads on a host with fake GPUs.

Each host with ``--gpus K`` gets, beside its fake ``nvidia-smi`` (whose ``nvidia-smi.json``
carries the ECC and throttle faults), a fake ``journalctl``/``dmesg`` printing the host's
``kernel.log`` (the Xid lines), and one fake InfiniBand port under
``<host dir>/sys/class/infiniband/mlx5_0/ports/1`` (the inventory's ``fleetctl_ib_root``).
Writing the GPU files afresh (``reset_faults``) heals them all.
"""

from __future__ import annotations

import json
from pathlib import Path

from fleetctl.errors import LabInputError
from fleetctl.health.xid import describe
from fleetctl.lab.constants import _HERE

KINDS = ("gpu-xid", "ecc", "throttle", "ib-flap")
IB_PORT = "mlx5_0/1"
THROTTLES = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


def health_files(bindir: Path) -> list[Path]:
    """The fake kernel-log programs and their log, in a host's bin dir."""
    return [bindir / "journalctl", bindir / "dmesg", bindir / "kernel.log"]


def _ib_dir(host_dir: Path) -> Path:
    dev, port = IB_PORT.split("/")
    return host_dir / "sys" / "class" / "infiniband" / dev / "ports" / port


def write_health_files(host_dir: Path, python: str) -> None:
    """A healthy host: an empty kernel log, one ACTIVE 400 Gb/s port with zero counters."""
    bindir = host_dir / "bin"
    src = (_HERE / "fake_kernel_log.py").read_text()
    for prog in health_files(bindir)[:2]:
        prog.write_text(f"#!{python} -IS\n" + src)
        prog.chmod(0o755)
    (bindir / "kernel.log").write_text("")
    (bindir / "kernel.log").chmod(0o644)
    port = _ib_dir(host_dir)
    (port / "counters").mkdir(parents=True, exist_ok=True)
    for p in (host_dir / "sys", *list((host_dir / "sys").rglob("*"))):
        if p.is_dir():
            p.chmod(0o755)
    files = {
        "state": "4: ACTIVE",
        "phys_state": "5: LinkUp",
        "rate": "400 Gb/sec (4X NDR)",
        "link_layer": "InfiniBand",
        "counters/link_downed": "0",
        "counters/link_error_recovery": "0",
        "counters/symbol_error": "0",
        "counters/port_rcv_errors": "0",
    }
    for name, text in files.items():
        (port / name).write_text(text + "\n")
        (port / name).chmod(0o644)


def _uptime() -> float:
    """Seconds since boot, as the kernel stamps its log lines (the lab hosts' kernel is ours)."""
    return float(Path("/proc/uptime").read_text().split()[0])


def inject(
    host_dir: Path, kind: str, gpu: int, *, gpus: int, xid: int, count: int, reason: str
) -> str:
    """Inject one health fault on the host whose files are under ``host_dir``; what it did."""
    bindir = host_dir / "bin"
    if kind not in KINDS:
        raise LabInputError(f"health fault must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind != "ib-flap" and not 0 <= gpu < gpus:
        raise LabInputError(f"{host_dir.name} has no fake GPU {gpu} (it has {gpus})")
    if kind == "gpu-xid":
        bus = f"{0x18 + gpu * 0x10:02x}"  # the fake nvidia-smi's PCI bus of that GPU
        line = (
            f"[{_uptime():12.6f}] NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid='<unknown>', "
            f"name=<unknown>, {describe(xid).meaning}"
        )
        with open(bindir / "kernel.log", "a") as f:
            f.write(line + "\n")
        return f"GPU {gpu}: XID {xid} ({describe(xid).meaning}) in its kernel log"
    if kind in ("ecc", "throttle"):
        path = bindir / "nvidia-smi.json"
        cfg = json.loads(path.read_text())
        if kind == "ecc":
            cfg.setdefault("ecc", {})[str(gpu)] = count
            what = f"GPU {gpu}: {count} uncorrectable ECC error(s)"
        else:
            if reason not in THROTTLES:
                raise LabInputError(f"throttle reason must be one of {', '.join(THROTTLES)}")
            cfg.setdefault("throttle", {})[str(gpu)] = reason
            what = f"GPU {gpu}: clocks throttled ({reason})"
        path.write_text(json.dumps(cfg) + "\n")
        return what
    counters = _ib_dir(host_dir) / "counters"
    for name, by in (("link_downed", count), ("symbol_error", 7 * count)):
        p = counters / name
        p.write_text(f"{int(p.read_text().strip() or 0) + by}\n")
    return f"{IB_PORT}: link_downed +{count} (a flapping link)"
