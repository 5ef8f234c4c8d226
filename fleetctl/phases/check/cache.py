"""The check cache: passing reports kept for a short time per fleet + options, so ``run``
right after ``check`` is instant (the key is :func:`fleetctl.phases.check.preflight.cache_key`)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

from fleetctl.phases.check.report import CheckOptions, CheckReport


def cache_dir(options: CheckOptions) -> Path:
    """``check/`` in the controller's one cache folder (``$FLEETCTL_CACHE_DIR`` overrides, as
    for the push's file hashes)."""
    if options.cache_dir:
        return Path(options.cache_dir)
    from fleetctl.phases.codesync import cache_dir as controller_cache

    return controller_cache() / "check"


def load_cached(key: str, options: CheckOptions) -> CheckReport | None:
    if options.recheck or options.cache_ttl <= 0:
        return None
    path = cache_dir(options) / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        age = time.time() - float(data["checked_at"])
        if not 0 <= age <= options.cache_ttl or not data.get("ok"):
            return None
        report = CheckReport.from_dict(data)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    report.cached = True
    return report


def save_cached(key: str, report: CheckReport, options: CheckOptions) -> None:
    """Only passing reports are kept: a failure must be re-checked once fixed. A failure also
    drops every kept pass that covers a host it failed on, whatever the options: a GPU that
    another job took after ``run`` passed must not pass the next ``run`` from the cache (seen
    on a real H100: ``check`` said busy, ``run`` took its 30 s old pass)."""
    if options.cache_ttl <= 0:
        return
    if not report.ok:
        _forget(cache_dir(options), {h for h, _, _ in report.failures})
        return
    folder = cache_dir(options)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".{key}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(report.to_dict(), fh)
        os.replace(tmp, folder / f"{key}.json")
    except OSError:
        return  # a cache that cannot be written only costs time


def _forget(folder: Path, hosts: set[str]) -> None:
    """Remove the kept passes that include any of ``hosts`` (a handful of small files)."""
    if not hosts:
        return
    try:
        paths = [p for p in folder.glob("*.json") if not p.name.startswith(".")]
    except OSError:
        return
    for path in paths:
        try:
            data = json.loads(path.read_text())
            covered = {h.get("host") for h in data.get("hosts") or [] if isinstance(h, dict)}
        except (OSError, ValueError, AttributeError):
            continue
        if covered & hosts:
            with contextlib.suppress(OSError):
                path.unlink()
