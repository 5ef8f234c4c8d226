"""Node side of ``fleetctl push``: one stdlib-only program, installed on the node as
``W/bin/push_helper_<sha12>.py`` and run from there with its bytecode cached
(``fleetctl.remote.cached_argv``); ``serve`` runs as ``python3 -c SRC serve``.

One program (the modes finalize and relay in ``finalize.py`` and ``relay.py``, what they
share in ``pushbase.py``: one bundle), so each phase costs one remote command per node. The
controller writes the config as one JSON line on stdin (a one-time peer token must never
appear in argv, which any local user can read) and reads one ``D <json>`` frame from stdout
(``serve`` first says where it listens: ``A <json>``; see fleetctl/phases/frames.py). The
env is verified by ``envinfo.py``, whose source comes in the config (``envinfo``). Runs on
the node's python (3.8+); nothing here imports fleetctl.

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
  relay-pack / relay-have / relay-apply
            a retry's checkpoints: list (size, sha256) and tar what the job wrote into its work
            folder on the node of rank 0; on another node, say which of those files it already
            holds, then seed its work folder and unpack the rest there (``relay.py``)
"""

from __future__ import annotations

import os
import sys
import time

from ..kit.pushbase import emit, free_bytes, loads, rmtree, run_mode, verify_env, workdirs
from ..kit.workdirs import workdir_id

# shutil, subprocess, tarfile, hashlib and contextlib are imported where used: a no-op push's
# probe needs none of them, and their imports were a third of its CPU on every node. Nor json:
# its import brings re and enum (~5 ms, a quarter of a no-op push probe's CPU on every node);
# the config and the answer go through json's own C half (``loads``, ``dumps``).


STALE_TMP_S = 6 * 3600
STALE_IDLE_S = 15 * 60  # a temp dir nobody wrote into for this long belongs to a dead push


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


def mode_function(mode: str):  # type: ignore[no-untyped-def]
    """The function of ``mode``. finalize's and the relay's modules are imported for their
    own modes only: a no-op push runs ``probe`` alone, on every node."""
    if mode == "finalize":
        from ..kit.finalize import finalize

        return finalize
    if mode in ("relay-pack", "relay-have", "relay-apply"):
        from ..kit.relay import relay_apply, relay_have, relay_pack

        return {"relay-pack": relay_pack, "relay-have": relay_have, "relay-apply": relay_apply}[
            mode
        ]
    return {"probe": probe, "serve": serve, "cleanup": cleanup}[mode]


def main() -> int:
    return run_mode(mode_function)


def program() -> None:
    """Run as the node's program, installed (``fleetctl.remote.cached_argv``)."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
