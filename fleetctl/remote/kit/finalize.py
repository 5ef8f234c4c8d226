"""The push helper's ``finalize``: a code snapshot (an rsynced temp dir renamed, or an
uploaded tar unpacked with hard links to the previous snapshot) and an env (an archive
fetched from a peer or uploaded, sha256-checked, unpacked, its prefixes rewritten for the
final location, renamed, verified).

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import errno
import os
import sys
import time

from .atomic import durable, fsync_path
from .pushbase import Failed, dumps, free_bytes, rmtree, verify_env, workdirs


def safe_members(tf: tarfile.TarFile, dest: str) -> list:  # noqa: F821 - imported in extract
    root = os.path.realpath(dest)
    members = []
    for m in tf.getmembers():
        target = os.path.realpath(os.path.join(dest, m.name))
        if m.name.startswith("/") or not (target == root or target.startswith(root + os.sep)):
            raise Failed("unpack", f"archive member escapes the target dir: {m.name}")
        if m.isdev():
            continue
        members.append(m)
    return members


def extract(archive: str, dest: str) -> None:
    import tarfile

    with tarfile.open(archive, "r:*") as tf:
        members = safe_members(tf, dest)
        if sys.version_info >= (3, 12):
            tf.extractall(dest, members=members, filter="fully_trusted")
        else:
            tf.extractall(dest, members=members)


def finalize_code(cfg: dict, code_root: str) -> str:
    digest, tmp_name = cfg["digest"], cfg["tmp"]
    final, tmp = os.path.join(code_root, digest), os.path.join(code_root, tmp_name)
    manifest = cfg["manifest"]
    try:
        if cfg.get("tar"):  # SFTP fallback: changed files in a tar, the rest linked from prev
            tar_path = os.path.join(code_root, cfg["tar"])
            os.makedirs(tmp, exist_ok=True)
            prev = os.path.join(code_root, cfg["prev"]) if cfg.get("prev") else None
            for rel in cfg.get("reuse", []):
                src, dst = os.path.join(prev, rel), os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                try:
                    os.link(src, dst, follow_symlinks=False)
                except OSError:
                    if os.path.islink(src):
                        os.symlink(os.readlink(src), dst)
                    else:
                        import shutil

                        shutil.copy2(src, dst)
            extract(tar_path, tmp)
            rmtree(tar_path)
        missing = [rel for rel in manifest if not os.path.lexists(os.path.join(tmp, rel))]
        if missing and not os.path.isdir(final):
            raise Failed(
                "code",
                f"snapshot incomplete: {len(missing)} files missing (e.g. {missing[0]})",
            )
        if os.path.isdir(final):  # a concurrent push finished first: same content
            rmtree(tmp)
        else:
            durable(tmp)
            try:
                os.rename(tmp, final)
            except OSError as e:  # ... or finished between our look and our rename
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not os.path.isdir(final):
                    raise
                rmtree(tmp)
            fsync_path(code_root)  # the rename itself
        mpath = os.path.join(code_root, ".manifests", digest + ".json")
        part = f"{mpath}.{os.getpid()}.{os.urandom(3).hex()}.part"  # two pushes: two names
        with open(part, "w") as f:  # what the next push links from: on disk, as the snapshot
            f.write(dumps(manifest))
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, mpath)
        fsync_path(os.path.dirname(mpath))  # the rename itself
        os.utime(final)
    except BaseException as e:
        rmtree(tmp)
        if cfg.get("tar"):
            rmtree(os.path.join(code_root, cfg["tar"]))
        if isinstance(e, Failed):
            raise
        if isinstance(e, OSError):
            raise Failed("code", str(e), e.errno == errno.ENOSPC) from e
        raise
    return final


def fetch(src: dict, dest: str, sha: str, size: int, timeout: float) -> dict:
    """Download the archive from a peer, verifying size and sha256 before accepting it."""
    import hashlib
    import http.client

    part = dest + ".part"
    errors = []
    for peer in src["peers"]:
        t0 = time.time()
        try:
            conn = http.client.HTTPConnection(peer["host"], int(peer["port"]), timeout=timeout)
            conn.request("GET", "/" + sha, headers={"Authorization": "Bearer " + peer["token"]})
            resp = conn.getresponse()
            if resp.status != 200:
                raise OSError(f"HTTP {resp.status}")
            h, n = hashlib.sha256(), 0
            with open(part, "wb") as f:
                while True:
                    chunk = resp.read(1 << 20)
                    if not chunk:
                        break
                    f.write(chunk)
                    h.update(chunk)
                    n += len(chunk)
            conn.close()
            if n != size:
                raise OSError(f"got {n} of {size} bytes")
            if h.hexdigest() != sha:
                raise OSError("sha256 mismatch")
            os.rename(part, dest)
            return {"peer": peer["name"], "bytes": n, "seconds": round(time.time() - t0, 3)}
        except OSError as e:
            rmtree(part)
            if e.errno == errno.ENOSPC:
                raise Failed("fetch", "no space left on device", True) from e
            errors.append("{}: {}".format(peer["name"], e))
    raise Failed("fetch", "; ".join(errors) or "no peer")


def sha256_file(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return h.hexdigest()
            h.update(chunk)


def rewrite_prefixes(tmp: str, final: str) -> int:
    """conda-unpack's own rewrite, but for the FINAL location while files sit in ``tmp``.

    Running ``bin/conda-unpack`` in the temp dir would bake the temp path into every file; so
    load its prefix records and ``update_prefix`` (no ``__main__`` block) and apply them here.
    """
    import runpy

    script = os.path.join(tmp, "bin", "conda-unpack")
    if not os.path.exists(script):
        return 0
    bindir = os.path.join(tmp, "bin")
    sys.path.insert(0, bindir)
    try:
        g = runpy.run_path(script, run_name="conda_unpack")
    finally:
        sys.path.remove(bindir)
        sys.modules.pop("conda_unpack_progress", None)
    records = g["_prefix_records"]
    for path, placeholder, mode in records:
        g["update_prefix"](os.path.join(tmp, path), final, placeholder, mode=mode)
    return len(records)


def unpack_lock(envs_root: str, sha: str, timeout: float):  # type: ignore[no-untyped-def]
    """One unpack of an env at a time per workdir: nodes sharing a home (NFS) wait for the
    first one's unpack and then find the env there, instead of unpacking it N times. A POSIX
    lock (works over NFS); past ``timeout`` we go on without it (the rename stays atomic)."""
    import contextlib
    import fcntl

    @contextlib.contextmanager
    def held():  # type: ignore[no-untyped-def]
        locks = os.path.join(os.path.dirname(envs_root.rstrip("/")), "locks")  # W/locks/
        os.makedirs(locks, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(locks, f"env-{sha[:16]}"), os.O_CREAT | os.O_RDWR, 0o600)
        deadline = time.monotonic() + timeout
        locked = False
        try:
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    locked = True
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
            yield locked
        finally:
            if locked:
                with contextlib.suppress(OSError):
                    fcntl.lockf(fd, fcntl.LOCK_UN)
            os.close(fd)

    return held()


def finalize_env(cfg: dict, envs_root: str) -> dict:
    with unpack_lock(envs_root, cfg["sha"], float(cfg.get("lock_timeout", 1800))):
        return _finalize_env(cfg, envs_root)


def _finalize_env(cfg: dict, envs_root: str) -> dict:
    sha = cfg["sha"]
    final = os.path.join(envs_root, sha)
    archive = os.path.join(envs_root, cfg["archive"])
    out = {"env_dir": final}
    if os.path.isdir(final):
        if not cfg.get("keep_archive"):
            rmtree(archive)
        return out
    tmp = os.path.join(envs_root, f".tmp-{sha[:16]}-{os.urandom(4).hex()}")
    ok = False
    try:
        if cfg.get("fetch"):
            out["fetched"] = fetch(
                cfg["fetch"], archive, sha, int(cfg["size"]), float(cfg.get("fetch_timeout", 600))
            )
        elif sha256_file(archive) != sha:
            raise Failed("upload", "uploaded archive does not match its sha256")
        os.makedirs(tmp)
        try:
            extract(archive, tmp)
        except Failed:
            raise
        except Exception as e:  # tarfile/zlib/EOF errors of a damaged archive, ENOSPC
            full = getattr(e, "errno", None) == errno.ENOSPC
            raise Failed("unpack", f"unpacking failed: {type(e).__name__}: {e}", full) from e
        try:
            out["prefixes_rewritten"] = rewrite_prefixes(tmp, final)
        except OSError as e:
            raise Failed("unpack", f"conda-unpack failed: {e}", e.errno == errno.ENOSPC) from e
        except Exception as e:
            raise Failed("unpack", f"conda-unpack failed: {type(e).__name__}: {e}") from e
        if os.path.isdir(final):
            rmtree(tmp)
        else:
            # The env's folder is the mark that it is present (probe, push, launch): its
            # files on disk first, or a reset leaves an env of empty files that counts.
            try:
                durable(tmp, linked=False)
            except OSError as e:  # delayed allocation's ENOSPC (or an EIO) shows at fsync
                raise Failed(
                    "unpack", f"flushing the env failed: {e}", e.errno == errno.ENOSPC
                ) from e
            os.rename(tmp, final)
            fsync_path(envs_root)  # the rename itself
        ok = True
    finally:
        if not ok:
            rmtree(tmp)
        if not ok or not cfg.get("keep_archive"):
            rmtree(archive)
            rmtree(archive + ".part")
    return out


def finalize(cfg: dict) -> dict:
    w, code_root, envs_root = workdirs(cfg)
    out = {"workdir": w}
    if cfg.get("code"):
        out["code_dir"] = finalize_code(cfg["code"], code_root)
    if cfg.get("env"):
        try:
            out.update(finalize_env(cfg["env"], envs_root))
        except Failed as e:
            out.update(
                env_error=str(e), env_stage=e.stage, enospc=e.enospc, free=free_bytes(envs_root)
            )
            return out
        out["verify"] = verify_env(out["env_dir"], cfg)
    return out
