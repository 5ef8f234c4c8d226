"""Lab networking helpers: subnet choice, route-overlap checks, ``ip``/``tc`` invocations.

Kept apart from the lab lifecycle so the address rules are easy to read and test. Nothing here
sends a packet; the only traffic the lab makes goes to its own hosts (see ``wait_banner``).
"""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from fleetctl.errors import LabError, LabInputError

#: Where automatic subnets come from: /24 pairs (mgmt = even third octet, data = the odd one
#: after it), so a lab never needs more than one look at this range.
POOL = ipaddress.IPv4Network("10.213.0.0/16")
#: --subnet must stay inside RFC 1918 space: the lab bridge must never shadow a public address.
PRIVATE_RANGES = (
    ipaddress.IPv4Network("10.0.0.0/8"),
    ipaddress.IPv4Network("172.16.0.0/12"),
    ipaddress.IPv4Network("192.168.0.0/16"),
)
IFNAMSIZ = 15  # usable characters in a Linux interface name
CMD_TIMEOUT = 30.0


def run(
    argv: Sequence[str],
    *,
    input: str | None = None,
    timeout: float = CMD_TIMEOUT,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run a local admin command; failures become a one-line LabError naming the command."""
    try:
        cp = subprocess.run(
            list(argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as e:
        raise LabError(f"{argv[0]} not found (install iproute2/util-linux)") from e
    except subprocess.TimeoutExpired as e:
        raise LabError(f"`{' '.join(argv[:4])} …` timed out after {timeout:.0f}s") from e
    if check and cp.returncode != 0:
        err = (cp.stderr or cp.stdout).strip().splitlines()
        raise LabError(f"`{' '.join(argv[:5])}` failed: {err[-1] if err else cp.returncode}")
    return cp


def ip_batch(lines: Iterable[str], *, netns: str | None = None, force: bool = False) -> None:
    """Many ``ip`` commands in one process (fast: one fork instead of dozens)."""
    body = "\n".join(lines)
    if not body:
        return
    argv = ["ip"] + (["-n", netns] if netns else []) + (["-force"] if force else [])
    run([*argv, "-batch", "-"], input=body + "\n", check=not force)


def run_parallel(argvs: Sequence[Sequence[str]], timeout: float = CMD_TIMEOUT) -> list[str]:
    """Run independent admin commands side by side; one line per command that failed."""
    running = [
        (
            argv,
            subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            ),
        )
        for argv in argvs
    ]
    errors = []
    for argv, p in running:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            err = f"timed out after {timeout:g}s"
        if p.returncode != 0:
            last = err.strip().splitlines()
            errors.append(f"`{' '.join(argv[:6])}`: {last[-1] if last else p.returncode}")
    return errors


def route_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 destination in every routing table, except default routes."""
    out = run(["ip", "-4", "-j", "route", "show", "table", "all"]).stdout
    nets = []
    for r in json.loads(out or "[]"):
        dst = r.get("dst", "")
        if not dst or dst == "default":
            continue
        try:
            nets.append(ipaddress.IPv4Network(dst, strict=False))
        except ValueError:
            continue
    return nets


def link_exists(name: str) -> bool:
    import os

    return os.path.exists(f"/sys/class/net/{name}")


def netns_exists(name: str) -> bool:
    import os

    return os.path.exists(f"/run/netns/{name}")


def link_info(name: str, netns: str | None = None) -> dict | None:
    """``ip -j link show dev NAME`` (in ``netns``): flags, operstate…; None when it is absent."""
    argv = ["ip"] + (["-n", netns] if netns else []) + ["-j", "link", "show", "dev", name]
    cp = run(argv, check=False)
    if cp.returncode != 0:
        return None
    try:
        data = json.loads(cp.stdout or "[]")
    except ValueError:
        return None
    return data[0] if data else None


def sys_value(name: str, attr: str) -> str | None:
    """``/sys/class/net/NAME/ATTR`` of this machine's own namespace, or None when unreadable."""
    try:
        with open(f"/sys/class/net/{name}/{attr}") as f:
            return f.read().strip()
    except OSError:
        return None


def listen_inodes(pid: int, port: int) -> set[str]:
    """Socket inodes of TCP listeners on ``port`` in the network namespace of process ``pid``."""
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            # sl local rem st tx:rx tr:when retrnsmt uid timeout inode
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rpartition(":")[2], 16) == port:
                found.add(cols[9])
    return found


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    """A user's --subnet: valid IPv4 CIDR inside a private range."""
    try:
        net = ipaddress.IPv4Network(text, strict=False)
    except ValueError as e:
        raise LabInputError(f"--subnet {text!r}: not an IPv4 CIDR ({e})") from e
    if not any(net.subnet_of(p) for p in PRIVATE_RANGES):
        raise LabInputError(
            f"--subnet {net}: must be inside 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
        )
    if net.prefixlen > 28:
        raise LabInputError(f"--subnet {net}: too small (at most /28)")
    return net


