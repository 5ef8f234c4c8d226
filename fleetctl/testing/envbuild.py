"""Build small, real conda-pack archives offline: for tests, bench and lab demos.

No network and no conda install: tiny conda packages are made with conda-package-handling into
a local channel, indexed and installed into an absolute prefix with py-rattler, then packed
with conda-pack — the same archive format users ship. Needs the ``test`` extra
(``py-rattler``, ``conda-pack``, ``conda-package-handling``) and, for the stand-in NCCL, gcc.

The env's ``bin/python`` is a wrapper around a real interpreter on the node (the lab shares this
machine's filesystem), so ``import torch`` works where the host python has torch.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

PLACEHOLDER = "/opt/fleetctl-build-placeholder/" + "p" * 64  # long, like conda-build's
PREFIX_FILE = "etc/fleetctl/prefix.txt"  # a text file carrying the prefix (rewritten on unpack)


@dataclass(frozen=True)
class BuiltEnv:
    """A packed env. ``prefix_file`` holds the env prefix once conda-unpack ran."""

    archive: Path
    prefix: Path
    prefix_file: str = PREFIX_FILE


def build_fake_nccl(dest: Path, version: str = "2.21.5") -> Path:
    """A stand-in ``libnccl.so.2`` exporting ``ncclGetVersion`` (gcc), for GPU-less tests."""
    major, minor, patch = (int(x) for x in version.split("."))
    code = major * 10000 + minor * 100 + patch
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as td:
        src = Path(td) / "nccl.c"
        src.write_text(
            "typedef enum { ncclSuccess = 0 } ncclResult_t;\n"
            f"ncclResult_t ncclGetVersion(int *v) {{ *v = {code}; return ncclSuccess; }}\n"
        )
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-O1",
                "-Wl,-soname,libnccl.so.2",
                "-o",
                str(dest),
                str(src),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    return dest


def nccl_from_wheel(wheel: Path, dest: Path) -> Path:
    """``nvidia/nccl/lib/libnccl.so.2`` out of an ``nvidia-nccl-cu12`` wheel."""
    import zipfile

    with zipfile.ZipFile(wheel) as z, z.open("nvidia/nccl/lib/libnccl.so.2") as src:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    return dest


def _package(
    channel: Path,
    name: str,
    files: dict[str, bytes | Path],
    *,
    executable: set[str] = frozenset(),
    prefix_text: set[str] = frozenset(),
    symlinks: dict[str, str] | None = None,
) -> None:
    """One noarch conda package (``name-1.0-0.conda``) in the local channel."""
    from conda_package_handling import api

    with tempfile.TemporaryDirectory() as td:
        root = Path(td)
        paths = []
        for rel, content in sorted(files.items()):
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, p)
            else:
                p.write_bytes(content)
            if rel in executable:
                p.chmod(0o755)
            entry = {
                "_path": rel,
                "path_type": "hardlink",
                "sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                "size_in_bytes": p.stat().st_size,
            }
            if rel in prefix_text:
                entry.update(prefix_placeholder=PLACEHOLDER, file_mode="text")
            paths.append(entry)
        for rel, target in (symlinks or {}).items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(target, root / rel)
            paths.append({"_path": rel, "path_type": "softlink"})
        info = root / "info"
        info.mkdir()
        (info / "index.json").write_text(
            json.dumps(
                {
                    "name": name,
                    "version": "1.0",
                    "build": "0",
                    "build_number": 0,
                    "depends": [],
                    "noarch": "generic",
                    "subdir": "noarch",
                    "arch": None,
                    "platform": None,
                    "license": "Apache-2.0",
                    "timestamp": 1700000000000,
                }
            )
        )
        (info / "paths.json").write_text(json.dumps({"paths": paths, "paths_version": 1}))
        (info / "files").write_text("".join(e["_path"] + "\n" for e in paths))
        if prefix_text:
            (info / "has_prefix").write_text(
                "".join(f"{PLACEHOLDER} text {rel}\n" for rel in sorted(prefix_text))
            )
        members = [
            str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()
        ]
        out = channel / "noarch"
        out.mkdir(parents=True, exist_ok=True)
        api.create(
            str(root), members, f"{name}-1.0-0.conda", out_folder=str(out), compression_level=1
        )  # the default (19) takes minutes for a 250 MB .so


async def _install(channel: Path, specs: list[str], prefix: Path, cache: Path) -> None:
    import rattler
    from rattler.index import index_fs

    await index_fs(channel)
    records = await rattler.solve(
        sources=[rattler.Channel(channel.resolve().as_uri())],
        specs=specs,
        platforms=["linux-64", "noarch"],
    )
    await rattler.install(records, target_prefix=prefix, cache_dir=cache, show_progress=False)


def _this_python() -> str:
    """In a venv (CI's) its own ``bin/python``, whose site has torch: the interpreter it links
    to would run without the venv's packages. Else the real file, never a pyenv shim."""
    if sys.prefix != sys.base_prefix:
        return os.path.join(sys.prefix, "bin", os.path.basename(sys.executable) or "python")
    return os.path.realpath(sys.executable)


def build_env(
    workdir: Path,
    *,
    nccl_lib: Path | None,
    python: str | None = None,
    ballast_mb: int = 0,
    noise_mb: int = 0,
    tag: str = "",
    fmt: str = "tar.gz",
    compress_level: int = 1,
) -> BuiltEnv:
    """Build and pack an env under ``workdir`` (absolute, kept until packed).

    ``nccl_lib`` goes to ``lib/libnccl.so.2`` (None: an env without NCCL); ``ballast_mb`` adds
    a file of zeros that compresses to almost nothing (unpacks much bigger than the archive:
    a disk that fits the archive but not the env); ``noise_mb`` adds random bytes (an archive
    of a known, incompressible size); ``tag`` makes the archive distinct.
    """
    import conda_pack

    workdir = workdir.resolve()
    channel, cache, prefix = workdir / "channel", workdir / "pkgs", workdir / "prefix"
    for d in (channel, cache, prefix):
        shutil.rmtree(d, ignore_errors=True)
    real_python = os.path.realpath(python) if python else _this_python()
    wrapper = (f'#!/bin/sh\n# fleetctl test env {tag}\nexec {real_python} "$@"\n').encode()
    _package(
        channel,
        "fleet-python",
        {"bin/python": wrapper, PREFIX_FILE: f"prefix={PLACEHOLDER}\n".encode()},
        executable={"bin/python"},
        prefix_text={PREFIX_FILE},
        symlinks={"bin/python3": "python"},
    )
    specs = ["fleet-python"]
    if nccl_lib is not None:
        _package(
            channel, "fleet-nccl", {"lib/libnccl.so.2": nccl_lib}, executable={"lib/libnccl.so.2"}
        )
        specs.append("fleet-nccl")
    if ballast_mb:
        _package(channel, "fleet-ballast", {"share/ballast.bin": b"\0" * (ballast_mb << 20)})
        specs.append("fleet-ballast")
    if noise_mb:
        _package(channel, "fleet-noise", {"share/noise.bin": os.urandom(noise_mb << 20)})
        specs.append("fleet-noise")
    asyncio.run(_install(channel, specs, prefix, cache))
    suffix = {"tar.gz": ".tar.gz", "tar": ".tar"}[fmt]
    archive = workdir / f"env{('-' + tag) if tag else ''}{suffix}"
    conda_pack.pack(
        prefix=str(prefix),
        output=str(archive),
        format=fmt,
        force=True,
        compress_level=compress_level,
    )
    return BuiltEnv(archive, prefix)


def archive_members(archive: Path) -> list[str]:
    with tarfile.open(archive) as tf:
        return tf.getnames()


class EnvCache:
    """Test archives built once per session under ``base`` and shared by every test module."""

    KINDS: ClassVar[dict[str, dict]] = {
        "nccl": {"nccl": "2.21.5"},
        "nccl-other": {"nccl": "2.19.3"},
        "no-nccl": {"nccl": None},
        "ballast": {"nccl": "2.21.5", "ballast_mb": 16},
        "noise": {"nccl": "2.21.5", "noise_mb": 3},
    }

    def __init__(self, base: Path) -> None:
        self.base = base.resolve()
        self._built: dict[str, BuiltEnv] = {}

    def get(self, kind: str) -> BuiltEnv:
        if kind not in self._built:
            spec = dict(self.KINDS[kind])
            version = spec.pop("nccl")
            work = self.base / kind
            lib = build_fake_nccl(work / "nccl" / "libnccl.so.2", version) if version else None
            self._built[kind] = build_env(work, nccl_lib=lib, tag=kind, **spec)
        return self._built[kind]
