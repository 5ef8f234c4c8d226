"""Node side of ``fleetctl push --image``: one stdlib-only program, two modes.

  query  the runtime (the one named, else the first of ``runtimes`` on PATH), the image's id
         in its store, the workdir and its free space: one command per node, so nodes whose
         id already matches are skipped before anything is saved
  load   take the image archive under ``W/envs/`` (uploaded, or fetched from a peer that
         serves it, size and sha256 checked), ``<runtime> load`` it, answer the image's id;
         the archive is removed whatever happens, unless it is kept to serve peers (push's
         ``serve`` removes it then)
  cleanup  remove such a kept archive

The config comes as one JSON line on stdin, the answer is one ``D <json>`` frame; the argv of
the runtime comes from the controller (``fleetctl.plan.runtimes``), so nothing here knows one.
Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import errno
import os
import sys

from ..kit.finalize import fetch, sha256_file
from ..kit.pushbase import Failed, free_bytes, rmtree, run_mode, workdirs


def _which(name: str) -> str | None:
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        p = os.path.join(d or ".", name)
        if os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def _run(argv: list, timeout: float) -> tuple[int, str, str]:
    import subprocess

    try:
        p = subprocess.run(argv, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} {argv[1]} did not finish in {timeout:g}s"
    except OSError as e:
        return 127, "", str(e)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


def image_id(argv: list, timeout: float) -> str | None:
    """The image's id as the runtime prints it (docker's ``sha256:`` prefix dropped)."""
    code, out, _err = _run(argv, timeout)
    words = out.split()
    if code != 0 or not words:
        return None
    return words[0].split(":", 1)[-1]


def query(cfg: dict) -> dict:
    w, _code_root, envs_root = workdirs(cfg)
    out = {"workdir": w, "free": free_bytes(envs_root), "runtime": None, "image_id": None}
    for name in cfg["runtimes"]:
        if _which(name):
            out["runtime"] = name
            break
    if out["runtime"]:
        argv = cfg["id_argv"][out["runtime"]]
        out["image_id"] = image_id(argv, float(cfg.get("timeout", 120)))
    return out


def load(cfg: dict) -> dict:
    envs_root = workdirs(cfg)[2]
    name = cfg["archive"]
    if "/" in name or not name.startswith(".tmp-"):
        raise Failed("load", f"not an archive name of push: {name!r}")
    path = os.path.join(envs_root, name)
    timeout = float(cfg.get("timeout", 600))
    out = {}
    try:
        if cfg.get("fetch"):
            got = fetch(
                cfg["fetch"], path, cfg["sha"], int(cfg["size"]), cfg.get("fetch_timeout", 60)
            )
            out["peer"] = got["peer"]
        elif sha256_file(path) != cfg["sha"]:
            raise Failed("load", "the uploaded archive's sha256 does not match")
        code, _out, err = _run([*cfg["load_argv"], path], timeout)
        if code != 0:
            tail = err.strip().splitlines()
            raise Failed(
                "load",
                "{} load failed (exit {}){}".format(
                    cfg["load_argv"][0], code, ": " + tail[-1] if tail else ""
                ),
                "no space left on device" in err.lower(),
            )
        out["image_id"] = image_id(cfg["id_argv"], timeout)
        return out
    except OSError as e:
        raise Failed("load", str(e), e.errno == errno.ENOSPC) from e
    finally:
        if not cfg.get("keep_archive"):
            rmtree(path)
        rmtree(path + ".part")


def cleanup(cfg: dict) -> dict:
    """Remove an archive of this push (the seed's, once its peers are served)."""
    name = cfg["archive"]
    if "/" in name or not name.startswith(".tmp-"):
        raise Failed("cleanup", f"not an archive name of push: {name!r}")
    path = os.path.join(workdirs(cfg)[2], name)
    rmtree(path)
    rmtree(path + ".part")
    return {}


def main() -> int:
    return run_mode({"query": query, "load": load, "cleanup": cleanup}.__getitem__)


def program() -> None:
    """Run as the node's program, installed (``fleetctl.remote.cached_argv``)."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