def next_block(net: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
    """The same-sized block right after ``net`` (the data network for a given --subnet)."""
    nxt = ipaddress.IPv4Network((int(net.network_address) + net.num_addresses, net.prefixlen))
    return nxt


def host_addr(net: ipaddress.IPv4Network, index: int, total: int) -> ipaddress.IPv4Address:
    """Address of host ``index`` (1-based) of ``total``: .11, .12, … when all fit, else .2, .3, …

    The gateway is always .1; one scheme per lab, so addresses never collide.
    """
    base = 10 if net.num_addresses - 2 >= 10 + total else 1
    offset = base + index
    if index > total or offset >= net.num_addresses - 1:
        raise LabError(f"subnet {net} has no room for host {index}")
    return net.network_address + offset


def overlaps(
    nets: Sequence[ipaddress.IPv4Network], taken: Sequence[ipaddress.IPv4Network]
) -> ipaddress.IPv4Network | None:
    """First network in ``taken`` overlapping any of ``nets`` (None when all are free)."""
    for t in taken:
        for n in nets:
            if n.overlaps(t):
                return t
    return None


def choose_pair(
    taken: Sequence[ipaddress.IPv4Network],
) -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """First free (mgmt, data) /24 pair of POOL."""
    blocks = list(POOL.subnets(new_prefix=24))
    for i in range(0, len(blocks), 2):
        pair = (blocks[i], blocks[i + 1])
        if overlaps(pair, taken) is None:
            return pair
    raise LabError(f"no free subnet pair left in {POOL} (too many labs or routes there)")


def wait_banner(
    addr: str, port: int, deadline: float, alive: Callable[[], str | None] | None = None
) -> None:
    """Poll until ``addr:port`` answers with an SSH banner; ``alive`` returns a reason to stop."""
    last = "no answer"
    while True:
        try:
            with socket.create_connection((addr, port), timeout=0.5) as s:
                s.settimeout(max(0.1, min(2.0, deadline - time.monotonic())))
                data = s.recv(64)
                if data.startswith(b"SSH-2.0-"):
                    return
                last = f"unexpected greeting {data[:20]!r}"
        except OSError as e:
            last = e.strerror or str(e)
        if alive is not None:
            why = alive()
            if why:
                raise LabError(f"{addr}:{port}: sshd not ready: {why}")
        if time.monotonic() >= deadline:
            raise LabError(f"{addr}:{port}: no SSH banner before timeout ({last})")
        time.sleep(0.01)


def ifname_ok(name: str) -> bool:
    return 0 < len(name) <= IFNAMSIZ and "/" not in name and not any(c.isspace() for c in name)


# ----------------------------------------------------------------- the kernel's neighbour table

#: gc_thresh1..3 of the IPv4 neighbour (ARP) table. The table is one for the whole kernel, every
#: network namespace included: at the default hard limit (1024) a lab of ~100 hosts fills it
#: (each host resolves its peers and the controller) and the kernel drops packets ("neighbor
#: table overflow"), which reads as cut links. Real hosts each have a table of their own.
NEIGH_THRESH = "/proc/sys/net/ipv4/neigh/default/gc_thresh{}"
NEIGH_PER_HOST = 64  # entries a lab host may need: its mesh peers, the controller, job peers
NEIGH_BASE = 1024  # what the machine itself keeps


def neigh_thresholds() -> list[int]:
    out = []
    for i in (1, 2, 3):
        with open(NEIGH_THRESH.format(i)) as f:
            out.append(int(f.read()))
    return out


def fit_neighbour_table(hosts: int, saved: Path) -> list[int] | None:
    """Raise the table's limits (never lower them) to fit ``hosts`` lab hosts; the first
    raise saves the machine's values in ``saved`` for ``restore_neighbour_table``. Returns
    the new limits, None when they already fit."""
    need = NEIGH_BASE + NEIGH_PER_HOST * hosts
    cur = neigh_thresholds()
    if cur[2] >= need:
        return None
    if not saved.exists():
        saved.write_text(json.dumps(cur) + "\n")
    new = [cur[0], max(cur[1], need * 3 // 4), need]
    for i, value in ((2, new[1]), (3, new[2])):
        with open(NEIGH_THRESH.format(i), "w") as f:
            f.write(str(value))
    return new


def restore_neighbour_table(saved: Path) -> list[int] | None:
    """Put back the values saved by the first raise (the last lab went down)."""
    try:
        values = json.loads(saved.read_text())
    except (OSError, ValueError):
        return None
    for i in (1, 2, 3):  # lowest first, so thresh1 <= thresh2 <= thresh3 holds throughout
        with open(NEIGH_THRESH.format(i), "w") as f:
            f.write(str(int(values[i - 1])))
    saved.unlink()
    return values
