"""The controller's end of a node's tar stream: unpack it safely and completely, or not at all.

Remote names are never trusted (absolute paths, ``..``, links and special files are refused;
nothing is written outside the node's folder). Each file goes to a marked partial name
(``.fleetctl-part-NAME.SIZE.MTIME.part``) and is renamed when complete, with the node's mtime;
what is home (size, mtime) and what is half home tell the node's ``pack`` what to send next.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from fleetctl.errors import CollectError
from fleetctl.remote.kit.wire import COLLECT_MANIFEST  # the same name at both ends

PART_PREFIX = ".fleetctl-part-"  # files being received: .fleetctl-part-NAME.SIZE.MTIME.part
PART_RE = re.compile(r"^\.fleetctl-part-(.+)\.(\d+)\.(\d+)\.part$")
RESUME_MIN = 1 << 20  # a broken transfer keeps a partial copy this big, to resume from
OFFSET_KEY = "fleetctl.offset"  # pax header: the member is the file's tail from this byte
MAX_MANIFEST = 64 << 20


def safe_member_path(name: str) -> str | None:
    """A tar member name as a safe relative POSIX path, or None if it could escape.

    Refused: empty, absolute, any ``..`` component, NUL or backslash (never a separator here).
    """
    if not name or "\0" in name or "\\" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." for p in parts):
        return None
    return "/".join(parts)


@dataclass
class Unpacked:
    """What one tar stream left in the node's folder: complete files only."""

    files: list[str] = field(default_factory=list)
    bytes: int = 0
    refused: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    error: str | None = None  # the stream broke: files after the last complete one are missing


def unpack(src: IO[bytes], dest: Path) -> Unpacked:
    """Unpack a tar stream into ``dest`` like :func:`extract_tar`, keeping what landed when
    the stream breaks (``error`` says why) instead of raising."""
    got = Unpacked()
    try:
        _unpack_into(src, dest, got)
    except (tarfile.TarError, OSError, EOFError, CollectError, ValueError) as e:
        got.error = str(e) or type(e).__name__
    return got


def extract_tar(src: IO[bytes], dest: Path) -> tuple[list[str], int, list[str]]:
    """Unpack a tar stream into ``dest``: regular files and folders only, inside ``dest`` only.

    Returns (files written, bytes, refused names). Files are written under a temp name (0600)
    in folders fleetctl made itself and renamed when complete, so a hostile stream cannot
    redirect a write and a broken one leaves no truncated file.
    """
    got = Unpacked()
    _unpack_into(src, dest, got)
    return got.files, got.bytes, got.refused


def _unpack_into(src: IO[bytes], dest: Path, got: Unpacked) -> None:
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    root = dest.resolve()
    first = True
    with tarfile.open(fileobj=src, mode="r|") as tar:
        for member in tar:
            if first and member.name == COLLECT_MANIFEST and member.isfile():
                first = False
                got.manifest = _read_manifest(tar, member)
                continue
            first = False
            rel = safe_member_path(member.name)
            if rel is None or not (member.isfile() or member.isdir()):
                got.refused.append(member.name)
                continue
            target = root.joinpath(*rel.split("/"))
            if member.isdir():
                _make_dirs(root, rel.split("/"))
                continue
            parent = _make_dirs(root, rel.split("/")[:-1])
            fobj = tar.extractfile(member) if parent is not None else None
            if (
                fobj is None
                or parent is None
                or target.name.startswith(PART_PREFIX)  # our names for partial copies
                or target.is_symlink()
                or (target.exists() and not target.is_file())
            ):
                got.refused.append(member.name)
                continue
            offset = _offset(member)
            mtime = int(member.mtime)
            part = parent / f"{PART_PREFIX}{target.name}.{offset + member.size}.{mtime}.part"
            got.bytes += _receive_file(fobj, part, target, mtime, offset)
            got.files.append(rel)


def _offset(member: tarfile.TarInfo) -> int:
    try:
        return max(0, int(member.pax_headers.get(OFFSET_KEY, "0")))
    except ValueError:
        return 0


def _receive_file(fobj: IO[bytes], part: Path, target: Path, mtime: int, offset: int) -> int:
    """Copy one member into its partial copy ``part`` (appending from ``offset`` when the
    node resumes a broken transfer), then rename it over ``target`` with the node's mtime
    (what ``fleetctl collect`` compares). A broken stream leaves no file under the real name:
    a partial copy of at least ``RESUME_MIN`` bytes stays, under its marked name, to resume."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if offset else os.O_TRUNC)
    if offset and (part.is_symlink() or not part.is_file() or part.stat().st_size != offset):
        with contextlib.suppress(OSError):
            part.unlink()
        raise CollectError(f"{target.name}: the partial copy to resume from changed")
    total = 0
    try:
        with os.fdopen(os.open(part, flags, 0o600), "ab" if offset else "wb") as out:
            while chunk := fobj.read(1 << 16):
                out.write(chunk)
                total += len(chunk)
        os.utime(part, (time.time(), mtime))
        os.replace(part, target)
    except BaseException:
        with contextlib.suppress(OSError):
            if part.stat().st_size < RESUME_MIN:
                part.unlink()
        raise
    for stale in target.parent.glob(f"{PART_PREFIX}{_glob_escape(target.name)}.*.part"):
        with contextlib.suppress(OSError):
            stale.unlink()  # partial copies of an older version of this file
    return total


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo) -> dict[str, Any] | None:
    fobj = tar.extractfile(member)
    if fobj is None or member.size > MAX_MANIFEST:
        return None
    try:
        data = json.loads(fobj.read())
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("files"), list) else None


def local_files(dest: Path) -> dict[str, list[int]]:
    """The node folder's complete files as the node's ``pack`` compares them: size, mtime."""
    have: dict[str, list[int]] = {}
    if not dest.is_dir():
        return have
    for dirpath, dirnames, names in os.walk(dest):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        rel_dir = os.path.relpath(dirpath, dest)
        for name in names:
            if name.startswith(PART_PREFIX):
                continue
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if os.path.isfile(os.path.join(dirpath, name)) and not os.path.islink(
                os.path.join(dirpath, name)
            ):
                rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
                have[rel] = [st.st_size, int(st.st_mtime)]
    return have


def partial_files(dest: Path) -> dict[str, list[int]]:
    """Partial copies a broken transfer left: rel path -> [size, mtime, bytes home]."""
    partial: dict[str, list[int]] = {}
    if not dest.is_dir():
        return partial
    for path in dest.rglob(f"{PART_PREFIX}*.part"):
        m = PART_RE.match(path.name)
        if m is None or path.is_symlink() or not path.is_file():
            continue
        rel = path.parent.relative_to(dest) / m.group(1)
        partial[rel.as_posix()] = [int(m.group(2)), int(m.group(3)), path.stat().st_size]
    return partial


def _make_dirs(root: Path, parts: list[str]) -> Path | None:
    """mkdir -p below root, refusing any component that exists as a link or non-folder."""
    cur = root
    for p in parts:
        cur = cur / p
        if cur.is_symlink():
            return None
        if not cur.exists():
            cur.mkdir(mode=0o700)
        elif not cur.is_dir():
            return None
    return cur
