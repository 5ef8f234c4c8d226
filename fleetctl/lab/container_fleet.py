"""A container fleet: N sshd hosts as podman containers on one internal network.

The namespace lab's stand-in for machines without root network namespaces, and the product's
"Docker multi-host tests": every host runs the image of :mod:`fleetctl.lab.container_image`,
whose init writes its address and host key into the shared folder ``DIR/fleet/nodes/``; from
those this module writes the pinned ``known_hosts`` and an Ansible inventory, so fleetctl's
ordinary SSH path (host keys verified) is what the tests exercise. ``fleetctl/data/compose.yaml``
starts the same hosts with ``docker compose``; :func:`write_inventory` serves both.

Network safety: the network is ``--internal`` (no NAT, no default route in the hosts, which
lack CAP_NET_ADMIN to add one). Podman's CNI bridge of an internal network has no address, so
this machine is given the network's gateway address on that bridge: this machine, and only
it, reaches the hosts. Everything created carries the label ``fleetctl.lab=NAME``; ``down``
removes containers and networks by that label, never by a name pattern.
"""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab import net, procs
from fleetctl.lab.files import LabFolder

LABEL = "fleetctl.lab"
OWNER_LABEL = "fleetctl.lab.owner"
CREATOR_LABEL = "fleetctl.lab.creator"
BASE = Path("/var/tmp/fleetctl-containers")
READY_TIMEOUT = 60.0
NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789")


@dataclass(frozen=True)
class FleetHost:
    name: str
    addr: str
    hostkey: str  # "ssh-ed25519 AAAA…"


def host_python() -> str:
    """The interpreter the hosts run (mounted read-only at the same path): this one, not a
    pyenv shim; in a virtualenv its own ``bin/python`` so the hosts see its packages."""
    if sys.prefix != sys.base_prefix:
        return os.path.join(sys.prefix, "bin", os.path.basename(sys.executable) or "python")
    return os.path.realpath(sys.executable)


def python_mounts() -> list[str]:
    """The folders that interpreter needs: its prefix (and a virtualenv's base prefix). A
    system Python (/usr) is not mounted: the image's own python3 stands at that path."""
    out: list[str] = []
    for p in (sys.base_prefix, sys.prefix):
        real = os.path.realpath(p)
        if real not in out and real != "/usr":
            out.append(real)
    return out


# ----------------------------------------------------------------------- files (any runtime)


def prepare(dir: Path) -> None:
    """``DIR``: the client key, ``fleet/authorized_keys`` for the hosts, an empty
    ``fleet/nodes/`` (stale answers of earlier hosts removed)."""
    dir.mkdir(parents=True, exist_ok=True)
    os.chmod(dir, 0o700)
    key = dir / "id_ed25519"
    if not key.exists():
        net.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleetctl-containers",
                 "-f", str(key)])  # fmt: skip
    fleet = dir / "fleet"
    nodes = fleet / "nodes"
    nodes.mkdir(parents=True, exist_ok=True)
    (fleet / "empty").mkdir(exist_ok=True)  # compose.yaml's stand-in for FLEETCTL_PYTHON_HOME
    # compose.yaml mounts it: no DNS server on the internal network, so a lookup (torch's c10d
    # makes several) fails at once instead of waiting out the machine's unreachable resolver
    (fleet / "resolv.conf").write_text("# fleetctl container fleet: no DNS\nnameserver 127.0.0.1\n")
    for p in nodes.iterdir():
        p.unlink()
    (fleet / "authorized_keys").write_text(key.with_suffix(".pub").read_text())


def read_nodes(dir: Path) -> dict[str, FleetHost]:
    """What the hosts wrote: ``fleet/nodes/NAME`` = ``ADDRESS KEYTYPE KEY``."""
    out: dict[str, FleetHost] = {}
    for p in sorted((dir / "fleet" / "nodes").glob("[!.]*")):
        parts = p.read_text().split()
        if len(parts) == 3:
            out[p.name] = FleetHost(p.name, parts[0], f"{parts[1]} {parts[2]}")
    return out


