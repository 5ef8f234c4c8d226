"""What a pushed environment offers: its python, NCCL version, and the imports a job needs.

Stdlib only. Run by the ENVIRONMENT's python (not the node's): the check probe
(``probe.py``) and the push helper (``push_helper.py``) get this source from the controller and
run it as ``ENV/bin/python -c SOURCE '<json>'`` with ``{"prefix": ENV, "imports": [...],
"torch": bool}``. Answers one frame, ``D <json>``: ``python``, ``executable``, ``imports``
(module -> version or ``error: ...``), ``nccl`` (``x.y.z``) and ``nccl_code`` (as
ncclGetVersion says it), ``nccl_path`` (the library loaded, else the first one found),
``nccl_error``, and with ``torch``: ``torch`` or ``torch_error``.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys


def nccl_candidates(prefix: str) -> list[str]:
    """``lib/libnccl.so.2`` (conda's nccl), then the pip wheel's under site-packages."""
    wheel = os.path.join(prefix, "lib", "python*", "site-packages", "nvidia", "nccl", "lib")
    conda = os.path.join(prefix, "lib", "libnccl.so.2")
    return [conda, *sorted(glob.glob(os.path.join(wheel, "libnccl.so*")))]


def version_text(code: int) -> str:
    """ncclGetVersion's integer as ``x.y.z`` (2.9+ encodes x*10000 + y*100 + z)."""
    major, rest = (code // 10000, code % 10000) if code >= 10000 else (code // 1000, code % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def nccl_facts(prefix: str) -> dict:
    out = {"nccl": None}
    for path in nccl_candidates(prefix):
        if not os.path.exists(path):
            continue
        out.setdefault("nccl_path", path)
        try:
            code = ctypes.c_int(0)
            rc = ctypes.CDLL(path).ncclGetVersion(ctypes.byref(code))
        except Exception as e:
            out.setdefault("nccl_error", f"{path}: {type(e).__name__}: {e}")
            continue
        if rc != 0:
            out.setdefault("nccl_error", f"{path}: ncclGetVersion returned {rc}")
            continue
        out.update(nccl=version_text(code.value), nccl_code=code.value, nccl_path=path)
        out.pop("nccl_error", None)
        break
    return out


def import_facts(modules: list[str]) -> dict:
    found = {}
    for mod in modules:
        try:
            m = __import__(mod)
            found[mod] = str(getattr(m, "__version__", "ok"))
        except Exception as e:
            found[mod] = f"error: {type(e).__name__}: {e}"
    return found


def main() -> None:
    args = json.loads(sys.argv[1])
    out = {"python": sys.version.split()[0], "executable": sys.executable}
    out["imports"] = import_facts(args.get("imports") or [])
    out.update(nccl_facts(args["prefix"]))
    if args.get("torch"):
        try:
            import torch

            out["torch"] = torch.__version__
        except Exception as e:
            out["torch_error"] = f"{type(e).__name__}: {e}"
    sys.stdout.write("D " + json.dumps(out) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
