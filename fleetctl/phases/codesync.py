"""Code snapshots: which files to ship, their content digest, and rsync's command line.

A snapshot is content-addressed: the digest covers every shipped file's path, kind, exec bit and
content hash, so an unchanged tree maps to the same ``W/code/<digest>/`` on every node and a
no-op push only has to ask whether that folder exists. Content hashes are cached by
(size, mtime, inode), so re-digesting an unchanged tree reads no file.
How rsync reaches a node (its ``ssh`` with fleetctl's trust settings) is the connection's
answer (``Connection.rsync_target``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from fleetctl.transport.openssh import RsyncTarget

IGNORE_FILE = ".fleetignore"
# Never shipped, whatever .gitignore says: version-control and VM state (``.vagrant/`` holds the
# VMs' private keys), fleetctl's own run folders (plan.json holds env values), virtualenvs and
# caches. A negation in the root .fleetignore (``!venv/``) brings one back on purpose.
BUILTIN_EXCLUDES = (
    ".git/",
    ".hg/",
    ".svn/",
    ".vagrant/",
    "fleet-runs/",
    ".venv/",
    "venv/",
    "__pycache__/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".tox/",
    ".nox/",
    ".ipynb_checkpoints/",
    "node_modules/",
    "*.pyc",
)
# Files that make a directory local state, whatever its name: a virtualenv, a conda env, a
# fleetctl run folder. Checked on each directory the walk (or git's list) goes through.
_STATE_MARKERS = (
    ("pyvenv.cfg", "a virtualenv"),
    ("conda-meta", "a conda environment"),
    ("connect.json", "a fleetctl run folder"),
)

MAX_FILES = 100_000  # files to ship at most: more is a data or system folder, not code


def cache_dir() -> Path:
    """Controller-side cache (file hashes, archive sha256s). ``$FLEETCTL_CACHE_DIR`` overrides."""
    base = os.environ.get("FLEETCTL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "fleetctl"
    )
    return Path(base)


# ------------------------------------------------------------------------- ignore patterns


@dataclass(frozen=True)
class _Rule:
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool


def _translate(pattern: str) -> str:
    """A gitignore glob (already stripped of ``!`` and trailing ``/``) as a regex on rel paths."""
    anchored = "/" in pattern.rstrip("/")
    pattern = pattern.lstrip("/")
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j == -1:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j
        elif c == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        else:
            out.append(re.escape(c))
        i += 1
    body = "".join(out)
    return ("^" if anchored else "^(?:.*/)?") + body + "$"


def parse_ignore(text: str) -> list[_Rule]:
    """gitignore syntax: comments, ``!`` negation, trailing ``/`` (dirs), anchoring, ``**``."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        if line.startswith("\\"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if line:
            rules.append(_Rule(re.compile(_translate(line)), negate, dir_only))
    return rules


