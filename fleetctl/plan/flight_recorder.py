"""torch's NCCL watchdog and flight recorder variables for a node's job env (pure).

Which name the flight recorder's buffer goes under depends on the node's torch: 2.11 renamed
``TORCH_NCCL_TRACE_BUFFER_SIZE`` to ``TORCH_FR_BUFFER_SIZE`` (reads both, the new one first,
and warns on every rank about the old one); older releases read only the old name.
"""

from __future__ import annotations

import posixpath

NCCL_TRACE_PREFIX = "nccl_trace_rank_"  # torch appends the global rank

FR_BUFFER_RENAMED = (2, 11)  # torch reads TORCH_FR_BUFFER_SIZE, and warns on the old name
# torch reads the new name first: set by the job under one, ours under the other must go
FR_BUFFER_NAMES = (
    ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"),
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"),
)


def nccl_trace_env(run_dir: str, *, torch: str | None = None) -> dict[str, str]:
    """torch's NCCL watchdog and flight recorder, so a collective timeout leaves a trace of
    every rank's last collectives in the node run folder (collected like any log) instead of
    a bare timeout. The job's own values (fleetctl_env, --env-var) win. docs/gpu.md says what
    each does. ``torch``: the node's torch version when the check learned it: from 2.11 the
    buffer's new name (the old one makes every rank warn: seen on an H100 with 2.11), else
    the old name, which every torch with a flight recorder reads."""
    buffer = (
        "TORCH_FR_BUFFER_SIZE"
        if version_tuple(torch) >= FR_BUFFER_RENAMED
        else "TORCH_NCCL_TRACE_BUFFER_SIZE"
    )
    return {
        buffer: "2000",  # > 0 turns the flight recorder on
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",  # the watchdog dumps it when a collective times out
        "TORCH_FR_DUMP_TEMP_FILE": posixpath.join(run_dir, NCCL_TRACE_PREFIX),  # + global rank
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",  # on a timeout: tear the process down
    }


def version_tuple(text: str | None) -> tuple[int, ...]:
    """``"2.11.0+cu130"`` -> (2, 11, 0); () when unknown."""
    parts = []
    for piece in (text or "").split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)
