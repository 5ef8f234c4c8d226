"""The supervisor's ``pack`` mode: the run folder as a ``T`` frame and a tar (regular files
and folders only; capped, excluded, what is home already skipped, a manifest first).

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import io
import json
import os
import time

from .modes import parse_opts
from .wire import COLLECT_MANIFEST, CONSOLE_LOG, STATE_FILE, TAR_MARKER

LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".json", ".jsonl")
MAX_OPTIONS = 64 << 20  # bytes of collect options on stdin (the controller's file list)


def cmd_pack(argv: list[str]) -> int:
    """The run folder as a tar stream on stdout after a ``T`` frame: regular files and folders
    only, no links. Nothing at all when there is no run folder (exit 3). ``--stdin 1``: what to
    send (cap, excludes, files already home) comes as one JSON line on stdin."""
    opts = parse_opts(argv)
    root = os.path.abspath(os.path.expanduser(opts["run_dir"]))
    collect = None
    if opts.get("stdin") == "1":
        collect = _read_collect_options(0)
    if not os.path.isdir(root):
        return 3
    os.write(1, TAR_MARKER)
    pack_dir(root, 1, collect)
    return 0


def _read_collect_options(fd: int) -> dict:
    """One JSON line (``max``, ``exclude``, ``have``) from ``fd``; {} when there is none."""
    buf = b""
    while b"\n" not in buf and len(buf) < MAX_OPTIONS:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        buf += chunk
    try:
        data = json.loads(buf.split(b"\n", 1)[0].decode("utf-8") or "{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _collect_class(rel: str) -> int:
    """Send order: the supervisor's record and the console, then logs, then everything else
    (so a cap or a broken transfer costs big job files, never the logs)."""
    if rel in (STATE_FILE, CONSOLE_LOG):
        return 0
    name = rel.rsplit("/", 1)[-1]
    folders = rel.split("/")[:-1]
    if (
        name.endswith(LOG_SUFFIXES)
        or name.startswith(("workerlog", "stdout", "stderr", "endpoints"))
        or any(f in ("log", "logs", "stacks") for f in folders)
    ):
        return 1
    return 2


def collect_plan(root: str, options: dict | None = None) -> tuple[list[str], list[dict]]:
    """What ``pack`` sends from ``root``: (folders, files in send order).

    Each file is ``{"path", "size", "mtime"}`` plus ``"send": true`` or a ``"reason"``:
    ``excluded`` (with the ``glob``), ``home`` (same size and mtime as the controller's copy
    in ``have``), ``over cap`` (the node's files, home ones included, would exceed ``max``
    bytes; small files come first, so one big file never crowds out the logs). A file sent
    whose partial copy is home (``partial``: same size and mtime) gets the ``offset`` to
    resume from.
    """
    import fnmatch

    options = options or {}
    excludes = [str(g) for g in options.get("exclude") or []]
    have = options.get("have") or {}
    partial = options.get("partial") or {}
    cap = options.get("max")
    folders: list[str] = []
    files: list[dict] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir != ".":
            folders.append(rel_dir)
        for name in sorted(filenames):
            rel = name if rel_dir == "." else rel_dir + "/" + name
            if rel == COLLECT_MANIFEST:
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if _is_regular(st.st_mode):
                files.append({"path": rel, "size": st.st_size, "mtime": int(st.st_mtime)})
    files.sort(key=lambda f: (_collect_class(f["path"]), f["size"], f["path"]))
    budget = None if cap is None else int(cap)
    for f in files:
        base = f["path"].rsplit("/", 1)[-1]
        glob = next(
            (g for g in excludes if fnmatch.fnmatch(f["path"], g) or fnmatch.fnmatch(base, g)),
            None,
        )
        if glob is not None:
            f["reason"], f["glob"] = "excluded", glob
            continue
        home = have.get(f["path"]) == [f["size"], f["mtime"]]
        if budget is not None and f["size"] > budget and not home:
            f["reason"] = "over cap"
            continue
        if budget is not None:
            budget = max(0, budget - f["size"])
        if home:
            f["reason"] = "home"
            continue
        f["send"] = True
        part = partial.get(f["path"])  # a broken transfer's copy: send only the rest
        if (
            isinstance(part, list)
            and len(part) == 3
            and part[:2] == [f["size"], f["mtime"]]
            and 0 < int(part[2]) < f["size"]
        ):
            f["offset"] = int(part[2])
    return folders, files


def pack_dir(root: str, fd: int, options: dict | None = None) -> None:
    """Write ``root`` as a tar stream to ``fd``: first the manifest (every file and what
    happens to it, :func:`collect_plan`), the folders, then the files to send in order.

    Written by :class:`TarWriter`, not tarfile: importing tarfile (shutil, bz2, lzma) cost
    every node ~6 ms of CPU at the end of every job; the controller reads it with tarfile."""
    folders, files = collect_plan(root, options)
    out = os.fdopen(fd, "wb", closefd=False)
    tar = TarWriter(out)
    now = int(time.time())
    manifest = json.dumps({"version": 1, "max": (options or {}).get("max"), "files": files})
    tar.add(COLLECT_MANIFEST, io.BytesIO(manifest.encode()), len(manifest.encode()), 0o600, now)
    for rel in folders:  # folders too: launcher log trees may hold empty rank folders
        tar.add_dir(rel, 0o700, now)
    for f in files:
        if not f.get("send"):
            continue
        try:
            with open(os.path.join(root, f["path"]), "rb") as src:
                offset = f.get("offset", 0)
                pax = None
                if offset:  # resumed: the tail only (fleetctl.phases.collect.OFFSET_KEY)
                    src.seek(offset)
                    pax = {"fleetctl.offset": str(offset)}
                size = f["size"] - offset
                tar.add(f["path"], _Bounded(src, size), size, 0o600, f["mtime"], pax)
        except OSError:
            continue  # gone meanwhile: the controller sees it listed but not sent
    tar.close()
    out.flush()


class TarWriter:
    """A POSIX (pax) tar stream, as ``tarfile.open(mode="w|", format=PAX_FORMAT)`` writes it
    for regular files and folders: ustar headers, a pax header first where a name is long or
    not ASCII, a size or time does not fit, or extra keys are given."""

    BLOCK = 512
    RECORD = 20 * 512

    def __init__(self, out) -> None:  # type: ignore[no-untyped-def]
        self.out, self.written = out, 0

    def _write(self, data: bytes) -> None:
        self.out.write(data)
        self.written += len(data)

    def _pad(self, n: int) -> None:
        if n % self.BLOCK:
            self._write(b"\0" * (self.BLOCK - n % self.BLOCK))

    def _header(
        self, name: str, size: int, mode: int, mtime: int, kind: bytes, pax: dict | None
    ) -> None:
        pax = dict(pax or {})
        raw = name.encode("utf-8", "surrogateescape")
        if len(raw) > 100 or not name.isascii():
            pax["path"] = name
        if size >= 8**11:
            pax["size"] = str(size)
        if not 0 <= mtime < 8**11:
            pax["mtime"] = str(mtime)
        if pax:
            records = b"".join(_pax_record(k, v) for k, v in pax.items())
            self._write(_ustar(b"././@PaxHeader", len(records), 0o644, 0, b"x"))
            self._write(records)
            self._pad(len(records))
        safe = name.encode("ascii", "replace")[:100]
        self._write(
            _ustar(safe, 0 if size >= 8**11 else size, mode, max(0, min(mtime, 8**11 - 1)), kind)
        )

    def add(  # type: ignore[no-untyped-def]
        self, name: str, src, size: int, mode: int, mtime: int, pax: dict | None = None
    ) -> None:
        """A regular file of exactly ``size`` bytes read from ``src``."""
        self._header(name, size, mode, int(mtime), b"0", pax)
        left = size
        while left > 0:
            data = src.read(min(left, 1 << 20))
            if not data:
                data = b"\0" * min(left, 1 << 20)  # the file shrank: keep the stream whole
            self._write(data[:left])
            left -= len(data[:left])
        self._pad(size)

    def add_dir(self, name: str, mode: int, mtime: int) -> None:
        self._header(name.rstrip("/") + "/", 0, mode, int(mtime), b"5", None)

    def close(self) -> None:
        """The end: two zero blocks, then zeros to a whole record, as tarfile ends it."""
        self._write(b"\0" * (2 * self.BLOCK))
        if self.written % self.RECORD:
            self._write(b"\0" * (self.RECORD - self.written % self.RECORD))


def _ustar(name: bytes, size: int, mode: int, mtime: int, kind: bytes) -> bytes:
    h = bytearray(512)
    h[0 : len(name)] = name
    h[100:108] = b"%07o\0" % mode
    h[108:116] = b"%07o\0" % 0  # uid: the controller does not restore owners
    h[116:124] = b"%07o\0" % 0
    h[124:136] = b"%011o\0" % size
    h[136:148] = b"%011o\0" % mtime
    h[148:156] = b" " * 8  # the checksum counts its own field as spaces
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    h[148:156] = b"%06o\0 " % sum(h)
    return bytes(h)


def _pax_record(key: str, value: str) -> bytes:
    """``"<length> <key>=<value>\\n"``, where the length counts its own digits."""
    payload = b" " + key.encode("utf-8") + b"=" + value.encode("utf-8", "surrogateescape") + b"\n"
    n = len(payload) + 1
    while len(str(n)) + len(payload) != n:
        n = len(str(n)) + len(payload)
    return str(n).encode() + payload


def _is_regular(mode: int) -> bool:
    import stat

    return stat.S_ISREG(mode)


class _Bounded:
    """Reads at most ``size`` bytes, padding with NULs if the file shrank meanwhile."""

    def __init__(self, f, size: int) -> None:
        self.f, self.left = f, size

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        if len(data) < n:
            data += b"\0" * (n - len(data))
        self.left -= len(data)
        return data
