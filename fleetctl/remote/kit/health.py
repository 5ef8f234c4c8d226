"""Node-side GPU and link health sources for the check: read here, judged on the controller.

The probe (``facts.gather``) calls ``health_facts`` beside its other facts. Each source is
read and reduced to small figures on the node — an 8-GPU ``nvidia-smi -q -x`` is ~150 kB,
its health a few hundred bytes — so a large fleet sends the controller figures, not logs:

* ``nvidia-smi -q -x``: per GPU its PCI bus id, uncorrectable ECC counts (volatile and
  aggregate, every driver's field names), retired pages pending, remapped rows pending or
  failed, the active clock event (throttle) reasons, the PCIe link's width and generation;
* the kernel log (``journalctl -k -b``, else ``dmesg``; both read here from ``/dev/kmsg`` where
  that says the same: ``kernel_xids``): its ``NVRM: Xid`` lines since boot, with their seconds
  since boot, so the controller can tell the ones since the last check;
* ``/sys/class/infiniband`` (``ib_root``): every port's state, rate and error counters;
* ``dcgmi diag -r 1 -j`` where DCGM is installed and the check asks for it (``dcgm``).

The parsers are pure (``parse_smi_xml``, ``parse_xid_lines``, ``parse_dcgm``): the controller's
tests feed them captured outputs. Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import re

from .waits import run, which

IB_ROOT = "/sys/class/infiniband"
IB_COUNTERS = (
    "link_downed",
    "link_error_recovery",
    "symbol_error",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
# compiled at its first use (re caches it): most nodes' logs hold no Xid line
XID_PATTERN = r"^\[\s*(\d+(?:\.\d+)?)\].*?NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)$"
MAX_XIDS = 64  # the newest kept: a GPU in a fault loop logs thousands
KMSG = "/dev/kmsg"
KMSG_ESCAPE = r"\\x([0-9a-f]{2})"
JOURNAL_DIRS = ("/run/log/journal", "/var/log/journal")
NVIDIA_MODULE = "/sys/module/nvidia"  # while the driver is loaded


def pci_key(bus_id: str) -> str:
    """One spelling of a PCI address for both sources: ``00000000:18:00.0`` (nvidia-smi) and
    ``0000:18:00`` (the kernel's Xid line) are both ``0:18:00``."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) < 3:
        return bus_id.strip().lower()
    try:
        domain = f"{int(parts[-3], 16):x}"
    except ValueError:
        domain = parts[-3]
    return f"{domain}:{parts[-2]}:{parts[-1].split('.')[0]}"


def _text(el: object, path: str) -> str:
    found = el.find(path) if el is not None else None  # type: ignore[attr-defined]
    return (found.text or "").strip() if found is not None else ""


def _count(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0  # "N/A": the GPU does not keep this count


def _uncorrectable(section: object) -> int:
    """Uncorrectable ECC errors of one section (``volatile``/``aggregate``): the
    ``*_uncorrectable*`` fields of drivers ≥ 525, or ``double_bit/total`` of older ones."""
    if section is None:
        return 0
    total = 0
    for child in list(section):  # type: ignore[call-overload]
        if "uncorrectable" in child.tag and len(child) == 0:
            total += _count((child.text or "").strip())
    total += _count(_text(section, "double_bit/total"))
    return total


def parse_smi_xml(text: str) -> list:
    """Each GPU's health figures from ``nvidia-smi -q -x``, in the tool's order."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(text)
    gpus = []
    for i, gpu in enumerate(root.findall("gpu")):
        bus = gpu.get("id") or _text(gpu, "pci/pci_bus_id")
        reasons = gpu.find("clocks_event_reasons")
        if reasons is None:
            reasons = gpu.find("clocks_throttle_reasons")
        active = []
        for child in list(reasons) if reasons is not None else []:
            if (child.text or "").strip() == "Active":
                name = child.tag
                for prefix in ("clocks_event_reason_", "clocks_throttle_reason_"):
                    if name.startswith(prefix):
                        name = name[len(prefix) :]
                active.append(name)
        ecc = gpu.find("ecc_errors")
        volatile = ecc.find("volatile") if ecc is not None else None
        aggregate = ecc.find("aggregate") if ecc is not None else None
        pending = _text(gpu, "retired_pages/pending_blacklist") or _text(
            gpu, "retired_pages/pending_retirement"
        )
        link = gpu.find("pci/pci_gpu_link_info")
        gpus.append(
            {
                "index": _count(_text(gpu, "minor_number")) if _text(gpu, "minor_number") else i,
                "name": _text(gpu, "product_name"),
                "uuid": _text(gpu, "uuid"),
                "pci": bus,
                "pci_key": pci_key(bus),  # as the Xid lines name it
                "ecc_volatile_unc": _uncorrectable(volatile),
                "ecc_aggregate_unc": _uncorrectable(aggregate),
                "retired_pending": pending == "Yes",
                "remap_pending": _text(gpu, "remapped_rows/remapped_row_pending") == "Yes",
                "remap_failure": _text(gpu, "remapped_rows/remapped_row_failure") == "Yes",
                "remap_unc": _count(_text(gpu, "remapped_rows/remapped_row_unc")),
                "throttle": active,
                "pcie_gen": _count(_text(link, "pcie_gen/current_link_gen")),
                "pcie_gen_max": _count(
                    _text(link, "pcie_gen/max_device_link_gen")
                    or _text(link, "pcie_gen/max_link_gen")
                ),
                "pcie_width": _count(_text(link, "link_widths/current_link_width").rstrip("x")),
                "pcie_width_max": _count(_text(link, "link_widths/max_link_width").rstrip("x")),
            }
        )
    return gpus


def parse_xid_lines(text: str) -> list:
    """``NVRM: Xid`` lines (dmesg, or ``journalctl -k -o short-monotonic``) as
    ``{"t": seconds since boot, "pci": key, "xid": n, "text": rest}``, the newest MAX_XIDS."""
    out = []
    for line in text.splitlines():
        if "NVRM: Xid" not in line:  # the regex's cost on every line of a long log
            continue
        m = re.match(XID_PATTERN, line.strip())
        if m:
            out.append(
                {
                    "t": float(m.group(1)),
                    "pci": pci_key(m.group(2)),
                    "xid": int(m.group(3)),
                    "text": m.group(4).strip()[:200],
                }
            )
    return out[-MAX_XIDS:]


def parse_dcgm(text: str) -> dict:
    """``dcgmi diag -j``: every test that did not pass, ``{"failed": [{test, gpu, info}]}``."""
    doc = json.loads(text)
    diag = doc.get("DCGM GPU Diagnostic", doc)
    failed = []
    for cat in diag.get("test_categories") or []:
        for test in cat.get("tests") or []:
            for res in test.get("results") or []:
                if str(res.get("status", "")).lower() not in ("fail", "error"):
                    continue
                info = res.get("warnings") or res.get("info") or ""
                if isinstance(info, list):
                    info = "; ".join(
                        str(w.get("warning", w)) if isinstance(w, dict) else str(w) for w in info
                    )
                gpu = res.get("gpu_id", res.get("gpu_ids"))
                failed.append({"test": test.get("name", "?"), "gpu": gpu, "info": str(info)[:200]})
    return {"failed": failed, "version": diag.get("version")}


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def ib_ports(root: str = IB_ROOT) -> list:
    """Every InfiniBand/RoCE port under ``root``: state, physical state, rate, link layer and
    the error counters the controller compares with the last check's."""
    out = []
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return out
    for dev in devices:
        ports_dir = os.path.join(root, dev, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: (len(p), p))
        except OSError:
            continue
        for port in ports:
            base = os.path.join(ports_dir, port)
            counters = {}
            for name in IB_COUNTERS:
                value = _read(os.path.join(base, "counters", name))
                if value.isdigit():
                    counters[name] = int(value)
            rate = _read(os.path.join(base, "rate"))
            words = rate.split()
            out.append(
                {
                    "port": f"{dev}/{port}",
                    "state": _read(os.path.join(base, "state")).split(":", 1)[-1].strip(),
                    "phys": _read(os.path.join(base, "phys_state")).split(":", 1)[-1].strip(),
                    "rate": float(words[0]) if words and words[0].replace(".", "").isdigit() else 0,
                    "rate_text": rate,
                    "link_layer": _read(os.path.join(base, "link_layer")),
                    "counters": counters,
                }
            )
    return out


def kernel_xids() -> dict:
    """The ``NVRM: Xid`` lines since boot: journald's kernel log, else the kernel's ring buffer
    (``dmesg`` may need root: ``kernel.dmesg_restrict``).

    Where the system's own tools are on PATH, no program is run when a read here says the
    same: the ring buffer read from ``/dev/kmsg`` (what ``dmesg`` prints) stands in for
    ``journalctl`` while it still holds every line since boot, and for ``dmesg`` always;
    ``journalctl`` is not run where no journal was ever written (it would print nothing; the
    ring buffer is then read however much of the boot it still holds, as ``dmesg`` was).
    A script in their place (a site's wrapper, the lab's fake kernel log) is run as before.
    Both programs cost a node ~13 ms CPU per check, a tenth of its remote work (64 lab hosts)."""
    journalctl, dmesg = which("journalctl"), which("dmesg")
    journal = journalctl is not None and (_wrapper(journalctl) or _journal())
    ring = None
    if not _wrapper(journalctl) and not _wrapper(dmesg):
        ring = read_kmsg(KMSG, whole_only=journal)
    tried = []
    if journal and ring is None:
        argv = ["journalctl", "-k", "-b", "-o", "short-monotonic", "--no-pager", "-q"]
        code, out, err = run([journalctl, *argv[1:]], 8)
        if code == 0 and out.strip():
            return {"source": "journalctl", "xids": parse_xid_lines(out)}
        last = (err or out).strip().splitlines()
        tried.append(f"journalctl exited {code}" + (f": {last[-1]}" if last else ""))
    if ring is not None:
        return {"source": "kmsg", "xids": parse_xid_lines(ring[0])}
    if dmesg:
        code, out, err = run([dmesg], 8)
        if code == 0:
            return {"source": "dmesg", "xids": parse_xid_lines(out)}
        last = (err or out).strip().splitlines()
        tried.append(f"dmesg exited {code}" + (f": {last[-1]}" if last else ""))
    return {"source": None, "error": "; ".join(tried) or "no journalctl or dmesg"}


def _wrapper(exe: str | None) -> bool:
    """Whether the program at ``exe`` is not a compiled one (a script standing in for it)."""
    if exe is None:
        return False
    try:
        with open(exe, "rb") as f:
            return f.read(4) != b"\x7fELF"
    except OSError:
        return True  # run it, and let it say why it cannot


def _journal() -> bool:
    """Whether journald ever wrote a journal here (volatile or persistent)."""
    for d in JOURNAL_DIRS:
        try:
            if os.listdir(d):
                return True
        except OSError:
            continue
    return False


def read_kmsg(
    path: str = KMSG, want: bytes = b"NVRM: Xid", whole_only: bool = False
) -> tuple | None:
    """The kernel's ring buffer as ``dmesg`` prints it, only its lines holding ``want``, and
    whether it holds every line since boot (its first record is the boot's first, none was
    overwritten while reading); None when it cannot be read (no root under dmesg_restrict),
    and with ``whole_only`` as soon as it shows it does not hold them all."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    lines = []
    whole = None
    read = os.read  # one record a read, thousands of them: the loop is kept lean
    try:
        while True:
            try:
                rec = read(fd, 8192)
            except BlockingIOError:  # EAGAIN: read to the end
                break
            except BrokenPipeError:  # EPIPE: records overwritten under us; on from the next
                if whole_only:
                    return None
                whole = False
                continue
            except OSError:
                return None
            if not rec:
                break
            if whole is None:
                whole = kmsg_line(rec, want)[0] == 0
                if whole_only and not whole:
                    return None
            if want in rec:
                line = kmsg_line(rec, want)[1]
                if line is not None:
                    lines.append(line)
    finally:
        os.close(fd)
    return "\n".join(lines), whole is not False


def kmsg_line(rec: bytes, want: bytes) -> tuple:
    """One ``/dev/kmsg`` record (``prio,seq,usec,flags;text`` and its `` KEY=value`` lines):
    its sequence number and, when its text holds ``want``, the line as ``dmesg`` prints it."""
    head, _, msg = rec.partition(b";")
    fields = head.split(b",")
    seq = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else -1
    if want not in msg or len(fields) < 3 or not fields[2].isdigit():
        return seq, None
    us = int(fields[2])
    text = msg.split(b"\n", 1)[0].decode(errors="replace")
    if "\\x" in text:  # the kernel's escape of a control character, as dmesg undoes it
        text = re.sub(KMSG_ESCAPE, lambda m: chr(int(m.group(1), 16)), text)
    return seq, f"[{us // 1000000:5d}.{us % 1000000:06d}] {text}"


def health_facts(args: dict) -> dict:
    """Every source this node has, reduced; a source that fails says why (``*_error``)."""
    out: dict = {"boot_id": _read("/proc/sys/kernel/random/boot_id")}
    smi = which("nvidia-smi")
    if smi:
        code, text, err = run([smi, "-q", "-x"], 10)
        if code == 0:
            try:
                out["gpus"] = parse_smi_xml(text)
            except Exception as e:  # ParseError, or a shape we do not know
                out["smi_error"] = f"nvidia-smi -q -x unreadable: {e}"
        else:
            last = (err or text).strip().splitlines()
            out["smi_error"] = f"nvidia-smi -q -x exited {code}" + (f": {last[-1]}" if last else "")
    if smi or os.path.exists(NVIDIA_MODULE):
        out["kernel"] = kernel_xids()
    else:  # an Xid line needs the driver, loaded now or once with its nvidia-smi installed
        out["kernel"] = {"source": "-", "xids": [], "skipped": "no NVIDIA driver, no nvidia-smi"}
    out["ib"] = ib_ports(args.get("ib_root") or IB_ROOT)
    dcgmi = which("dcgmi") if args.get("dcgm") else None
    if dcgmi:
        code, text, err = run([dcgmi, "diag", "-r", "1", "-j"], 120)
        try:
            out["dcgm"] = parse_dcgm(text)
        except ValueError:
            last = (err or text).strip().splitlines()
            why = f"dcgmi diag exited {code}" + (f": {last[-1]}" if last else "")
            out["dcgm"] = {"error": why}
    return out
