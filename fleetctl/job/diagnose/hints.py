"""What to do about a failed rank's error, when the error is a well-known one: one line under
the rank's traceback in the summary, and ``hint`` in job.json's ``failed_ranks``. Pure: the
rank's own last lines in, a hint or None out; a golden table in tests/pure/test_hints.py.

Only errors whose cause is unambiguous get a hint (a wrong hint costs more than none): a
CUDA-only script on nodes without CUDA, NCCL asked for where there is no GPU, a module the
node's python lacks, a port already taken, a full disk, a GPU out of memory."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: (pattern over the rank's last lines, hint; ``{0}`` is the pattern's first group)
HINTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(
            r"Torch not compiled with CUDA enabled|has no attribute '_cuda_\w+'|"
            r"Found no NVIDIA driver on your system|No CUDA GPUs are available|"
            r"CUDA driver initialization failed"
        ),
        "the script uses CUDA, but torch on this node has no GPU to use (a CPU build of torch, "
        "no GPU or no driver): run it on GPU nodes, or let it fall back to the CPU and gloo "
        "where torch.cuda.is_available() is False",
    ),
    (
        re.compile(r"ProcessGroupNCCL is only supported with GPUs|NCCL.*no GPUs? found"),
        "the NCCL backend needs a GPU on every rank: use backend='gloo' on CPU nodes",
    ),
    (
        re.compile(r"(?:ModuleNotFoundError|ImportError): No module named '([\w.]+)'"),
        "the node's python cannot import {0}: install it there (`fleetctl provision`) or push "
        "an environment that has it (`--env`, docs/environments.md)",
    ),
    (
        re.compile(r"CUDA out of memory|OutOfMemoryError"),
        "the GPU ran out of memory: a smaller batch per rank, or more ranks for the same batch",
    ),
    (
        re.compile(r"(?:EADDRINUSE|[Aa]ddress already in use)"),
        "a port the job binds was taken on this node: leave --master-port to fleetctl (it "
        "claims a free one) or free the port",
    ),
    (
        re.compile(r"No space left on device|\[Errno 28\]"),
        "the node's disk is full where the job writes: free space, or point the job's output "
        "elsewhere",
    ),
)


def hint_for(lines: Sequence[str]) -> str | None:
    """The hint for the first well-known error in ``lines`` (a rank's last words), else None.
    The exception line is read first: the error that ended the rank, not one it survived."""
    ordered = list(reversed(lines))
    for line in ordered:
        for pattern, text in HINTS:
            m = pattern.search(line)
            if m:
                return text.format(*(g or "" for g in m.groups()))
    return None