class IgnoreMatcher:
    """Per-directory ignore files (``.gitignore``/``.fleetignore``) applied like git does."""

    def __init__(self, root: Path, names: tuple[str, ...], *, builtin: bool = False) -> None:
        self.root, self.names, self.builtin = root, names, builtin
        self._rules: dict[str, list[_Rule]] = {}

    def _rules_in(self, reldir: str) -> list[_Rule]:
        if reldir not in self._rules:
            rules: list[_Rule] = list(_BUILTIN_RULES) if self.builtin and not reldir else []
            for name in self.names:
                p = self.root / reldir / name
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    rules += parse_ignore(p.read_text(encoding="utf-8"))
            self._rules[reldir] = rules
        return self._rules[reldir]

    def _match(self, rel: str, is_dir: bool) -> bool:
        """Whether ``rel`` itself is excluded (parents are checked by the caller)."""
        parts = rel.split("/")
        verdict = False
        for depth in range(len(parts)):  # outer ignore files first, inner ones override
            reldir = "/".join(parts[:depth])
            sub = "/".join(parts[depth:])
            for rule in self._rules_in(reldir):
                if rule.dir_only and not is_dir:
                    continue
                if rule.regex.match(sub):
                    verdict = not rule.negate
        return verdict

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Git semantics: a path under an excluded directory stays excluded."""
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if self._match("/".join(parts[:i]), True):
                return True
        return self._match(rel, is_dir)


_BUILTIN_RULES = tuple(parse_ignore("\n".join(BUILTIN_EXCLUDES)))


def state_dir(path: str | os.PathLike[str]) -> str | None:
    """What local state the directory holds (never shipped), else None."""
    for marker, what in _STATE_MARKERS:
        if os.path.lexists(os.path.join(path, marker)):
            return what
    return None


def list_files(root: Path, limit: int | None = None) -> list[str]:
    """Files to ship, relative, sorted: git's view when in a work tree, plus ``.fleetignore``,
    minus the built-in excludes and directories of local state (virtualenvs, run folders).
    ``limit``: the walk stops at once past that many files and UsageError says so (``--code
    /`` walked the whole filesystem first)."""
    root = root.resolve()
    files = _git_files(root)
    if files is None:
        matcher = IgnoreMatcher(root, (".gitignore", IGNORE_FILE), builtin=True)
        files = []
        for dirpath, dirnames, filenames in os.walk(root):
            reldir = os.path.relpath(dirpath, root)
            reldir = "" if reldir == "." else reldir
            keep = []
            for d in sorted(dirnames):
                rel = f"{reldir}/{d}" if reldir else d
                full = os.path.join(dirpath, d)
                if os.path.islink(full):  # a symlink to a dir ships as a link
                    if not matcher.ignored(rel):
                        files.append(rel)
                    continue
                if not matcher.ignored(rel, True) and state_dir(full) is None:
                    keep.append(d)
            dirnames[:] = keep
            for f in filenames:
                rel = f"{reldir}/{f}" if reldir else f
                if not matcher.ignored(rel):
                    files.append(rel)
            if limit is not None and len(files) > limit:
                raise _too_many(root, f"{len(files)} files or more", limit)
    else:
        matcher = IgnoreMatcher(root, (IGNORE_FILE,), builtin=True)
        states: dict[str, bool] = {}

        def in_state_dir(rel: str) -> bool:
            parts = rel.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in states:
                    states[d] = state_dir(root / d) is not None
                if states[d]:
                    return True
            return False

        files = [f for f in files if not matcher.ignored(f) and not in_state_dir(f)]
    out = sorted(f for f in files if os.path.lexists(root / f))
    if limit is not None and len(out) > limit:
        raise _too_many(root, f"{len(out)} files", limit)
    return out


def _too_many(root: Path, count: str, limit: int) -> UsageError:
    return UsageError(
        f"code directory {root} has {count} (more than {limit}); "
        f"pass --code PROJECT_DIR or exclude data with {IGNORE_FILE}"
    )


def check_code_folder(root: str | Path, max_files: int = MAX_FILES) -> Path:
    """A folder that can be shipped as code, refused at once otherwise (UsageError, exit 2):
    not ``/``, not a home folder (every file of the user's, keys and caches included), not
    over ``max_files`` files to ship (a data or system folder). Returns it resolved."""
    return code_files(root, max_files)[0]


def code_files(root: str | Path, max_files: int = MAX_FILES) -> tuple[Path, list[str]]:
    """:func:`check_code_folder`'s folder, and the files it ships (:func:`list_files`)."""
    path = Path(root).expanduser()
    try:
        path = path.resolve(strict=True)
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop (Python < 3.13)
        raise UsageError(f"code directory {root}: cannot be read ({_why(e)})") from None
    if not path.is_dir():
        raise UsageError(f"code directory {root} is not a folder")
    if path == Path(path.anchor):
        raise UsageError(f"code directory {root} is the whole filesystem; pass --code PROJECT_DIR")
    if path in _homes() or path.parent in (Path("/home"), Path("/Users")):
        raise UsageError(
            f"code directory {root} is a home folder (its keys, caches and data would ship); "
            "pass --code PROJECT_DIR"
        )
    return path, list_files(path, limit=max_files)


def _homes() -> set[Path]:
    homes = {Path("/root")}
    with contextlib.suppress(OSError, RuntimeError, KeyError):
        homes.add(Path.home().resolve())
    return homes


def _why(e: BaseException) -> str:
    if (isinstance(e, OSError) and e.errno == errno.ELOOP) or isinstance(e, RuntimeError):
        return "a symlink loop"
    return getattr(e, "strerror", None) or str(e)


def _git_files(root: Path) -> list[str] | None:
    try:
        inside = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        out = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
            capture_output=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    names = [n.decode("utf-8", "surrogateescape") for n in out.stdout.split(b"\0") if n]
    # submodules show up as directories: ship regular files and symlinks only
    return [n for n in names if not (root / n).is_dir() or (root / n).is_symlink()]


# ---------------------------------------------------------------------------- the snapshot


@dataclass(frozen=True)
class CodeSnapshot:
    """A code tree as shipped: ``manifest`` maps rel path -> [kind, sha256/target, mode]."""

    root: Path
    digest: str
    files: tuple[str, ...]
    total_bytes: int
    manifest: dict[str, list] = field(hash=False, compare=False)
    # (rel path, size) of files that look like checkpoints or data (``bulky_files``)
    bulky: tuple[tuple[str, int], ...] = field(default=(), hash=False, compare=False)


class _HashCache:
    """(size, mtime_ns, inode) -> sha256 for files under any tree; one small JSON file."""

    def __init__(self) -> None:
        self.path = cache_dir() / "filehash.json"
        self.data: dict[str, list] = {}
        self.dirty = False
        with contextlib.suppress(OSError, ValueError):
            self.data = json.loads(self.path.read_text())

    def sha(self, path: str, st: os.stat_result) -> tuple[str, bool]:
        """The content hash, and whether the file holds a private key anywhere (same read).
        An unchanged file (size, mtime, inode) is neither hashed nor scanned again."""
        key = [st.st_size, st.st_mtime_ns, st.st_ino]
        hit = self.data.get(path)
        if hit and hit[:3] == key and len(hit) == 6 and hit[5] == _SCAN_VERSION:
            return hit[3], bool(hit[4])
        # imported for a file to scan only: its patterns' compile is ~5 ms of CPU, and a
        # check or a run whose code did not change scans nothing
        from fleetctl.remote.kit.keyscan import KeyScan

        h = hashlib.sha256()
        scan = KeyScan()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                scan.feed(chunk)
                h.update(chunk)
        self.data[path] = [*key, h.hexdigest(), scan.found, _SCAN_VERSION]
        self.dirty = True
        return h.hexdigest(), scan.found

    def save(self) -> None:
        if not self.dirty:
            return
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.path)


