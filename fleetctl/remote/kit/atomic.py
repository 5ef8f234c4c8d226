"""Files written whole or not at all (temp + rename), trees flushed to disk before they are
renamed into place (``durable``), and JSON read leniently.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import json
import os
import stat
import time


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def fsync_path(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:  # a file its owner cannot read: nothing we wrote for it
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def durable(tree: str, linked: bool = True) -> None:
    """``tree``'s new files and folders on disk before it is renamed into place: a node that
    resets or loses power after a push must not keep a snapshot of empty files (ext4 delays
    the data; a VM reset left the pushed script 0 bytes, and the retry ran it: exit 0, no
    output). ``linked``: files with other links came from the previous snapshot, flushed when
    it was made (an env's archive links files among its own: every file counts there)."""
    for dirpath, _dirs, files in os.walk(tree):
        for name in files:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode) and (st.st_nlink == 1 or not linked):
                fsync_path(p)
        fsync_path(dirpath)


def read_json(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def now() -> float:
    return round(time.time(), 3)
