"""The push helper's checkpoint relay (``relay-pack`` / ``relay-apply``), see below.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import errno
import os

from .atomic import durable, fsync_path
from .finalize import fetch, sha256_file
from .keyscan import KeyScan
from .pushbase import Failed, rmtree, workdirs
from .workdirs import workdir_id

# A retry's nodes get what the job wrote into its work folder on the node of rank 0
# (pytorch/examples' snapshot.pt, Lightning's and HF Trainer's checkpoint folders): ``relay-pack``
# there lists the regular files that differ from the code snapshot the folder was seeded from
# (``__pycache__`` and private-key look-alikes left out), with their sizes and sha256 when asked
# (``manifest``), and tars them (or the ``only`` ones) into ``W/envs/.tmp-relay-*.tar``;
# ``relay-have`` on a node of the retry answers which of the listed files it already holds (same
# size and sha256: a node the last retry relayed to needs nothing again); ``relay-apply`` on
# each node of the retry seeds its work folder as the supervisor would, takes the tar (uploaded,
# or fetched from a peer and sha-checked) and writes each file under a temp name and renames it,
# so nodes of one shared home may do it at once. A node reading the source's workdir id shares
# its folder: nothing to do.

RELAY_SKIP_DIRS = ("__pycache__",)
RELAY_KEY_NAMES = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk")
RELAY_LISTED = 200  # file names in the answer; the count and bytes cover every file


def relay_paths(cfg: dict) -> tuple[str, str, str]:
    """(workdir, the job's work folder, the folder relayed: the work folder, or ``dir``
    relative to the folder the job runs in, ``cwd``: the script's own inside the work folder)."""
    w = os.path.abspath(os.path.expanduser(cfg["workdir"]))
    work = os.path.abspath(os.path.expanduser(cfg["work"]))
    sub = cfg.get("dir")
    root = work
    if sub:
        sub = os.path.expanduser(sub)
        cwd = os.path.abspath(os.path.expanduser(cfg.get("cwd") or work))
        root = os.path.normpath(sub if os.path.isabs(sub) else os.path.join(cwd, sub))
    inside = root == w or root.startswith(w + os.sep)
    if w.startswith(root + os.sep) or (
        inside and not (root == work or root.startswith(work + os.sep))
    ):
        raise Failed("relay", f"the checkpoint folder {root} holds fleetctl's own files")
    return w, work, root


def looks_secret(path: str, name: str) -> bool:
    """A private key by name or anywhere in the file: the code push's scan (keyscan.py), so a
    key the push refuses is not relayed to a retry's nodes either."""
    if name in RELAY_KEY_NAMES:
        return True
    scan = KeyScan()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                scan.feed(chunk)
                if scan.found:
                    return True
    except OSError:
        return False
    return scan.found


def relay_files(
    work: str, root: str, seed: str | None, allowed: set, since: float | None = None
) -> tuple[list, list]:
    """[(name relative to root, size)] new or changed against the seed; secrets left out.
    A seed that is gone (an old job's snapshot, pruned since: ``run --resume``) tells nothing
    apart: then only files written from ``since`` on (the job's start; the work folder's
    copy of the code keeps the code's times) count, so the old code never overwrites the new."""
    import stat

    if seed and since is not None and not os.path.isdir(seed):
        seed = None
    else:
        since = None
    out, secrets = [], []
    for dirpath, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in RELAY_SKIP_DIRS)
        for name in sorted(names):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or name.endswith(".pyc"):
                continue
            if since is not None and st.st_mtime < since:
                continue
            rel = os.path.relpath(path, root)
            in_work = path.startswith(work + os.sep)
            if seed and in_work:
                try:
                    old = os.lstat(os.path.join(seed, os.path.relpath(path, work)))
                    if old.st_size == st.st_size and old.st_mtime_ns == st.st_mtime_ns:
                        continue  # the code as pushed
                except OSError:
                    pass
            if (
                looks_secret(path, name)
                and (os.path.relpath(path, work) if in_work else rel) not in allowed
            ):
                secrets.append(rel)
                continue
            out.append((rel, st.st_size))
    return out, secrets


def relay_pack(cfg: dict) -> dict:
    import tarfile

    w, work, root = relay_paths(cfg)
    seed = os.path.abspath(os.path.expanduser(cfg["seed"])) if cfg.get("seed") else None
    out = {"workdir_id": workdir_id(w), "root": root, "files": [], "count": 0, "bytes": 0}
    if not os.path.isdir(root):
        return out
    since = cfg.get("since")
    allowed = set(cfg.get("allow_secrets") or ())
    files, secrets = relay_files(work, root, seed, allowed, None if since is None else float(since))
    if cfg.get("only") is not None:
        only = set(cfg["only"])
        files = [(rel, size) for rel, size in files if rel in only]
    total = sum(size for _rel, size in files)
    out.update(files=[rel for rel, _s in files[:RELAY_LISTED]], count=len(files), bytes=total)
    out["secrets"] = secrets
    if not files or total > int(cfg["max_bytes"]):
        return out
    if cfg.get("manifest"):
        out["manifest"] = {rel: [size, sha256_file(os.path.join(root, rel))] for rel, size in files}
    if not cfg.get("pack", True):
        return out
    envs_root = workdirs(cfg)[2]
    tar = os.path.join(envs_root, cfg["tar"])
    try:
        with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as tf:
            for rel, _size in files:
                tf.add(os.path.join(root, rel), arcname=rel, recursive=False)
    except OSError as e:
        rmtree(tar)
        raise Failed("relay", f"cannot pack {root}: {e}", e.errno == errno.ENOSPC) from e
    out.update(tar=tar, size=os.path.getsize(tar), sha=sha256_file(tar))
    return out


