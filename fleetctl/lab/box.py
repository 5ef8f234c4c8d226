"""`fleetctl lab box`: a Vagrant libvirt box built from Debian packages only.

No box can be downloaded on the machines the VM tier runs on, and KVM does not work there, so
the box is made here: mmdebstrap a minimal Debian 12 (with ``linux-image-amd64``), pack the root
directory into an ext4 image (``mkfs.ext4 -d``, no bootloader, no guestfish), convert it to
qcow2, and let the box's Vagrantfile boot it by *direct kernel boot* (libvirt's
``kernel``/``initrd``/``cmdline``) on plain qemu (TCG). The build is cached by the hash of its
recipe, so a second call only re-adds the box.

The image carries no well-known key: each build generates its own login key for ``vagrant``
(kept next to the image, root only), and the repository's Vagrantfile then installs fleetctl's
client key and pinned host keys. Kernel, initrd and key live in the cache folder, which the box's
Vagrantfile names by absolute path (libvirt reads the kernel from the host).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fleetctl.errors import LabError

BOX_NAME = "fleetctl/bookworm64"
DEFAULT_CACHE = Path("/var/cache/fleetctl/box")
SUITE = "bookworm"
MIRRORS = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
PACKAGES = (
    "systemd-sysv",
    "udev",
    "kmod",
    "linux-image-amd64",
    "initramfs-tools",
    "openssh-server",
    "python3",
    "rsync",
    "iproute2",
    "procps",
    "sudo",
    "ifupdown",
    "isc-dhcp-client",
    # torch for DDP runs on the VMs (1.13, CPU, gloo): Debian's own, no pip index needed.
    "python3-torch",
)
DISK_SIZE = "6G"  # torch and its libraries: ~1.5 GB more
# ttyS0 for the serial log; eth0.. names so the box's interfaces file knows its first NIC.
CMDLINE = "root=/dev/vda rw console=ttyS0 net.ifnames=0 biosdevname=0 quiet"
BUILD_TIMEOUT = 3600.0  # mmdebstrap over the network, then the initramfs: minutes, bounded
STEP_TIMEOUT = 900.0

# Run inside the new root (as "$1"/...) after the packages are installed.
CUSTOMIZE = (
    r"""
set -eu
R="$1"
echo fleetctl-box > "$R/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 fleetctl-box\n' > "$R/etc/hosts"
printf '/dev/vda / ext4 defaults,errors=remount-ro 0 1\n' > "$R/etc/fstab"
cat > "$R/etc/network/interfaces" <<'EOF'
auto lo
iface lo inet loopback

allow-hotplug eth0
iface eth0 inet dhcp

