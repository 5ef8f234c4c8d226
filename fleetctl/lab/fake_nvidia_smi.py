"""A stand-in ``nvidia-smi`` for lab hosts: prints K fake GPUs in the real tool's formats.

Copied into each lab host's bin dir (first on the host's SSH ``PATH``) when the lab has
``--gpus K``. It reads ``nvidia-smi.json`` next to itself (``count``, ``name``, ``memory_mib``,
``driver``, ``seed``, ``apps``), so a test can change one host's count without restarting
anything. ``apps`` (``[{"gpu": 1, "pid": 4242, "used_memory": 2048, "name": "python"}]``) are
another job's processes: ``--query-compute-apps`` lists them and their GPU's ``memory.used``
counts them. ``ecc`` (``{"1": 2}``: GPU 1 has 2 uncorrectable errors) and ``throttle``
(``{"0": "hw_slowdown"}``) are the health faults ``-q -x`` shows (``fleetctl lab fault ecc``,
``throttle``). Stdlib only. Covers what fleetctl and people commonly call: ``-L``,
``--query-gpu=… --format=csv[,noheader][,nounits]``, ``--query-compute-apps=…``, ``-i``,
``-q -x`` (the health fields, in the real tool's XML shape), and the plain summary table.
Exit codes follow the real tool: 6 when no GPU is found, 2 for a bad field.
"""

from __future__ import annotations

import json
import os
import sys
import uuid

HERE = os.path.dirname(os.path.realpath(__file__))

FIELDS_WITH_UNITS = {
    "memory.total": "MiB",
    "memory.used": "MiB",
    "memory.free": "MiB",
    "utilization.gpu": "%",
    "utilization.memory": "%",
    "power.draw": "W",
    "power.limit": "W",
    "clocks.sm": "MHz",
    "clocks.max.sm": "MHz",
}