def relay_have(cfg: dict) -> dict:
    """Which of the source's files (``manifest``: name -> [size, sha256]) this node's folder
    already holds, byte for byte; the sha256 is read only where the size matches."""
    import stat

    w, _work, root = relay_paths(cfg)
    if cfg.get("source_id") and workdir_id(w) == cfg["source_id"]:
        return {"shared": True}
    real = os.path.realpath(root)
    have = []
    for rel, (size, sha) in sorted((cfg.get("manifest") or {}).items()):
        path = os.path.join(root, rel)
        if rel.startswith("/") or ".." in rel.split("/"):
            continue
        if not os.path.realpath(path).startswith(real + os.sep):
            continue
        try:
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode) and st.st_size == size and sha256_file(path) == sha:
                have.append(rel)
        except OSError:
            continue
    return {"have": have}


def seed_work(work: str, seed: str | None) -> None:
    """The supervisor's ``seed_work_folder``: the work folder starts as a copy of the code."""
    if os.path.isdir(work):
        return
    import shutil

    parent = os.path.dirname(work)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    if not seed or not os.path.isdir(seed):
        os.makedirs(work, mode=0o700, exist_ok=True)
        return
    tmp = os.path.join(parent, f".tmp-{os.path.basename(work)}-{os.getpid()}-{os.urandom(4).hex()}")
    shutil.copytree(seed, tmp, symlinks=True)
    os.chmod(tmp, 0o700)
    durable(tmp, linked=False)  # as the supervisor's: the folder is the mark, its files first
    try:
        os.rename(tmp, work)
    except OSError:  # another node of a shared home made it first: the same copy
        rmtree(tmp)
        if not os.path.isdir(work):
            raise
    fsync_path(parent)


def relay_unpack(tar: str, root: str) -> tuple[int, int]:
    """Regular files only, each under a temp name, flushed, then renamed; a name that leaves
    ``root`` stops it."""
    import shutil
    import tarfile

    real = os.path.realpath(root)
    count = size = 0
    folders: set = set()
    with tarfile.open(tar, "r:") as tf:
        for m in tf:
            if not m.isfile():
                continue
            parts = m.name.split("/")
            target = os.path.realpath(os.path.join(root, m.name))
            if m.name.startswith("/") or ".." in parts or not target.startswith(real + os.sep):
                raise Failed("relay", f"archive member escapes the folder: {m.name}")
            folder = os.path.dirname(target)
            os.makedirs(folder, mode=0o700, exist_ok=True)
            tmp = os.path.join(folder, f".{parts[-1]}.relay-{os.urandom(4).hex()}")
            try:
                src = tf.extractfile(m)
                assert src is not None
                with open(tmp, "wb") as f:
                    shutil.copyfileobj(src, f, 1 << 20)
                    f.flush()
                    os.fsync(f.fileno())  # on disk before it replaces a good checkpoint
                os.chmod(tmp, (m.mode & 0o777) or 0o600)
                os.utime(tmp, (m.mtime, m.mtime))
                os.replace(tmp, target)
            except BaseException:
                rmtree(tmp)
                raise
            while folder not in folders and folder.startswith(real + os.sep):  # new ones too
                folders.add(folder)
                folder = os.path.dirname(folder)
            count, size = count + 1, size + m.size
    for folder in sorted(folders | {real}):  # the renames, before a retry counts the files
        fsync_path(folder)
    return count, size


def relay_apply(cfg: dict) -> dict:
    w, work, root = relay_paths(cfg)
    envs_root = workdirs(cfg)[2]
    tar = os.path.join(envs_root, cfg["tar"])
    try:
        if cfg.get("source_id") and workdir_id(w) == cfg["source_id"]:
            return {"shared": True}
        seed_work(
            work, os.path.abspath(os.path.expanduser(cfg["seed"])) if cfg.get("seed") else None
        )
        os.makedirs(root, mode=0o700, exist_ok=True)
        out = {}
        if cfg.get("fetch"):
            got = fetch(
                cfg["fetch"], tar, cfg["sha"], int(cfg["size"]), cfg.get("fetch_timeout", 60)
            )
            out["peer"] = got["peer"]
        elif sha256_file(tar) != cfg["sha"]:
            raise Failed("relay", "the uploaded archive's sha256 does not match")
        out["files"], out["bytes"] = relay_unpack(tar, root)
        return out
    except OSError as e:
        raise Failed("relay", str(e), e.errno == errno.ENOSPC) from e
    finally:
        rmtree(tar)