_KEY_NAME = re.compile(r"(?:^|/)id_(?:rsa|dsa|ecdsa|ed25519)(?:_sk)?$")
# cache entries from an older scan (2: no BOM, no key inside a string) are scanned again
_SCAN_VERSION = 3


# what a checkpoint or a data set is saved as; any file past BULKY_BYTES counts too
BULKY_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".npy", ".npz", ".h5", ".hdf5")
BULKY_BYTES = 100 * 1000 * 1000


def is_bulky(rel: str, size: int) -> bool:
    """Whether a code folder's file looks like a checkpoint or data, not code: pushed as code,
    it goes to every node, and a checkpoint rewritten locally makes every push a new snapshot."""
    return size > BULKY_BYTES or rel.lower().endswith(BULKY_SUFFIXES)


def bulky_warning(snap: CodeSnapshot, shown: int = 3) -> str | None:
    """The one-line warning naming a snapshot's checkpoint/data files (None: there are none)."""
    if not snap.bulky:
        return None
    from fleetctl.phases.envpack import human_bytes

    biggest = sorted(snap.bulky, key=lambda f: (-f[1], f[0]))
    names = ", ".join(f"{rel} ({human_bytes(size)})" for rel, size in biggest[:shown])
    more = f" (+{len(biggest) - shown} more)" if len(biggest) > shown else ""
    return (
        f"code directory {snap.root} holds {len(biggest)} file(s) that look like checkpoints "
        f"or data, pushed as code to every node: {names}{more}; exclude them in {IGNORE_FILE} "
        "unless the job reads them (a job's own checkpoints stay in its work folder on the nodes)"
    )