def _node_order(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return head, int(tail) if tail else 0


def wait_announced(dir: Path, count: int, timeout: float = READY_TIMEOUT) -> list[FleetHost]:
    """The ``count`` hosts once each has written its file, in name order."""
    deadline = time.monotonic() + timeout
    found = read_nodes(dir)
    while len(found) < count:
        if time.monotonic() >= deadline:
            raise LabError(
                f"{dir}/fleet/nodes: {len(found)} of {count} hosts announced themselves "
                f"within {timeout:.0f}s (is the fleet running?)"
            )
        time.sleep(0.05)
        found = read_nodes(dir)
    return sorted(found.values(), key=lambda h: _node_order(h.name))


def wait_hosts(dir: Path, count: int, timeout: float = READY_TIMEOUT) -> list[FleetHost]:
    """The ``count`` hosts once each has written its file and its sshd answers, in name order."""
    deadline = time.monotonic() + timeout
    hosts = wait_announced(dir, count, timeout)
    for h in hosts:
        net.wait_banner(h.addr, 22, deadline)
    return hosts


def write_inventory(dir: Path, hosts: Sequence[FleetHost], python: str) -> Path:
    """``known_hosts`` (the keys the hosts announced) and ``hosts.yml`` for them."""
    import yaml

    known = dir / "known_hosts"
    known.write_text("".join(f"{h.name},{h.addr} {h.hostkey}\n" for h in hosts))
    key = dir / "id_ed25519"
    common = (
        f"-F /dev/null -o UserKnownHostsFile={known} "
        "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
    )
    entries: dict[str, Any] = {
        h.name: {
            "ansible_host": h.addr,
            "ansible_port": 22,
            "ansible_user": "root",
            "ansible_ssh_private_key_file": str(key),
            "ansible_ssh_common_args": common,
            "ansible_python_interpreter": python,
            "fleetctl_known_hosts": str(known),
            "fleetctl_python": python,
            "fleetctl_nic": "eth0",
        }
        for h in hosts
    }
    doc = {"all": {"children": {"nodes": {"hosts": entries}}}}
    inv = dir / "hosts.yml"
    head = f"# fleetctl container fleet ({len(hosts)} hosts); generated\n"
    inv.write_text(head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False))
    return inv


# ------------------------------------------------------------------------- podman, directly


def _podman(*args: str, timeout: float = net.CMD_TIMEOUT, check: bool = True) -> str:
    return net.run(["podman", *args], timeout=timeout, check=check).stdout


def _give_bridge_gateway(network: str) -> str:
    """Put the network's gateway address on its bridge (CNI leaves an internal network's
    bridge without one) so this machine reaches the hosts; the hosts still get no route."""
    info = json.loads(_podman("network", "inspect", network))[0]
    bridge = info["network_interface"]
    subnet = ipaddress.IPv4Network(info["subnets"][0]["subnet"])
    gateway = info["subnets"][0].get("gateway") or str(subnet.network_address + 1)
    have = net.run(["ip", "-4", "-o", "addr", "show", "dev", bridge]).stdout
    if f" {gateway}/" not in have:
        net.run(["ip", "addr", "add", f"{gateway}/{subnet.prefixlen}", "dev", bridge])
    return gateway


def give_gateway_for(addrs: Sequence[str]) -> list[str]:
    """For hosts that podman-compose started: give every labelled podman network holding one
    of ``addrs`` its gateway address on its bridge (as :meth:`ContainerFleet.up` does)."""
    done = []
    for name in _ids("network"):
        info = json.loads(_podman("network", "inspect", name))[0]
        subnets = [ipaddress.IPv4Network(x["subnet"]) for x in info.get("subnets") or []]
        if any(ipaddress.IPv4Address(a) in sn for a in addrs for sn in subnets):
            done.append(_give_bridge_gateway(name))
    return done


