"""Files parsed once per version of the file, for every connection of a fan-out.

ssh_config and known_hosts are read by each of N connections; parsing them once per
(mtime, size, inode) keeps N connections from costing N parses (N × N key parses for a
known_hosts that lists the fleet). Thread-safe; a changed file is parsed again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class FileCache(Generic[T]):
    """``get(path)``: ``parse(path)``, reused while the file is unchanged."""

    def __init__(self, parse: Callable[[str], T]) -> None:
        self._parse = parse
        self._parsed: dict[str, tuple[tuple[int, int, int], T]] = {}
        self._lock = threading.Lock()

    def get(self, path: str) -> T:
        """Raises OSError when the file cannot be read, and whatever ``parse`` raises."""
        st = os.stat(path)
        version = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            hit = self._parsed.get(path)
        if hit is not None and hit[0] == version:
            return hit[1]
        value = self._parse(path)
        with self._lock:
            self._parsed[path] = (version, value)
        return value
