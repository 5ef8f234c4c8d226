"""The machine-wide registry of labs (``/run/fleetctl-lab``): is a lab still alive, is a
lab name free, and the lock file both ``up`` and a lab's own DIR use."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fleetctl.lab import net, procs
from fleetctl.lab.constants import REGISTRY


@contextlib.contextmanager
def _locked(path: Path, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
    """flock on ``path``; ``on_wait`` hears it when another process holds it (no timeout:
    a long wait is at least not a silent one)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait(f"waiting for {path}: another fleetctl lab command holds it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _registry_entries() -> list[dict[str, Any]]:
    out = []
    if not REGISTRY.is_dir():
        return out
    for p in sorted(REGISTRY.glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def _entry_live(entry: dict[str, Any]) -> bool:
    """A registry entry counts while its creator runs or any of its namespaces/links exist."""
    if procs.same_process(entry.get("creator_pid"), entry.get("creator_start")):
        return True
    name = entry.get("name", "")
    if net.link_exists(f"{name}-m"):
        return True
    try:
        return any(n.startswith(f"{name}-") for n in os.listdir("/run/netns"))
    except OSError:
        return False


def _name_in_use(name: str) -> bool:
    """Any interface or namespace already carrying this lab-name prefix?"""
    prefix = f"{name}-"
    try:
        if any(x.startswith(prefix) for x in os.listdir("/sys/class/net")):
            return True
        return any(x.startswith(prefix) for x in os.listdir("/run/netns"))
    except FileNotFoundError:
        return False
