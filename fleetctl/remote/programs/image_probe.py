"""What an image's python can run: the ``--image`` check, in one throwaway container per node.

``PY -c SOURCE '{"module": M, "nccl": true}'``, run by the job's python inside the image
(``python3``, or ``fleetctl_image_python``): imports the launcher's module ``M`` for real (what
the host check does where there is no image: torchrun's ``torch.distributed.run``), reports
torch's version (the plan names torch's variables by it) and, with ``nccl``, where the NCCL
library is (looked for where torch finds it: python packages' ``nvidia/nccl/lib`` and
``torch/lib``, then the loader's cache, ``LD_LIBRARY_PATH`` and the usual folders, CUDA and
conda images included).

Answers one frame, ``D {"python", "module", "version", "torch", "error", "nccl"}``; exits 0,
or 3 when the answer is a failure (the module did not import, no NCCL) so the node's check
script never caches it. Node module: stdlib only, Python >= 3.8 (whatever python the image
has); not run with ``-S``: the image's packages are what is asked about.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import json
import os
import sys

from ..kit.framing import frame

FAILED = 3
PACKAGES = ("nvidia/nccl/lib", "torch/lib")
FOLDERS = (
    "/usr/lib",
    "/usr/lib64",
    "/usr/local/lib",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/local/cuda/lib64",
    "/usr/local/nccl/lib",
    "/opt/conda/lib",
)


def _in(folder: str) -> str | None:
    found = sorted(glob.glob(os.path.join(folder, "libnccl.so*")))
    return found[0] if found else None


def find_nccl() -> str | None:
    """The path (or loader name) of the NCCL library this python would load."""
    for entry in sys.path:
        for rel in PACKAGES:
            hit = _in(os.path.join(entry or ".", rel))
            if hit:
                return hit
    try:  # not at the top: Debian's python3-minimal has no ctypes, and a CPU job needs none
        import ctypes.util

        name = ctypes.util.find_library("nccl")
    except ImportError:
        name = None
    if name:
        return name
    extra = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    for folder in (*extra, *FOLDERS):
        hit = _in(folder)
        if hit:
            return hit
    return None


def import_module(module: str) -> dict:
    """``{"version"}`` of the module's top package once it imports, else ``{"error"}`` (the
    exception as the last line of a traceback says it). Its prints go to stderr: stdout is
    the frame's."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            importlib.import_module(module)
    except (Exception, SystemExit) as e:  # any failure to import is the answer
        text = " ".join(str(e).split())
        return {"error": (f"{type(e).__name__}: {text}" if text else type(e).__name__)[:300]}
    top = sys.modules.get(module.split(".")[0])
    return {"version": str(getattr(top, "__version__", "") or "")}


def torch_version() -> str:
    """torch's version for this python: the imported module's, else as installed ('' none)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(torch, "__version__", "") or "")
    try:
        from importlib.metadata import version

        return str(version("torch"))
    except Exception:  # not installed
        return ""


def answer(args: dict) -> dict:
    out: dict = {"python": sys.version.split()[0], "module": args.get("module")}
    if args.get("module"):
        out.update(import_module(str(args["module"])))
    out["torch"] = torch_version()
    if args.get("nccl"):
        out["nccl"] = find_nccl() or "-"
    return out


def failed(data: dict) -> bool:
    return bool(data.get("error")) or data.get("nccl") == "-"


def main(argv: list) -> int:
    data = answer(json.loads(argv[1]) if len(argv) > 1 else {})
    frame("D", data, sort_keys=True)
    return FAILED if failed(data) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
