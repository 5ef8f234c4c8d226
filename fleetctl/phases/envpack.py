"""conda-pack archives on the controller: their sha256 (cached) and what a node's check means.

The sha256 names the env on every node (``W/envs/<sha256>/``), so two pushes of the same
archive agree without comparing anything else; hashing a multi-GB archive takes seconds, so the
result is cached by (path, size, mtime).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from fleetctl.errors import UsageError
from fleetctl.phases.codesync import cache_dir


@dataclass(frozen=True)
class EnvArchive:
    """One conda-pack archive as the controller sees it."""

    path: Path
    sha256: str
    size: int


def archive_info(path: str | Path) -> EnvArchive:
    """sha256 and size of an archive; raises UsageError when it cannot be read."""
    p = Path(path).expanduser().resolve()
    try:
        st = p.stat()
    except OSError as e:
        raise UsageError(f"env archive {p}: {e.strerror}") from e
    if not p.is_file():
        raise UsageError(f"env archive {p} is not a file")
    cache_file = cache_dir() / "archive-sha256.json"
    cache: dict[str, list] = {}
    with contextlib.suppress(OSError, ValueError):
        cache = json.loads(cache_file.read_text())
    key = [st.st_size, st.st_mtime_ns]
    hit = cache.get(str(p))
    if hit and hit[:2] == key:
        return EnvArchive(p, hit[2], st.st_size)
    h = hashlib.sha256()
    try:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        raise UsageError(f"env archive {p}: {e.strerror}") from e
    cache[str(p)] = [*key, h.hexdigest()]
    with contextlib.suppress(OSError):
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, cache_file)
    return EnvArchive(p, h.hexdigest(), st.st_size)


def nccl_version(code: int) -> str:
    """``ncclGetVersion``'s integer as a dotted version: 22703 -> 2.27.3, 2708 -> 2.7.8.

    NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older ones major*1000 + minor*100 + patch.
    """
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
