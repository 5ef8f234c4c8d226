"""The VM tier: the repository's Vagrantfile on libvirt (3 VMs with their own kernels, booted on
plain qemu), brought up once per session and destroyed at its end.

Not part of the main CI pass (minutes of TCG boot on a shared machine): it is collected only
with ``FLEETCTL_VMS=1`` (tests/conftest.py) and needs root, vagrant, vagrant-libvirt, libvirtd
and the box from ``fleetctl lab box``. docs/lab.md, "Vagrant (real VMs)", says how to run it.

``FLEETCTL_VMS_KEEP=1`` leaves the VMs running at the end (to look at them); the next session
reuses them (``vagrant up`` on running VMs is quick). Otherwise everything the Vagrantfile
created is removed even when the session fails: ``vagrant destroy -f``, then every libvirt
domain and network with the Vagrantfile's names that is still there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetctl.testing.pytest_plugin import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "vagrant.yml"
NODES = ("node1", "node2", "node3")
DOMAINS = tuple(f"fleetctl-{n}" for n in NODES)  # the Vagrantfile's LIBVIRT_PREFIX
NETWORKS = ("fleetctl-vagrant", "fleetctl-mgmt", "fleetctl-data")
UP_TIMEOUT = float(os.environ.get("FLEETCTL_VMS_UP_TIMEOUT", "2400"))
DESTROY_TIMEOUT = 600.0


def _gist(out: str) -> str:
    """Vagrant's output without its progress lines and Ruby backtraces: the error is above."""
    lines = [
        ln
        for ln in out.replace("\r", "\n").splitlines()
        if ln.strip() and "Progress:" not in ln and not ln.lstrip().startswith("from /")
    ]
    return "\n".join(lines[-60:])


