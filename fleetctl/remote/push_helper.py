"""Node side of ``fleetctl push``: one stdlib-only program, installed on the node as
``W/bin/push_helper_<sha12>.py`` and run from there with its bytecode cached
(``fleetctl.remote.cached_argv``); ``serve`` runs as ``python3 -c SRC serve``.

Kept in one file so each phase costs one remote command per node. The controller writes the
config as one JSON line on stdin (a one-time peer token must never appear in argv, which any
local user can read) and reads one ``D <json>`` frame from stdout (``serve`` first says where
it listens: ``A <json>``; see fleetctl/phases/frames.py). The env is verified by
``envinfo.py``, whose source comes in the config (``envinfo``). Runs on the node's python
(3.8+); nothing here imports fleetctl.

Modes:
  probe     what is already there (code snapshot, env, rsync, free disk); prunes old snapshots
            and stale temp dirs; verifies an env that is already present
  finalize  code: rename an rsynced temp dir, or build it from an uploaded tar plus hard links
            to the previous snapshot. env: fetch the archive from a peer (or take the uploaded
            one), check its sha256, unpack into a temp dir, rewrite prefixes for the FINAL
            location, rename; then verify (python runs, NCCL version via ncclGetVersion)
  serve     short-lived HTTP server for one archive: one-time bearer token, bound to the training
            address, serves only that file, exits when stdin closes or after a timeout
  cleanup   remove this push's partial files, report free space
  relay-pack / relay-apply
            a retry's checkpoints: tar what the job wrote into its work folder on the node of
            rank 0; seed another node's work folder and unpack it there (see below)
"""

from __future__ import annotations

import errno
import os
import sys
import time

try:  # as fleetctl.remote.<name> (tests); flat in W/bin/<name>_<sha>/ on a node
    from .workdirs import workdir_id
except ImportError:
    from workdirs import workdir_id

# shutil, subprocess, tarfile, hashlib and contextlib are imported where used: a no-op push's
# probe needs none of them, and their imports were a third of its CPU on every node. Nor json:
# its import brings re and enum (~5 ms, a quarter of a no-op push probe's CPU on every node);
# the config and the answer go through json's own C half (``loads``, ``dumps``).


def loads(text: str) -> object:
    """``json.loads`` by json's C scanner; json itself where that is missing or differs."""
    try:
        import _json

        class Ctx:
            strict = True
            object_hook = object_pairs_hook = parse_constant = None
            parse_float, parse_int, memo = float, int, {}

        obj, end = _json.make_scanner(Ctx())(text, 0)
        if text[end:].strip():
            raise ValueError("extra data")
        return obj
    except Exception:  # not CPython's C half, or its signature moved: the real thing
        import json

        return json.loads(text)


def dumps(obj: object) -> str:
    """``json.dumps`` (its defaults: ASCII, ``", "``/``": "``) by json's C encoder."""
    try:
        import _json

        make = _json.make_encoder
        enc = make(None, None, _json.encode_basestring_ascii, None, ": ", ", ", False, False, True)
        return "".join(enc(obj, 0))
    except Exception:
        import json

        return json.dumps(obj)


STALE_TMP_S = 6 * 3600
STALE_IDLE_S = 15 * 60  # a temp dir nobody wrote into for this long belongs to a dead push


class Failed(Exception):
    """A step failed; ``stage`` says which, ``enospc`` whether the disk was full."""

    def __init__(self, stage: str, message: str, enospc: bool = False) -> None:
        super().__init__(message)
        self.stage, self.enospc = stage, enospc


def emit(obj: dict, kind: str = "D") -> None:
    """One frame: ``D <json>`` (the answer) or ``A <json>`` (where ``serve`` listens)."""
    sys.stdout.write(kind + " " + dumps(obj) + "\n")
    sys.stdout.flush()


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def rmtree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        import shutil

        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        try:  # noqa: SIM105 - contextlib is not imported on the probe's path
            os.remove(path)
        except OSError:
            pass


def workdirs(cfg: dict) -> tuple[str, str, str]:
    w = os.path.abspath(os.path.expanduser(cfg["workdir"]))
    code_root, envs_root = os.path.join(w, "code"), os.path.join(w, "envs")
    # Private like the run folders: code and envs may hold credentials or proprietary code.
    for d in (w, code_root, os.path.join(code_root, ".manifests"), envs_root):
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.stat(d)
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(d, 0o700)
    return w, code_root, envs_root


def snapshots(code_root: str) -> list[str]:
    """Snapshot names, newest first (a push touches the snapshot it uses)."""
    names = [
        n
        for n in os.listdir(code_root)
        if not n.startswith(".") and os.path.isdir(os.path.join(code_root, n))
    ]
    return sorted(names, key=lambda n: os.stat(os.path.join(code_root, n)).st_mtime, reverse=True)