@dataclass
class ContainerFleet(LabFolder):
    """A running podman fleet; ``dir`` holds ``fleet.json``, the key, known_hosts, hosts.yml."""

    name: str
    dir: Path
    hosts: list[FleetHost]
    python: str
    network: str

    @classmethod
    def up(
        cls,
        n: int,
        *,
        name: str | None = None,
        dir: Path | None = None,
        owner: str = "cli",
        image: str | None = None,
    ) -> ContainerFleet:
        """``n`` hosts ``node1..n`` on a new internal network; on any failure all of it is
        removed again (by label)."""
        from fleetctl.lab.container_image import ensure_image

        if not 1 <= n <= 64:
            raise LabInputError(f"host count {n}: must be 1-64")
        name = name or "fc" + secrets.token_hex(2)
        if not (1 <= len(name) <= 8 and set(name) <= NAME_CHARS):
            raise LabInputError(f"fleet name {name!r}: 1-8 of [a-z0-9]")
        if list_fleets().get(name):
            raise LabInputError(f"a container fleet named {name} is running")
        image = image or ensure_image("podman")
        dir = Path(dir or BASE / name)
        prepare(dir)
        python = host_python()
        network = f"fleetctl-{name}"
        me = os.getpid()
        labels = [
            f"{LABEL}={name}",
            f"{OWNER_LABEL}={owner}",
            f"{CREATOR_LABEL}={me}-{procs.start_time(me)}",
        ]
        label_args = [a for lab in labels for a in ("--label", lab)]
        fleet = cls(name, dir, [], python, network)
        try:
            _podman("network", "create", "--internal", *label_args, network)
            fd = dir / "fleet"  # what compose.yaml mounts too: /fleet, and no DNS server
            mounts = [f"{fd}:/fleet", f"{fd / 'resolv.conf'}:/etc/resolv.conf:ro"]
            mounts += [f"{p}:{p}:ro" for p in python_mounts()]
            for i in range(1, n + 1):
                host = f"node{i}"
                _podman(
                    "run", "--detach", "--name", f"fleetctl-{name}-{host}", "--hostname", host,
                    "--network", network, *label_args, "--label", f"{LABEL}.host={host}",
                    "--shm-size", "256m", "--pids-limit", "-1",
                    *[a for m in mounts for a in ("--volume", m)],
                    image,
                    timeout=120,
                )  # fmt: skip
            _give_bridge_gateway(network)
            fleet.hosts = wait_hosts(dir, n)
            fleet._add_peers()
            write_inventory(dir, fleet.hosts, python)
            state = {"name": name, "network": network, "python": python, "owner": owner}
            (dir / "fleet.json").write_text(json.dumps(state, indent=1) + "\n")
        except BaseException:
            remove_by_label(name)
            shutil.rmtree(dir, ignore_errors=True)
            raise
        return fleet

    @classmethod
    def load(cls, dir: Path) -> ContainerFleet:
        try:
            state = json.loads((dir / "fleet.json").read_text())
        except (OSError, ValueError) as e:
            raise LabError(f"{dir}: no container fleet here ({e})") from e
        hosts = sorted(read_nodes(dir).values(), key=lambda h: _node_order(h.name))
        return cls(state["name"], dir, hosts, state["python"], state["network"])

    def exec(self, host: str, argv: Sequence[str], timeout: float = 60.0) -> Any:
        """``argv`` inside ``host``'s container (no SSH)."""
        return net.run(
            ["podman", "exec", f"fleetctl-{self.name}-{host}", *argv], timeout=timeout, check=False
        )

    def _add_peers(self) -> None:
        """Every host's name in every host's /etc/hosts: there is no DNS server on the
        internal network (a lookup fails at once), and peers by name are handy."""
        lines = "".join(f"{h.addr}\t{h.name}\n" for h in self.hosts)
        for h in self.hosts:
            argv = ["podman", "exec", "-i", f"fleetctl-{self.name}-{h.name}"]
            net.run([*argv, "sh", "-c", "cat >>/etc/hosts"], input=lines)

    def down(self) -> list[str]:
        removed = remove_by_label(self.name)
        shutil.rmtree(self.dir, ignore_errors=True)
        return removed


def _ids(kind: str, name: str | None = None, runtime: str = "podman") -> list[str]:
    flt = f"label={LABEL}={name}" if name else f"label={LABEL}"
    if kind == "container":
        argv = [runtime, "ps", "--all", "--quiet", "--no-trunc", "--filter", flt]
    else:
        argv = [runtime, "network", "ls", "--quiet", "--filter", flt]  # podman: names
    return net.run(argv).stdout.split()


def remove_by_label(name: str, runtime: str = "podman") -> list[str]:
    """Every container, then every network labelled ``fleetctl.lab=name``; what was removed.
    LabError naming what is still there afterwards."""
    containers = _ids("container", name, runtime)
    if containers:
        stop_now = ["--time", "0"] if runtime == "podman" else []  # docker rm -f: SIGKILL
        net.run([runtime, "rm", "--force", *stop_now, *containers], timeout=120)
    networks = _ids("network", name, runtime)
    if networks:
        net.run([runtime, "network", "rm", *networks])
    left = _ids("container", name, runtime) + _ids("network", name, runtime)
    if left:
        raise LabError(f"container fleet {name}: could not remove {' '.join(left)}")
    return [f"container {c[:12]}" for c in containers] + [f"network {n}" for n in networks]


def list_fleets() -> dict[str, dict[str, str]]:
    """Running fleets by name: their labels (owner, creator), from podman's containers."""
    if shutil.which("podman") is None:
        return {}
    out: dict[str, dict[str, str]] = {}
    fmt = "{{json .Labels}}"
    for line in _podman("ps", "--all", "--filter", f"label={LABEL}", "--format", fmt).splitlines():
        labels = json.loads(line) or {}
        if labels.get(LABEL):
            out.setdefault(labels[LABEL], labels)
    for nid in _ids("network"):
        labels = json.loads(_podman("network", "inspect", nid))[0].get("labels") or {}
        if labels.get(LABEL):
            out.setdefault(labels[LABEL], labels)
    return out


def reap_orphans(owner: str) -> list[str]:
    """Remove the fleets ``owner`` made whose creating process is gone (a killed pytest)."""
    reaped = []
    for name, labels in list_fleets().items():
        if labels.get(OWNER_LABEL) != owner:
            continue
        pid, _, start = labels.get(CREATOR_LABEL, "").partition("-")
        if pid.isdigit() and start.isdigit() and procs.same_process(int(pid), int(start)):
            continue
        remove_by_label(name)
        shutil.rmtree(BASE / name, ignore_errors=True)
        reaped.append(name)
    return reaped