def sh(argv: list[str], timeout: float, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``argv`` in ROOT in its own process group, killed as a group past ``timeout``."""
    p = subprocess.Popen(
        argv,
        cwd=ROOT,
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=30)
        pytest.fail(f"{' '.join(argv)} took over {timeout:.0f}s:\n{_gist(out)}", pytrace=False)
    res = subprocess.CompletedProcess(argv, p.returncode, out, "")
    if check and p.returncode != 0:
        pytest.fail(f"{' '.join(argv)} exited {p.returncode}:\n{_gist(out)}", pytrace=False)
    return res


def virsh(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return sh(["virsh", "-c", "qemu:///system", *args], 120, check=check)


def remove_everything() -> None:
    """``vagrant destroy -f``, then the Vagrantfile's domains, volumes and networks by name."""
    sh(["vagrant", "destroy", "-f"], DESTROY_TIMEOUT, check=False)
    for dom in DOMAINS:
        if virsh("domstate", dom).returncode == 0:
            virsh("destroy", dom)
            virsh("undefine", dom, "--remove-all-storage", "--nvram")
    for net in NETWORKS:
        if virsh("net-info", net).returncode == 0:
            virsh("net-destroy", net)
            virsh("net-undefine", net)


def require_vms() -> None:
    if os.environ.get("FLEETCTL_VMS") != "1":  # named on the command line without it
        pytest.skip("the VM tier runs only with FLEETCTL_VMS=1 (minutes of VMs)")
    if os.geteuid() != 0:
        skip_or_fail("the VM tier needs root (libvirt's system instance)")
    for tool in ("vagrant", "virsh", "ansible-playbook"):
        if shutil.which(tool) is None:
            skip_or_fail(f"the VM tier needs {tool} (docs/lab.md, 'Vagrant (real VMs)')")
    boxes = sh(["vagrant", "box", "list"], 120, check=False).stdout
    if "fleetctl/bookworm64" not in boxes:
        skip_or_fail("no box fleetctl/bookworm64: run `fleetctl lab box` first")


ADDRESSES = {"node1": "192.168.56.11", "node2": "192.168.56.12", "node3": "192.168.56.13"}
KEYDIR = ROOT / ".vagrant" / "fleetctl"


def ssh_argv(node: str, command: str) -> list[str]:
    """``command`` on a VM as ``vagrant`` over the management network, host key pinned (the
    Vagrantfile's known_hosts)."""
    return ["ssh", "-F", "/dev/null", "-o", f"UserKnownHostsFile={KEYDIR / 'known_hosts'}",
            "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "ConnectTimeout=20", "-i", str(KEYDIR / "id_ed25519"),
            f"vagrant@{ADDRESSES[node]}", command]  # fmt: skip


@pytest.fixture
def vm_sh() -> Callable[..., subprocess.CompletedProcess[str]]:
    """``vm_sh(node, command, timeout=60)``: a shell command on a VM (``ssh_argv``)."""

    def run(node: str, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return sh(ssh_argv(node, command), timeout, check=False)

    return run


WARM = "python3 -c 'import torch; print(torch.__version__)' 2>&1; echo rc=$?"


@pytest.fixture(scope="session")
def torch_warm(vagrant_fleet: Path) -> dict[str, str]:
    """``import torch`` once on every VM at once, timed; returns each VM's answer (its torch
    version then ``rc=0``, or the error). The first import reads ~1 GB of libraries cold and
    runs libtorch's static initializers (``torch._C``: 150 of 243 s under TCG): paid here in
    parallel, not by the DDP test's first rank."""
    t0 = time.monotonic()
    procs = {
        n: subprocess.Popen(ssh_argv(n, WARM), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
        for n in NODES
    }  # fmt: skip
    deadline = t0 + UP_TIMEOUT / 2
    answers: dict[str, str] = {}
    for n, p in procs.items():
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate(timeout=30)
        answers[n] = " ".join(out.split())[-200:]
        print(f"{n}: import torch: {answers[n]} after {time.monotonic() - t0:.0f}s")
    return answers


@pytest.fixture
def power_off() -> Callable[[str], None]:
    """Cut a VM's power: ``virsh destroy`` kills its qemu (no shutdown, no FIN, no RST)."""

    def cut(node: str) -> None:
        virsh("destroy", f"fleetctl-{node}", check=True)

    return cut


@pytest.fixture
def reset() -> Callable[[str], None]:
    """Reset a VM: ``virsh reset`` restarts its CPU at once (no shutdown, no FIN, no RST),
    and it boots again — a kernel panic's or a watchdog's reboot."""

    def hard_reboot(node: str) -> None:
        virsh("reset", f"fleetctl-{node}", check=True)

    return hard_reboot


# libvirt's cgroup for all its VMs (cgroup v1 here; the unit's weight is 1024 there).
MACHINE_SHARES = Path("/sys/fs/cgroup/cpu/machine/cpu.shares")
VM_SHARES = int(os.environ.get("FLEETCTL_VMS_CPU_SHARES", "10240"))


@contextlib.contextmanager
def vm_cpu_weight() -> Iterator[None]:
    """The VMs' CPU weight raised to ``FLEETCTL_VMS_CPU_SHARES`` (ten sessions') while the tier
    runs, then put back. With the scheduler's autogroups (``sched_autogroup_enabled``) a nice
    value counts only within its session, and libvirt's ``machine`` cgroup, all 3 VMs, weighs
    as much as one session: on the shared 2-core machine a VM got 1/6 of a core and one
    ``import torch`` took 243 s for 51 s of CPU. Where there is no such cgroup v1 hierarchy
    (cgroup v2, systemd's machine.slice) nothing is changed."""
    if not MACHINE_SHARES.parent.parent.is_dir():
        yield
        return
    MACHINE_SHARES.parent.mkdir(exist_ok=True)  # libvirt makes it at the first VM otherwise
    before = MACHINE_SHARES.read_text().strip()
    MACHINE_SHARES.write_text(f"{VM_SHARES}\n")
    print(f"libvirt's machine cgroup: cpu.shares {before} -> {VM_SHARES}")
    try:
        yield
    finally:
        MACHINE_SHARES.write_text(f"{before}\n")


@pytest.fixture(scope="session")
def vagrant_fleet() -> Iterator[Path]:
    """The 3 VMs up and bootstrapped; yields inventories/vagrant.yml."""
    require_vms()
    from fleetctl.lab.box import ensure_libvirtd

    ensure_libvirtd()  # no service manager in a container: as `fleetctl lab box` does
    t0 = time.monotonic()
    try:
        with vm_cpu_weight():
            sh(["vagrant", "up"], UP_TIMEOUT)
            print(f"vagrant up: {time.monotonic() - t0:.0f}s")
            yield INVENTORY
    finally:
        if os.environ.get("FLEETCTL_VMS_KEEP") != "1":
            remove_everything()