def sweep_stale(*roots: str) -> None:
    """Temp dirs of pushes that died (Ctrl-C, a lost controller): nothing in them was written
    for ``STALE_IDLE_S`` (a live transfer writes all the time, and gives up after its I/O
    timeout), or they are older than ``STALE_TMP_S`` whatever their content says."""
    now = time.time()
    for root in roots:
        for name in os.listdir(root):
            if name.startswith(".tmp-"):
                p = os.path.join(root, name)
                try:
                    age = now - os.lstat(p).st_mtime
                    if age > STALE_TMP_S or now - newest_mtime(p) > STALE_IDLE_S:
                        rmtree(p)
                except OSError:
                    pass


def newest_mtime(path: str, limit: int = 20000) -> float:
    """The newest mtime in a tree (at most ``limit`` entries looked at: a bound, not a scan)."""
    newest = os.lstat(path).st_mtime
    seen = 0
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            seen += 1
            if seen > limit:
                return newest
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                continue
    return newest


def verify_env(prefix: str, cfg: dict) -> dict:
    import subprocess

    py = os.path.join(prefix, "bin", "python")
    if not os.path.exists(py):
        return {"error": "env has no bin/python"}
    env = dict(os.environ)
    env["PATH"] = os.path.join(prefix, "bin") + os.pathsep + env.get("PATH", "")
    env["CONDA_PREFIX"] = prefix
    query = dumps({"prefix": prefix, "torch": bool(cfg.get("check_torch"))})
    argv = [py, "-c", cfg.get("envinfo") or "", query]
    try:
        p = subprocess.run(
            argv, capture_output=True, env=env, timeout=float(cfg.get("verify_timeout", 120))
        )
    except subprocess.TimeoutExpired:
        return {"error": "env python did not finish the check in time"}
    except OSError as e:
        return {"error": f"env python does not run: {e}"}
    for line in reversed(p.stdout.decode(errors="replace").splitlines()):
        if line.startswith("D "):
            try:
                data = loads(line[2:])
            except ValueError:
                continue
            if isinstance(data, dict):
                return data
    tail = p.stderr.decode(errors="replace").strip().splitlines()
    return {"error": f"env python failed (exit {p.returncode})" + (": " + tail[-1] if tail else "")}


# ------------------------------------------------------------------------------------ probe


def which(name: str) -> str | None:
    """shutil.which for a plain name, without importing shutil."""
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def probe(cfg: dict) -> dict:
    w, code_root, envs_root = workdirs(cfg)
    sweep_stale(code_root, envs_root)
    out = {
        "home": os.path.expanduser("~"),
        "workdir": w,
        "workdir_id": workdir_id(w),
        "rsync": which("rsync"),
        "free": free_bytes(envs_root),
    }
    digest = cfg.get("digest")
    if digest:
        final = os.path.join(code_root, digest)
        out["code_present"] = os.path.isdir(final)
        if out["code_present"]:
            os.utime(final)
        prev = [n for n in snapshots(code_root) if n != digest]
        keep_prev = max(1, int(cfg.get("keep", 5)) - 1)
        for old in prev[keep_prev:]:
            rmtree(os.path.join(code_root, old))
            rmtree(os.path.join(code_root, ".manifests", old + ".json"))
        prev = prev[:keep_prev]
        out["code_prev"] = prev[0] if prev else None
        want = cfg.get("want_manifest")
        if prev and (want == "always" or (want and not out["rsync"])):
            try:
                with open(os.path.join(code_root, ".manifests", prev[0] + ".json")) as f:
                    out["code_prev_manifest"] = loads(f.read())
            except (OSError, ValueError):
                out["code_prev_manifest"] = None
    sha = cfg.get("env_sha")
    if sha:
        final = os.path.join(envs_root, sha)
        out["env_present"] = os.path.isdir(final)
        if out["env_present"]:
            out["verify"] = verify_env(final, cfg)
    return out


# --------------------------------------------------------------------------------- finalize


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
            try:
                os.rename(tmp, final)
            except OSError as e:  # ... or finished between our look and our rename
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not os.path.isdir(final):
                    raise
                rmtree(tmp)
        mpath = os.path.join(code_root, ".manifests", digest + ".json")
        part = f"{mpath}.{os.getpid()}.{os.urandom(3).hex()}.part"  # two pushes: two names
        with open(part, "w") as f:
            f.write(dumps(manifest))
        os.replace(part, mpath)
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
            os.rename(tmp, final)
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


