"""The push helper's shared pieces: its JSON (json's C half), its one error, its frames,
the workdir's folders, and an env's check (``envinfo.py`` run by the env's python).

Node module: stdlib only, Python >= 3.8; imports nothing a no-op push's probe does not need.
"""

from __future__ import annotations

import os

from .framing import dumps, frame

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


class Failed(Exception):
    """A step failed; ``stage`` says which, ``enospc`` whether the disk was full."""

    def __init__(self, stage: str, message: str, enospc: bool = False) -> None:
        super().__init__(message)
        self.stage, self.enospc = stage, enospc


def emit(obj: dict, kind: str = "D") -> None:
    """One frame: ``D <json>`` (the answer) or ``A <json>`` (where ``serve`` listens)."""
    frame(kind, obj)


def run_mode(pick) -> int:  # type: ignore[no-untyped-def]
    """A push program's ``main``: the mode from argv, its config as one JSON line on stdin, the
    answer as one ``D`` frame; a failure as ``{"error", "stage", "enospc"}`` and exit 3."""
    import errno
    import sys

    mode = sys.argv[1]
    cfg = loads(sys.stdin.readline())
    try:
        result = pick(mode)(cfg)
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