source /etc/network/interfaces.d/*
EOF
chroot "$R" useradd -m -s /bin/bash -G sudo vagrant
echo 'vagrant ALL=(ALL) NOPASSWD: ALL' > "$R/etc/sudoers.d/vagrant"
chmod 440 "$R/etc/sudoers.d/vagrant"
install -d -m 700 "$R/home/vagrant/.ssh"
install -m 600 "$BOX_PUBKEY" "$R/home/vagrant/.ssh/authorized_keys"
chroot "$R" chown -R vagrant:vagrant /home/vagrant/.ssh
# Every VM gets its own host keys at first boot (the Vagrantfile then installs pinned ones).
rm -f "$R"/etc/ssh/ssh_host_*
install -d "$R/etc/systemd/system/ssh.service.d"
printf '[Service]\nExecStartPre=\nExecStartPre=/usr/bin/ssh-keygen -A\n"""
    r"""ExecStartPre=/usr/sbin/sshd -t\n' \
  > "$R/etc/systemd/system/ssh.service.d/fleetctl-keygen.conf"
printf 'UseDNS no\n' > "$R/etc/ssh/sshd_config.d/fleetctl-box.conf"
# TCG is slow: nothing periodic that competes with the tests.
for t in apt-daily.timer apt-daily-upgrade.timer man-db.timer e2scrub_all.timer fstrim.timer; do
  ln -sf /dev/null "$R/etc/systemd/system/$t"
done
: > "$R/etc/machine-id"
rm -f "$R"/var/cache/apt/archives/*.deb
rm -rf "$R"/var/lib/apt/lists/*
"""
)


def recipe() -> dict[str, object]:
    """Everything the image is made from: its hash names the cache entry."""
    return {
        "suite": SUITE,
        "mirrors": list(MIRRORS),
        "packages": list(PACKAGES),
        "customize": CUSTOMIZE,
        "disk_size": DISK_SIZE,
        "cmdline": CMDLINE,
        "format": 1,
    }


def recipe_hash() -> str:
    """The first 16 hex digits of the recipe's SHA-256."""
    blob = json.dumps(recipe(), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def box_vagrantfile(entry: Path) -> str:
    """The box's own Vagrantfile: libvirt on qemu (TCG), direct kernel boot, the build's key."""
    return f"""# Written by `fleetctl lab box`: direct kernel boot of Debian 12 on qemu (TCG).
Vagrant.configure("2") do |config|
  config.ssh.private_key_path = ["{entry / "box_key"}"]
  config.ssh.insert_key = false
  config.vm.provider :libvirt do |lv|
    lv.driver = "qemu"
    lv.kernel = "{entry / "vmlinuz"}"
    lv.initrd = "{entry / "initrd.img"}"
    lv.cmd_line = "{CMDLINE}"
    lv.disk_bus = "virtio"
    lv.cpu_mode = "custom"
    lv.cpu_model = "qemu64"
    lv.graphics_type = "none"
    lv.video_type = "none"
  end
end
"""


def _run(argv: list[str], what: str, timeout: float = STEP_TIMEOUT, **kw: object) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload]
    except FileNotFoundError as e:
        raise LabError(f"lab box: {argv[0]} not found ({what}); apt-get install it") from e
    except subprocess.TimeoutExpired as e:
        raise LabError(f"lab box: {what} took over {timeout:.0f}s") from e
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise LabError(f"lab box: {what} failed (exit {proc.returncode}): " + " | ".join(tail))


def _build(entry: Path, log: Callable[[str], None]) -> None:
    """Make ``entry``'s files in a scratch folder next to it, then move it into place."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        root = work / "root"
        out = work / "out"
        out.mkdir()
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleetctl-box",
              "-f", str(out / "box_key")], "ssh-keygen")  # fmt: skip
        log(f"lab box: mmdebstrap {SUITE} ({len(PACKAGES)} packages; minutes)")
        _run(
            ["mmdebstrap", "--mode=root", "--variant=minbase", "--format=directory",
             "--include=" + ",".join(PACKAGES),
             "--customize-hook=" + CUSTOMIZE,
             SUITE, str(root), *MIRRORS],
            "mmdebstrap",
            timeout=BUILD_TIMEOUT,
            env={**os.environ, "BOX_PUBKEY": str(out / "box_key.pub")},
        )  # fmt: skip
        boot = root / "boot"
        kernels = sorted(boot.glob("vmlinuz-*"))
        initrds = sorted(boot.glob("initrd.img-*"))
        if not kernels or not initrds:
            raise LabError(f"lab box: no kernel/initrd under {boot} after mmdebstrap")
        shutil.copy2(kernels[-1], out / "vmlinuz")
        shutil.copy2(initrds[-1], out / "initrd.img")
        log("lab box: ext4 image (mkfs.ext4 -d), then qcow2")
        raw = work / "root.raw"
        _run(["mkfs.ext4", "-q", "-F", "-L", "root", "-d", str(root), str(raw), DISK_SIZE],
             "mkfs.ext4 -d")  # fmt: skip
        _run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(out / "box.img")],
             "qemu-img convert")  # fmt: skip
        raw.unlink()
        virtual_size = -(-_parse_size(DISK_SIZE) // 2**30)
        (out / "metadata.json").write_text(
            json.dumps({"provider": "libvirt", "format": "qcow2", "virtual_size": virtual_size})
        )
        (out / "Vagrantfile").write_text(box_vagrantfile(entry))
        (out / "recipe.json").write_text(json.dumps(recipe(), indent=1, sort_keys=True))
        with tarfile.open(out / "fleetctl-bookworm64.box", "w") as tar:
            for name in ("metadata.json", "Vagrantfile", "box.img"):
                tar.add(out / name, arcname=name)
        (out / "box.img").unlink()  # the .box holds it; libvirt copies it into its pool
        out.chmod(0o755)  # libvirt's qemu user reads the kernel and initrd from here
        os.replace(out, entry)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _parse_size(s: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def build_box(
    cache: Path = DEFAULT_CACHE,
    *,
    rebuild: bool = False,
    add: bool = True,
    log: Callable[[str], None] = lambda _m: None,
) -> Path:
    """Build (or reuse) the box for :func:`recipe` and ``vagrant box add`` it; return its entry."""
    if os.geteuid() != 0:
        raise LabError("lab box: needs root (mmdebstrap --mode=root, libvirt's system instance)")
    entry = cache / recipe_hash()
    if rebuild and entry.exists():
        shutil.rmtree(entry)
    if (entry / "fleetctl-bookworm64.box").is_file():
        log(f"lab box: cached {entry}")
    else:
        _build(entry, log)
    if add:
        log(f"lab box: vagrant box add --name {BOX_NAME}")
        _run(["vagrant", "box", "add", "--force", "--name", BOX_NAME,
              str(entry / "fleetctl-bookworm64.box")], "vagrant box add")  # fmt: skip
    return entry


LIBVIRT_URI = "qemu:///system"
LIBVIRTD_TIMEOUT = 30.0


def _libvirt_answers() -> bool:
    try:
        proc = subprocess.run(["virsh", "-c", LIBVIRT_URI, "uri"], capture_output=True,
                              timeout=LIBVIRTD_TIMEOUT)  # fmt: skip
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def ensure_libvirtd(log: Callable[[str], None] = lambda _m: None) -> None:
    """Start virtlogd and libvirtd (daemonized) where no service manager did: containers."""
    if _libvirt_answers():
        return
    if shutil.which("libvirtd") is None:
        raise LabError("lab box: libvirtd not found; apt-get install libvirt-daemon-system")
    log("lab box: starting virtlogd and libvirtd (no service manager runs them)")
    for daemon in ("virtlogd", "libvirtd"):
        _run([daemon, "--daemon"], f"{daemon} --daemon", timeout=LIBVIRTD_TIMEOUT)
    deadline = time.monotonic() + LIBVIRTD_TIMEOUT
    while not _libvirt_answers():
        if time.monotonic() > deadline:
            raise LabError(f"lab box: libvirtd did not answer on {LIBVIRT_URI} within "
                           f"{LIBVIRTD_TIMEOUT:.0f}s")  # fmt: skip
        time.sleep(0.5)