# ------------------------------------------------------------------------------------ serve


def serve(cfg: dict) -> dict:
    import hmac
    import select
    import shutil
    import socket
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    path, sha = cfg["path"], cfg["sha"]
    expected = ("Bearer " + cfg["token"]).encode()
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            got = (self.headers.get("Authorization") or "").encode()
            if self.path != "/" + sha or not hmac.compare_digest(got, expected):
                self.send_error(403)
                return
            size = os.path.getsize(path)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            with open(path, "rb") as f:
                shutil.copyfileobj(f, self.wfile, 1 << 20)
            served[0] += 1

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in cfg["bind"] else socket.AF_INET

    srv = Server((cfg["bind"], 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    emit({"host": cfg["bind"], "port": srv.server_address[1]}, "A")
    deadline = time.time() + float(cfg.get("timeout", 900))
    try:
        while time.time() < deadline:  # until the controller closes stdin (or goes away)
            ready, _, _ = select.select([sys.stdin], [], [], min(5.0, deadline - time.time()))
            if ready and not sys.stdin.readline():
                break
    finally:
        srv.shutdown()
        srv.server_close()
        if cfg.get("remove"):
            rmtree(path)
    return {"served": served[0]}


def cleanup(cfg: dict) -> dict:
    _w, code_root, envs_root = workdirs(cfg)
    for name in cfg.get("env_paths", []):
        rmtree(os.path.join(envs_root, name))
    for name in cfg.get("code_paths", []):
        rmtree(os.path.join(code_root, name))
    return {"free": free_bytes(envs_root)}


# ------------------------------------------------------------------------- checkpoint relay
# A retry's nodes get what the job wrote into its work folder on the node of rank 0
# (pytorch/examples' snapshot.pt, Lightning's and HF Trainer's checkpoint folders): ``relay-pack``
# there lists the regular files that differ from the code snapshot the folder was seeded from
# (``__pycache__`` and private-key look-alikes left out) and tars them into
# ``W/envs/.tmp-relay-*.tar``; ``relay-apply`` on each node of the retry seeds its work folder
# as the supervisor would, takes the tar (uploaded, or fetched from a peer and sha-checked) and
# writes each file under a temp name and renames it, so nodes of one shared home may do it at
# once. A node reading the source's workdir id shares its folder: nothing to do.

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
    """A private key by name or by its header (the code push's rule)."""
    if name in RELAY_KEY_NAMES:
        return True
    import re

    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError:
        return False
    pat = rb"(?m)^(?:-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----|PuTTY-User-Key-File-\d+: )"
    return re.search(pat, head) is not None


def relay_files(work: str, root: str, seed: str | None, allowed: set) -> tuple[list, list]:
    """[(name relative to root, size)] new or changed against the seed; secrets left out."""
    import stat

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
    files, secrets = relay_files(work, root, seed, set(cfg.get("allow_secrets") or ()))
    total = sum(size for _rel, size in files)
    out.update(files=[rel for rel, _s in files[:RELAY_LISTED]], count=len(files), bytes=total)
    out["secrets"] = secrets
    if not files or total > int(cfg["max_bytes"]):
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
    try:
        os.rename(tmp, work)
    except OSError:  # another node of a shared home made it first: the same copy
        rmtree(tmp)
        if not os.path.isdir(work):
            raise


def relay_unpack(tar: str, root: str) -> tuple[int, int]:
    """Regular files only, each under a temp name then renamed; a name that leaves ``root``
    stops it."""
    import shutil
    import tarfile

    real = os.path.realpath(root)
    count = size = 0
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
                os.chmod(tmp, (m.mode & 0o777) or 0o600)
                os.utime(tmp, (m.mtime, m.mtime))
                os.replace(tmp, target)
            except BaseException:
                rmtree(tmp)
                raise
            count, size = count + 1, size + m.size
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


def main() -> int:
    mode = sys.argv[1]
    cfg = loads(sys.stdin.readline())
    try:
        result = {
            "probe": probe,
            "finalize": finalize,
            "serve": serve,
            "cleanup": cleanup,
            "relay-pack": relay_pack,
            "relay-apply": relay_apply,
        }[mode](cfg)
    except Failed as e:
        emit({"error": str(e), "stage": e.stage, "enospc": e.enospc})
        return 3
    except OSError as e:
        emit(
            {"error": f"{type(e).__name__}: {e}", "stage": mode, "enospc": e.errno == errno.ENOSPC}
        )
        return 3
    emit(result)
    return 0


def program() -> None:
    """Run as the node's program, installed (``fleetctl.remote.cached_argv``)."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
