"""Container images for the container tests, built from packages only (no registry is reachable
on the CI machines): the Debian base (``mmdebstrap``, imported once) and the same base with the
pinned CPU torch in the image's own site folder, so a job runs the image's Python and torch, not
the host's.

Both are cached on this machine: the base's tarball and torch's ``pip install --target`` folder
under ``/var/cache/fleetctl-ci/``; the images stay in podman's store (``podman image exists``).
A missing tool is a :class:`ImageUnavailable`, which the tests turn into a skip (or a failure
under ``FLEETCTL_REQUIRE_LAB``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

BASE_IMAGE = "fleetctl-test:py3"
BASE_TARBALL = Path("/var/cache/fleetctl-ci/fleetctl-test-py3.tar")
TORCH_PIN = "torch==2.13.0"  # the CPU wheel on these machines; unpinned pulls CUDA packages
TORCH_IMAGE = "fleetctl-test:torch-2.13.0"
TORCH_SITE = Path("/var/cache/fleetctl-ci/image-site-torch-2.13.0")
# Debian bookworm's python3 is 3.11, the ABI of the wheel pip picks for this machine's 3.11
IMAGE_SITE = "/usr/local/lib/python3.11/dist-packages"
BUILD_TIMEOUT = 900.0


class ImageUnavailable(Exception):
    """A tool or package the image needs is missing here (a skip, not a test failure)."""


def podman(*args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


def _need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            raise ImageUnavailable(f"{tool} is not installed (apt-get install {tool})")


def base_tarball() -> Path:
    """Debian bookworm with python3 as a root file system tarball (``mmdebstrap``, no registry),
    built once per machine: what podman and docker import."""
    if BASE_TARBALL.exists():
        return BASE_TARBALL
    _need("mmdebstrap")
    BASE_TARBALL.parent.mkdir(parents=True, exist_ok=True)
    part = BASE_TARBALL.with_suffix(".part.tar")
    argv = ["mmdebstrap", "--variant=apt", "--include=python3", "bookworm", str(part)]
    built = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    if built.returncode != 0:
        raise ImageUnavailable(f"mmdebstrap could not build the image: {built.stderr[-300:]}")
    part.rename(BASE_TARBALL)
    return BASE_TARBALL


def base_image() -> str:
    """:func:`base_tarball` in this machine's podman store, imported when missing."""
    _need("podman", "runc")
    if podman("image", "exists", BASE_IMAGE).returncode == 0:
        return BASE_IMAGE
    got = podman("import", str(base_tarball()), BASE_IMAGE)
    if got.returncode != 0:
        raise RuntimeError(f"podman import: {got.stderr.strip()}")
    return BASE_IMAGE


def torch_site() -> Path:
    """The pinned torch (and numpy, which it warns without) installed into a folder of their
    own by this machine's pip, once."""
    if (TORCH_SITE / "torch" / "__init__.py").is_file():
        return TORCH_SITE
    part = TORCH_SITE.with_name(TORCH_SITE.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "install", "-q", "--target", str(part), TORCH_PIN]
    got = subprocess.run(
        [*argv, "numpy"], capture_output=True, text=True, timeout=BUILD_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if got.returncode != 0:
        shutil.rmtree(part, ignore_errors=True)
        raise ImageUnavailable(f"pip could not install {TORCH_PIN}: {got.stderr.strip()[-300:]}")
    shutil.rmtree(part / "bin", ignore_errors=True)  # console scripts name this host's python
    os.replace(part, TORCH_SITE)
    return TORCH_SITE


def torch_image() -> str:
    """The base image with torch in its own ``dist-packages``: a container copies the site in
    (no network), and is committed as :data:`TORCH_IMAGE`, then removed."""
    if podman("image", "exists", TORCH_IMAGE).returncode == 0:
        return TORCH_IMAGE
    base = base_image()
    site = torch_site()
    name = f"fleetctl-image-build-{uuid.uuid4().hex[:8]}"
    try:
        copy = f"cp -a /src/. {IMAGE_SITE}/"
        got = podman(
            "run", "--name", name, "--network", "none",  # no label: commit would keep it
            "-v", f"{site}:/src:ro", base, "sh", "-c", copy, timeout=BUILD_TIMEOUT,
        )  # fmt: skip
        if got.returncode != 0:
            raise RuntimeError(f"copying torch into the image: {got.stderr.strip()[-300:]}")
        got = podman("commit", "-q", name, TORCH_IMAGE, timeout=BUILD_TIMEOUT)
        if got.returncode != 0:
            raise RuntimeError(f"podman commit: {got.stderr.strip()[-300:]}")
    finally:
        podman("rm", "-f", name)
    return TORCH_IMAGE
