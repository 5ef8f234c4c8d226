"""Where NCCL is inside an image: run by the image's own python in a throwaway container (the
``--image`` check, when the job uses GPUs on the node). Prints one line: the path of the
``libnccl.so*`` found, or ``-`` when there is none.

Looked for where torch finds it: the python packages first (pip's ``nvidia/nccl/lib``, a
torch build's own ``torch/lib``), then the loader's cache (``ldconfig -p``), then
``LD_LIBRARY_PATH`` and the usual library folders (CUDA and conda images included).

Node module: stdlib only, Python >= 3.8 (whatever python the image has, from 3.8).
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import sys

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
    """The path (or loader name) of the NCCL library this image's python would load."""
    for entry in sys.path:
        for rel in PACKAGES:
            hit = _in(os.path.join(entry or ".", rel))
            if hit:
                return hit
    name = ctypes.util.find_library("nccl")
    if name:
        return name
    extra = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    for folder in (*extra, *FOLDERS):
        hit = _in(folder)
        if hit:
            return hit
    return None


def main() -> int:
    print(find_nccl() or "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