def load() -> dict:
    try:
        with open(os.path.join(HERE, "nvidia-smi.json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return {"count": 0}


def gpus(cfg: dict) -> list[dict]:
    out = []
    mem = int(cfg.get("memory_mib", 81559))
    for i in range(int(cfg.get("count", 0))):
        u = uuid.uuid5(uuid.NAMESPACE_URL, f"fleetctl-lab/{cfg.get('seed', '')}/{i}")
        used = sum(int(a.get("used_memory", 0)) for a in cfg.get("apps") or [] if a.get("gpu") == i)
        out.append(
            {
                "index": str(i),
                "name": cfg.get("name", "NVIDIA H100 80GB HBM3"),
                "uuid": f"GPU-{u}",
                "serial": str(1650000000000 + i),
                "memory.total": str(mem),
                "memory.used": str(used),
                "memory.free": str(mem - used),
                "driver_version": cfg.get("driver", "535.104.05"),
                "pci.bus_id": f"00000000:{0x18 + i * 0x10:02X}:00.0",
                "utilization.gpu": "0",
                "utilization.memory": "0",
                "temperature.gpu": "31",
                "power.draw": "69.42",
                "power.limit": "700.00",
                "clocks.sm": "345",
                "clocks.max.sm": "1980",
                "compute_cap": "9.0",
                "persistence_mode": "Enabled",
                "pstate": "P0",
                "count": str(int(cfg.get("count", 0))),
                "vbios_version": "96.00.74.00.01",
            }
        )
    return out


def slurm_visible(devs: list[dict]) -> list[dict]:
    """In a Slurm task with gres, only its step's GPUs (the batch step: its job's), as the
    real nvidia-smi shows them where cgroup.conf has ``ConstrainDevices=yes`` (GPU clusters
    do): Slurm says which in ``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS``."""
    ids = os.environ.get("SLURM_STEP_GPUS") or os.environ.get("SLURM_JOB_GPUS")
    if not ids or not os.environ.get("SLURM_JOB_ID"):
        return devs
    keep = {x.strip() for x in ids.split(",")}
    out = [d for d in devs if d["index"] in keep]
    for d in out:
        d["count"] = str(len(out))
    return out


def option(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def select(devs: list[dict], args: list[str]) -> list[dict]:
    ids = option(args, "-i") or option(args, "--id")
    if ids is None:
        return devs
    wanted = {x.strip() for x in ids.split(",")}
    return [d for d in devs if d["index"] in wanted or d["uuid"] in wanted]


def query(devs: list[dict], fields_arg: str, fmt: str) -> int:
    fields = [f.strip() for f in fields_arg.split(",") if f.strip()]
    aliases = {
        "gpu_name": "name",
        "gpu_uuid": "uuid",
        "gpu_serial": "serial",
        "gpu_bus_id": "pci.bus_id",
        "driver": "driver_version",
    }
    fields = [aliases.get(f, f) for f in fields]
    valid = set(gpus({"count": 1})[0])
    for f in fields:
        if f not in valid:
            print(f'Field "{f}" is not a valid field to query.\n', file=sys.stderr)
            return 2
    opts = {o.strip() for o in fmt.split(",")}
    if "csv" not in opts:
        print(f'"{fmt}" is not a valid format.', file=sys.stderr)
        return 2
    units = "nounits" not in opts
    if "noheader" not in opts:
        print(
            ", ".join(
                f + (f" [{FIELDS_WITH_UNITS[f]}]" if f in FIELDS_WITH_UNITS and units else "")
                for f in fields
            )
        )
    for d in devs:
        vals = []
        for f in fields:
            v = d[f]
            if units and f in FIELDS_WITH_UNITS:
                v = f"{v} {FIELDS_WITH_UNITS[f]}"
            vals.append(v)
        print(", ".join(vals))
    return 0


def compute_apps(devs: list[dict], cfg: dict, fields_arg: str, args: list[str]) -> int:
    fmt = option(args, "--format") or "csv"
    fields = [f.strip() for f in fields_arg.split(",") if f.strip()]
    known = {"gpu_uuid", "gpu_name", "gpu_bus_id", "pid", "process_name", "name", "used_memory"}
    for f in fields:
        if f not in known:
            print(f'Field "{f}" is not a valid field to query.\n', file=sys.stderr)
            return 2
    if "noheader" not in fmt:
        print(", ".join(fields))
    by_index = {int(d["index"]): d for d in devs}
    for app in cfg.get("apps") or []:
        d = by_index.get(int(app.get("gpu", -1)))
        if d is None:
            continue
        row = {
            "gpu_uuid": d["uuid"],
            "gpu_name": d["name"],
            "gpu_bus_id": d["pci.bus_id"],
            "pid": str(app.get("pid", 0)),
            "process_name": str(app.get("name", "python")),
            "name": str(app.get("name", "python")),
            "used_memory": str(app.get("used_memory", 0)) + ("" if "nounits" in fmt else " MiB"),
        }
        print(", ".join(row[f] for f in fields))
    return 0


def table(devs: list[dict], cfg: dict) -> None:
    drv = cfg.get("driver", "535.104.05")
    print("+" + "-" * 87 + "+")
    print(f"| NVIDIA-SMI {drv:<17} Driver Version: {drv:<14} CUDA Version: 12.2     |")
    print("|" + "=" * 87 + "|")
    for d in devs:
        mem = f"{d['memory.used']}MiB / {d['memory.total']}MiB"
        print(f"| {d['index']:>3}  {d['name']:<32} {d['pci.bus_id']:<18} {mem:<24}  |")
    print("+" + "-" * 87 + "+")


REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "display_clocks_setting",
)


def xml(devs: list[dict], cfg: dict) -> None:
    """``nvidia-smi -q -x``: the fields the health gate reads, as driver 550 writes them."""
    ecc, throttle = cfg.get("ecc") or {}, cfg.get("throttle") or {}
    out = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">']
    out += [
        "<nvidia_smi_log>",
        f"\t<driver_version>{cfg.get('driver', '535.104.05')}</driver_version>",
    ]
    out.append(f"\t<attached_gpus>{len(devs)}</attached_gpus>")
    for d in devs:
        unc = int(ecc.get(d["index"], 0))
        active = {"gpu_idle", throttle.get(d["index"])}
        reasons = "".join(
            f"<clocks_event_reason_{r}>{'Active' if r in active else 'Not Active'}"
            f"</clocks_event_reason_{r}>"
            for r in REASONS
        )
        out.append(
            f'\t<gpu id="{d["pci.bus_id"]}"><product_name>{d["name"]}</product_name>'
            f"<uuid>{d['uuid']}</uuid><minor_number>{d['index']}</minor_number>"
            f"<pci><pci_bus_id>{d['pci.bus_id']}</pci_bus_id><pci_gpu_link_info><pcie_gen>"
            "<max_link_gen>5</max_link_gen><current_link_gen>5</current_link_gen>"
            "<max_device_link_gen>5</max_device_link_gen></pcie_gen><link_widths>"
            "<max_link_width>16x</max_link_width><current_link_width>16x</current_link_width>"
            f"</link_widths></pci_gpu_link_info></pci><clocks_event_reasons>{reasons}"
            "</clocks_event_reasons><ecc_errors><volatile><dram_correctable>0</dram_correctable>"
            f"<dram_uncorrectable>{unc}</dram_uncorrectable></volatile><aggregate>"
            f"<dram_uncorrectable>{unc}</dram_uncorrectable></aggregate></ecc_errors>"
            "<retired_pages><pending_blacklist>N/A</pending_blacklist></retired_pages>"
            "<remapped_rows><remapped_row_pending>No</remapped_row_pending>"
            "<remapped_row_failure>No</remapped_row_failure></remapped_rows></gpu>"
        )
    out.append("</nvidia_smi_log>")
    print("\n".join(out))


def main(args: list[str]) -> int:
    cfg = load()
    devs = slurm_visible(gpus(cfg))
    if not devs:
        print("No devices were found")
        return 6
    devs = select(devs, args)
    if "-L" in args or "--list-gpus" in args:
        for d in devs:
            print(f"GPU {d['index']}: {d['name']} (UUID: {d['uuid']})")
        return 0
    if "-q" in args and ("-x" in args or "--xml-format" in args):
        xml(devs, cfg)
        return 0
    q = option(args, "--query-gpu")
    if q is not None:
        return query(devs, q, option(args, "--format") or "csv")
    if option(args, "--query-compute-apps") is not None:
        return compute_apps(gpus(cfg), cfg, option(args, "--query-compute-apps") or "", args)
    table(devs, cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