class SecretError(UsageError):
    """The code folder would ship files that look like private keys."""


def check_code_dir(root: str | os.PathLike[str]) -> None:
    """The code directory is a folder: UsageError at once, a symlink loop included (its
    ``resolve()`` raised RuntimeError: a traceback)."""
    where = os.path.abspath(os.path.expanduser(os.fspath(root)))
    try:
        is_dir = os.path.isdir(where) and os.stat(where) is not None
    except OSError as e:  # a symlink loop
        raise UsageError(f"code directory {where}: {os.strerror(e.errno or 0)}") from None
    if not is_dir:
        raise UsageError(f"code directory {where} does not exist or is not a folder")


def snapshot(
    root: str | Path, *, max_files: int = MAX_FILES, allow_secrets: Iterable[str] = ()
) -> CodeSnapshot:
    """List and hash the tree; raises UsageError when it is not a readable directory or is
    implausibly large for a project (pushing ``~`` or ``/`` by accident), and SecretError when
    it holds files that look like private keys, unless each is named in ``allow_secrets``
    (paths relative to ``root``)."""
    check_code_dir(root)
    root, files = code_files(root, max_files)
    cache = _HashCache()
    manifest: dict[str, list] = {}
    total = 0
    digest = hashlib.sha256()
    allowed = {os.path.normpath(a) for a in allow_secrets}
    secrets: list[str] = []
    bulky: list[tuple[str, int]] = []
    for rel in files:
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                entry = ["l", os.readlink(full), 0o777]
            elif stat.S_ISREG(st.st_mode):
                sha, secret = cache.sha(full, st)
                if (secret or _KEY_NAME.search(rel)) and rel not in allowed:
                    secrets.append(rel)
                entry = ["f", sha, 0o755 if st.st_mode & 0o111 else 0o644]
                total += st.st_size
                if is_bulky(rel, st.st_size):
                    bulky.append((rel, st.st_size))
            else:
                continue
        except OSError as e:
            raise UsageError(f"cannot read {full}: {e.strerror}") from e
        manifest[rel] = entry
        digest.update(
            f"{rel}\0{entry[0]}\0{entry[1]}\0{entry[2]:o}\n".encode("utf-8", "surrogateescape")
        )
    cache.save()
    if secrets:
        shown = ", ".join(secrets[:5]) + (
            f" (+{len(secrets) - 5} more)" if len(secrets) > 5 else ""
        )
        raise SecretError(
            f"code directory {root} holds {len(secrets)} file(s) that look like private keys: "
            f"{shown}; exclude them in {IGNORE_FILE}, or ship one on purpose with "
            "--allow-secret PATH"
        )
    return CodeSnapshot(
        root, digest.hexdigest()[:32], tuple(manifest), total, manifest, tuple(bulky)
    )


# ----------------------------------------------------------------------- rsync


def rsync_argv(
    target: RsyncTarget,
    src: Path,
    *,
    files_from: str,
    link_dest: str | None,
    io_timeout: int,
) -> list[str]:
    """rsync of the listed files into ``target`` (a fresh temp dir on the node, as its
    connection reaches it), hard-linking unchanged files from ``link_dest`` (the newest
    previous snapshot) so only changes cross the wire."""
    argv = [
        "rsync",
        "-a",
        "--from0",
        f"--files-from={files_from}",
        "--stats",
        "--info=progress2",
        "--no-human-readable",
        f"--timeout={io_timeout}",
    ]
    if link_dest:
        argv.append(f"--link-dest={link_dest}")
    return [*argv, *target.options, f"{src}/", target.dest]
