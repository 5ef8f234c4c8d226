"""A lab's state, ``DIR/lab.json``: the one thing the lab's parts share.

:class:`LabStore` holds the document (names, addresses, PIDs, faults), the hosts as
:class:`~fleetctl.lab.hosts.LabHost` records, the paths derived from them and the lock that
serialises changes between processes (the CLI's faults and a test's lab). The parts of a lab
(``files``, ``hosts``, ``faults``; composed by :class:`~fleetctl.lab.core.Lab`) each get the
store and read or change the state only through it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fleetctl.errors import LabInputError
from fleetctl.lab import net
from fleetctl.lab.constants import STATE_VERSION, WORKDIR
from fleetctl.lab.files import LabFolder, _write
from fleetctl.lab.hosts import LabHost
from fleetctl.lab.registry import _locked


class LabStore(LabFolder):
    """``DIR/lab.json`` in memory: the state document and its hosts, saved under a lock."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.dir = Path(state["dir"])
        self.name: str = state["name"]
        self.hosts: list[LabHost] = [LabHost(**h) for h in state["hosts"]]
        self._lock_depth = 0
        self._rlock = threading.RLock()

    # ------------------------------------------------------------------ names and paths
    # inventory_path, known_hosts, key_path: LabFolder's
    @property
    def ssh_config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def networks(self) -> int:
        return 2 if self.state.get("data") else 1

    @property
    def mgmt_bridge(self) -> str:
        return self.state["mgmt"]["bridge"]

    @property
    def data_bridge(self) -> str | None:
        return (self.state.get("data") or {}).get("bridge")

    @property
    def user(self) -> str | None:
        """The non-root user fleetctl logs in as (None: root)."""
        return self.state.get("user")

    @property
    def home(self) -> str:
        """The login user's home on every host."""
        return "/root" if self.user is None else f"/home/{self.user}"

    @property
    def workdir(self) -> str:
        """fleetctl's default workdir on the hosts, as an absolute path."""
        return WORKDIR if self.user is None else f"{self.home}/.fleetctl"

    def host(self, name: str) -> LabHost:
        for h in self.hosts:
            if h.name == name or h.ns == name:
                return h
        raise LabInputError(
            f"lab {self.name}: no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})"
        )

    def host_dir(self, host: LabHost | str) -> Path:
        name = host if isinstance(host, str) else host.name
        return self.dir / "hosts" / name

    # ------------------------------------------------------------------ faults
    @property
    def faults(self) -> list[dict[str, Any]]:
        return list(self.state.get("faults", []))

    def record_fault(self, fault: dict[str, Any], present: bool) -> None:
        """``fault`` is (``present``) or is no longer in the lab's list of faults."""
        faults = [f for f in self.state.get("faults", []) if f != fault]
        if present:
            faults.append(fault)
        self.state["faults"] = faults

    # ------------------------------------------------------------------ saving
    @contextlib.contextmanager
    def dirlock(self, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Inter-process lock on DIR/.lock, re-entrant per thread (flock alone is not)."""
        with self._rlock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            with _locked(self.dir / ".lock", on_wait):
                self._lock_depth = 1
                try:
                    yield
                finally:
                    self._lock_depth = 0

    def save(self) -> None:
        self.state["hosts"] = [asdict(h) for h in self.hosts]
        _write(self.dir / "lab.json", json.dumps(self.state, indent=2) + "\n", 0o600)

    @contextlib.contextmanager
    def mutate(self, on_wait: Callable[[str], None] | None = None) -> Iterator[None]:
        """Serialize changes with other processes (CLI faults) and persist them."""
        with self.dirlock(on_wait):
            try:
                fresh = json.loads((self.dir / "lab.json").read_text())
                self.state["faults"] = fresh.get("faults", [])
                by = {h["name"]: h for h in fresh.get("hosts", [])}
                for h in self.hosts:
                    if h.name in by:
                        h.pids, h.starts = by[h.name]["pids"], by[h.name]["starts"]
                        h.gpus = by[h.name].get("gpus", h.gpus)
                        h.fake_smi = by[h.name].get("fake_smi", h.fake_smi)
            except (OSError, ValueError):
                pass
            yield
            self.save()

    def remove_files(self) -> None:
        """Delete what the lab wrote in DIR (and DIR itself if the lab created it)."""
        d = self.dir
        if not (d / "lab.json").exists():
            return
        for sub in ("hosts", "shared-home"):
            shutil.rmtree(d / sub, ignore_errors=True)
        for f in (
            "id_ed25519",
            "id_ed25519.pub",
            "authorized_keys",
            "known_hosts",
            "ssh_config",
            "hosts.yml",
            ".lock",
            "lab.json",
        ):
            with contextlib.suppress(FileNotFoundError):
                (d / f).unlink()
        if self.state.get("created_dir"):
            with contextlib.suppress(OSError):
                d.rmdir()


def plan_state(
    name: str,
    d: Path,
    n: int,
    networks: int,
    gpus: int,
    mgmt_net: ipaddress.IPv4Network,
    data_net: ipaddress.IPv4Network,
    python: str,
    sshd: str,
) -> dict[str, Any]:
    """lab.json as ``up`` first writes it: every name and address the lab will create, decided
    before creating anything (``down`` then cleans up a crashed ``up`` from it)."""
    hosts = []
    for i in range(1, n + 1):
        data_nic = None
        if networks == 2:
            data_nic = "ib0" if (i == n and n > 1) else "data0"
        h = LabHost(
            name=f"node{i}",
            index=i,
            ns=f"{name}-node{i}",
            mgmt_addr=str(net.host_addr(mgmt_net, i, n)),
            mgmt_veth=f"{name}-m{i}",
            nic=data_nic or "eth0",
            data_addr=str(net.host_addr(data_net, i, n)) if networks == 2 else None,
            data_veth=f"{name}-d{i}" if networks == 2 else None,
            data_nic=data_nic,
            gpus=gpus,
            fake_smi=gpus > 0,
        )
        for ifname in (h.mgmt_veth, h.data_veth):
            if ifname and not net.ifname_ok(ifname):
                raise LabInputError(f"interface name {ifname!r} too long")
        hosts.append(asdict(h))
    return {
        "version": STATE_VERSION,
        "name": name,
        "dir": str(d),
        "phase": "creating",
        "created": time.time(),
        "python": python,
        "sshd": sshd,
        "gpus": gpus,
        "mgmt": {
            "subnet": str(mgmt_net),
            "bridge": f"{name}-m",
            "gateway": str(mgmt_net.network_address + 1),
        },
        "data": {"subnet": str(data_net), "bridge": f"{name}-d"} if networks == 2 else None,
        "hosts": hosts,
        "faults": [],
    }
