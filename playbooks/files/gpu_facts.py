"""Print one node's GPU facts as JSON: driver, CUDA, GPUs (nvidia-smi) and NCCL versions (ctypes).

Run on the node by playbooks/gpu-facts.yml (``ansible.builtin.script``) with the node's python;
stdlib only, Python 3.8+. Never fails for a missing tool: what cannot be read is null and the
reason goes to ``errors``, so one report covers a mixed fleet.

    python3 gpu_facts.py [--nccl PATH_OR_DIR]...

Each ``--nccl`` is a ``libnccl.so*`` file or a directory searched for one (a conda env prefix,
``lib/``, or a pip ``nvidia/nccl`` folder); globs are expanded. The system's ``libnccl.so.2`` is
always tried too.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys

QUERY = "index,name,uuid,memory.total,pci.bus_id,driver_version"
TIMEOUT = 30


def run(argv: list[str]) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, "", str(e)
    return p.returncode, p.stdout, p.stderr


def nvidia(facts: dict) -> None:
    smi = shutil.which("nvidia-smi")
    facts["nvidia_smi"] = smi
    if smi is None:
        facts["errors"].append("nvidia-smi not found on PATH")
        return
    rc, out, err = run([smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"])
    if rc != 0:
        facts["errors"].append(f"nvidia-smi --query-gpu exited {rc}: {(err or out).strip()}")
    else:
        for line in out.splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) != 6:
                continue
            idx, name, uuid, mem, bus, drv = cols
            facts["gpus"].append(
                {
                    "index": int(idx),
                    "name": name,
                    "uuid": uuid,
                    "memory_mib": int(mem) if mem.isdigit() else None,
                    "pci_bus_id": bus,
                }
            )
            facts["driver"] = facts["driver"] or drv
    # The CUDA version the driver supports appears only in the summary table's header.
    rc, out, _ = run([smi])
    m = re.search(r"CUDA Version:\s*([0-9.]+)", out) if rc == 0 else None
    if m:
        facts["cuda"] = m.group(1)
    nvcc = shutil.which("nvcc")
    if nvcc:
        rc, out, _ = run([nvcc, "--version"])
        m = re.search(r"release ([0-9.]+)", out)
        facts["nvcc"] = m.group(1) if m else None


def nccl_version(lib: str) -> str:
    """Ask the library itself (``ncclGetVersion``): file names often omit the patch level."""
    handle = ctypes.CDLL(lib)
    code = ctypes.c_int(0)
    rc = handle.ncclGetVersion(ctypes.byref(code))
    if rc != 0:
        raise OSError(f"ncclGetVersion returned {rc}")
    v = code.value
    if v >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}"


def nccl_candidates(paths: list[str]) -> list[str]:
    found: list[str] = []
    for pattern in paths:
        for p in sorted(glob.glob(os.path.expanduser(pattern))) or []:
            if os.path.isfile(p):
                found.append(p)
                continue
            for sub in (
                "lib/libnccl.so*",
                "libnccl.so*",
                "lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*",
            ):
                hits = sorted(glob.glob(os.path.join(p, sub)))
                if hits:
                    found.append(hits[0])
                    break
    return list(dict.fromkeys(os.path.realpath(f) for f in found))


def nccl(facts: dict, paths: list[str]) -> None:
    # The system library first: once a libnccl.so.2 is loaded from a path, dlopen of the bare
    # soname would return that one instead of searching the system.
    with contextlib.suppress(OSError, AttributeError):  # no system NCCL: common, no note
        facts["nccl"]["libnccl.so.2"] = nccl_version("libnccl.so.2")
    for lib in nccl_candidates(paths):
        try:
            facts["nccl"][lib] = nccl_version(lib)
        except (OSError, AttributeError) as e:
            facts["errors"].append(f"{lib}: {e}")


def main(argv: list[str]) -> int:
    paths = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--nccl"]
    facts: dict = {
        "hostname": socket.gethostname(),
        "nvidia_smi": None,
        "driver": None,
        "cuda": None,
        "nvcc": None,
        "gpus": [],
        "nccl": {},
        "errors": [],
    }
    nvidia(facts)
    nccl(facts, paths)
    facts["gpu_count"] = len(facts["gpus"])
    json.dump(facts, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
