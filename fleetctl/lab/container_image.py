"""The container fleet's host image: Debian bookworm with sshd, from Debian packages only.

No registry is needed (none is reachable on the CI machines): ``mmdebstrap`` builds a root
filesystem tarball from the Debian mirror once (cached under /var/cache/fleetctl-ci/), then
``podman import`` / ``docker import`` turns it into an image. The tag carries a hash of the
package list and the init script, so a change to either builds a new image instead of reusing
a stale one. Host keys are removed from the image: every container makes its own at start.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from fleetctl.errors import LabError
from fleetctl.lab import net

#: What a fleet host needs: sshd, a Python for the node programs, ps/rsync/ip/ping for the
#: check and push, and the shared libraries a controller's Python (e.g. pyenv's, mounted
#: read-only at the same path) and torch link against.
PACKAGES = (
    "openssh-server",
    "python3",
    "procps",
    "rsync",
    "iproute2",
    "iputils-ping",
    "libbz2-1.0",
    "libexpat1",
    "libffi8",
    "liblzma5",
    "libncursesw6",
    "libreadline8",
    "libsqlite3-0",
    "libssl3",
    "libstdc++6",
    "libgomp1",
    "libuuid1",
    "libnsl2",
    "zlib1g",
)
SUITE = "bookworm"
INIT = Path(__file__).with_name("container_init.sh")
INIT_IN_IMAGE = "/usr/local/sbin/fleetctl-node-init"
CACHE = Path(os.environ.get("FLEETCTL_IMAGE_CACHE", "/var/cache/fleetctl-ci"))
BUILD_TIMEOUT = 900.0
RUNTIMES = ("podman", "docker")
LATEST = "fleetctl-sshd:latest"


def image_digest() -> str:
    """12 hex digits over everything that goes into the image (the build's argv, the init)."""
    h = hashlib.sha256()
    h.update("\0".join(mmdebstrap_argv(Path("out"))).encode())
    h.update(INIT.read_bytes())
    return h.hexdigest()[:12]


def image_tag() -> str:
    return f"fleetctl-sshd:{image_digest()}"


def tarball(cache: Path = CACHE) -> Path:
    return cache / f"fleetctl-sshd-{image_digest()}.tar"


def mmdebstrap_argv(out: Path) -> list[str]:
    """The build: minbase + PACKAGES, the init script installed, the host keys removed."""
    return [
        "mmdebstrap",
        "--variant=minbase",
        "--include=" + ",".join(PACKAGES),
        f"--customize-hook=upload {INIT} {INIT_IN_IMAGE}",
        f'--customize-hook=chmod 0755 "$1{INIT_IN_IMAGE}"',
        # no host keys (each container makes its own), no resolv.conf naming the build
        # machine's DNS server: with no server, lookups on the internal network fail at once
        '--customize-hook=rm -f "$1"/etc/ssh/ssh_host_* "$1"/etc/resolv.conf'
        ' "$1"/var/lib/apt/lists/*_Packages',
        SUITE,
        str(out),
    ]


def build_tarball(cache: Path = CACHE, *, rebuild: bool = False) -> Path:
    """The cached root filesystem tarball, built first when missing (or ``rebuild``)."""
    out = tarball(cache)
    if out.exists() and not rebuild:
        return out
    if shutil.which("mmdebstrap") is None:
        raise LabError("mmdebstrap not found (apt-get install mmdebstrap)")
    cache.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(f".{os.getpid()}.part.tar")
    try:
        net.run(mmdebstrap_argv(part), timeout=BUILD_TIMEOUT)
        part.rename(out)
    finally:
        part.unlink(missing_ok=True)
    for old in cache.glob("fleetctl-sshd-*.tar"):  # earlier builds: ~230 MB each
        if old != out and ".part." not in old.name:
            old.unlink(missing_ok=True)
    return out


def image_present(runtime: str, tag: str) -> bool:
    argv = (
        [runtime, "image", "exists", tag]
        if runtime == "podman"
        else [runtime, "image", "inspect", tag]
    )
    return net.run(argv, check=False).returncode == 0


def ensure_image(runtime: str = "podman", *, cache: Path = CACHE, rebuild: bool = False) -> str:
    """The host image's tag in ``runtime``'s store, imported from the tarball when absent."""
    if runtime not in RUNTIMES:
        raise LabError(f"container runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    if shutil.which(runtime) is None:
        raise LabError(f"{runtime} not found (apt-get install {runtime})")
    tag = image_tag()
    if rebuild or not image_present(runtime, tag):
        tar = build_tarball(cache, rebuild=rebuild)
        change = f'CMD ["{INIT_IN_IMAGE}"]'
        net.run([runtime, "import", "--change", change, str(tar), tag], timeout=300)
    net.run([runtime, "tag", tag, LATEST])  # what compose.yaml names by default
    return tag
