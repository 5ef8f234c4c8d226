"""Lab hosts: the :class:`LabHost` record, each host's network namespace, PID 1 and sshd,
commands run inside it, and its status."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import LabError
from fleetctl.lab import net, procs
from fleetctl.lab.constants import _HERE, SSH_PORT, STOP_TIMEOUT
from fleetctl.lab.files import _write

if TYPE_CHECKING:
    from fleetctl.lab.files import LabFiles
    from fleetctl.lab.store import LabStore


@dataclass
class LabHost:
    """One lab host. ``ns`` is its network namespace; ``pids`` what the lab started for it."""

    name: str
    index: int
    ns: str
    mgmt_addr: str
    mgmt_veth: str
    nic: str
    data_addr: str | None = None
    data_veth: str | None = None
    data_nic: str | None = None
    gpus: int = 0
    fake_smi: bool = False  # a fake nvidia-smi is on this host's PATH (may report 0 GPUs)
    pids: dict[str, int] = field(default_factory=dict)  # "unshare", "init" -> pid
    starts: dict[str, int] = field(default_factory=dict)  # same keys -> /proc start time

    @property
    def init_pid(self) -> int | None:
        """PID (in this machine's PID namespace) of the host's PID 1, if it is still running."""
        pid = self.pids.get("init")
        return pid if procs.same_process(pid, self.starts.get("init")) else None


class LabHosts:
    """The hosts of a lab as a machine sees them: their network, each one's PID 1 and sshd,
    commands run inside them, their status. Its own state: the processes it started
    (``popens``); the rest is the store's."""

    def __init__(self, store: LabStore, files: LabFiles) -> None:
        self.store = store
        self.files = files
        self.popens: dict[str, subprocess.Popen[bytes]] = {}

    # network -----------------------------------------------------------
    def create_network(self) -> None:
        mg, dt = self.store.state["mgmt"], self.store.state.get("data")
        plen = ipaddress.IPv4Network(mg["subnet"]).prefixlen
        dlen = ipaddress.IPv4Network(dt["subnet"]).prefixlen if dt else 0
        create = [f"link add {mg['bridge']} type bridge"]
        if dt:
            create.append(f"link add {dt['bridge']} type bridge")
        for h in self.store.hosts:
            create.append(f"netns add {h.ns}")
            create.append(f"link add {h.mgmt_veth} type veth peer name eth0 netns {h.ns}")
            if h.data_veth:
                create.append(
                    f"link add {h.data_veth} type veth peer name {h.data_nic} netns {h.ns}"
                )
        net.ip_batch(create)
        roots = [mg["bridge"]] + ([dt["bridge"]] if dt else [])
        roots += [x for h in self.store.hosts for x in (h.mgmt_veth, h.data_veth) if x]
        for ifname in roots:  # no IPv6 chatter (RS/MLD) from the lab's root-side links
            with contextlib.suppress(OSError):
                Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")
        up = [f"addr add {mg['gateway']}/{plen} dev {mg['bridge']}", f"link set {mg['bridge']} up"]
        if dt:
            up.append(f"link set {dt['bridge']} up")
            # This machine has no address on the data network; without this route a packet to
            # a data address would follow the default route off the machine. Unreachable here,
            # as on a real cluster's private fabric (hosts behind a bastion are tested so).
            up.append(f"route add unreachable {dt['subnet']}")
        for h in self.store.hosts:
            up.append(f"link set {h.mgmt_veth} master {mg['bridge']} up")
            if h.data_veth:
                up.append(f"link set {h.data_veth} master {dt['bridge']} up")
        net.ip_batch(up)
        procs_: list[subprocess.Popen[str]] = []
        for h in self.store.hosts:  # inside each namespace, in parallel
            lines = [
                "link set lo up",
                f"addr add {h.mgmt_addr}/{plen} dev eth0",
                "link set eth0 up",
            ]
            if h.data_nic:
                lines += [
                    f"addr add {h.data_addr}/{dlen} dev {h.data_nic}",
                    f"link set {h.data_nic} up",
                ]
            batch = self.store.host_dir(h) / "net.batch"
            _write(batch, "\n".join(lines) + "\n", 0o600)
            procs_.append(
                subprocess.Popen(
                    ["ip", "-n", h.ns, "-batch", str(batch)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        errors = []
        for h, p in zip(self.store.hosts, procs_, strict=True):
            try:
                _, err = p.communicate(timeout=net.CMD_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                err = "timed out"
            if p.returncode != 0:
                errors.append(f"{h.name}: {err.strip().splitlines()[-1] if err.strip() else '?'}")
        if errors:
            raise LabError("configuring host addresses failed: " + "; ".join(errors))

    # processes -----------------------------------------------------------
    def spawn(self, h: LabHost) -> None:
        """Start the host's PID 1 in its netns + fresh mount/UTS/PID namespaces."""
        hd = self.store.host_dir(h)
        logf = open(hd / "init.log", "ab")  # noqa: SIM115 - handed to the child
        try:
            p = subprocess.Popen(
                [
                    "nsenter",
                    f"--net=/run/netns/{h.ns}",
                    "--",
                    "unshare",
                    "--mount",
                    "--uts",
                    "--pid",
                    "--fork",
                    "--mount-proc",
                    "--propagation",
                    "private",
                    "--",
                    self.store.state["python"],
                    "-I",
                    "-S",
                    str(_HERE / "hostinit.py"),
                    str(hd / "host.json"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=logf,
                stderr=logf,
                start_new_session=True,
                close_fds=True,
                cwd="/",
            )
        finally:
            logf.close()
        self.popens[h.name] = p
        h.pids = {"unshare": p.pid}
        h.starts = {}
        st = procs.start_time(p.pid)
        if st is not None:
            h.starts["unshare"] = st

    def record_pids(self, hosts: Sequence[LabHost] | None = None) -> None:
        """Find each host's PID 1 (the child unshare forks) and persist all PIDs."""
        deadline = time.monotonic() + 5.0
        for h in hosts or self.store.hosts:
            upid = h.pids["unshare"]
            while True:
                kids = procs.children(upid)
                if kids:
                    st = procs.start_time(kids[0])
                    if st is not None:
                        h.pids["init"], h.starts["init"] = kids[0], st
                        break
                why = self.why_dead(h)
                if why:
                    raise LabError(f"{h.name}: host did not start: {why}")
                if time.monotonic() > deadline:
                    raise LabError(f"{h.name}: host PID 1 did not appear within 5 s")
                time.sleep(0.002)
        with self.store.dirlock():
            self.store.save()

    def why_dead(self, h: LabHost) -> str | None:
        p = self.popens.get(h.name)
        if p is not None and p.poll() is not None:
            return f"exited with {p.returncode}; {self.log_tail(h)}"
        if p is None and "init" in h.pids and h.init_pid is None:
            return f"PID 1 is gone; {self.log_tail(h)}"
        return None

    def log_tail(self, h: LabHost) -> str:
        tails = []
        for f in ("init.log", "sshd.log"):
            with contextlib.suppress(OSError):
                lines = (
                    (self.store.host_dir(h) / f).read_text(errors="replace").strip().splitlines()
                )
                if lines:
                    tails.append(f"{f}: {lines[-1]}")
        return " | ".join(tails) or "no log output"

    # ------------------------------------------------------------------ exec
    def host_env(self, h: LabHost | str) -> dict[str, str]:
        """The environment ``exec`` gives commands: like an SSH session on that host."""
        host = self.store.host(h) if isinstance(h, str) else h
        return {
            "PATH": self.files.host_path(host),
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "LANG": "C.UTF-8",
            "SHELL": "/bin/bash",
        }

    def nsenter_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``nsenter`` into every namespace of ``host`` (net, mount, UTS, PID) running argv."""
        h = self.store.host(host)
        pid = h.init_pid
        if pid is None:
            raise LabError(f"{h.name}: host is not running (crashed or lab down)")
        return [
            "nsenter",
            f"--target={pid}",
            "--mount",
            "--uts",
            "--net",
            "--pid",
            "--wdns=/",
            "--",
            *argv,
        ]

    def exec(
        self,
        host: str,
        argv: Sequence[str],
        *,
        input: str | None = None,
        timeout: float = 30.0,
        check: bool = False,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` (inside all its namespaces) without SSH; for tests/faults.

        On timeout the whole process group is killed, so nothing is left on the host.
        """
        full = self.nsenter_argv(host, argv)
        p = subprocess.Popen(
            full,
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.host_env(host), **(env or {})},
            start_new_session=True,
        )
        try:
            out, err = p.communicate(input=input, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
            raise LabError(f"{host}: `{shlex.join(argv)}` timed out after {timeout:g}s") from e
        cp = subprocess.CompletedProcess(list(argv), p.returncode, out, err)
        if check and cp.returncode != 0:
            last = (err or out).strip().splitlines()
            raise LabError(
                f"{host}: `{shlex.join(argv)}` exited {cp.returncode}"
                + (f": {last[-1]}" if last else "")
            )
        return cp

    # ------------------------------------------------------------------ status
    def sshd_pid(self, host: str) -> int | None:
        """PID of the host's sshd listener, or None when nothing listens on port 22.

        The listener is the child of the host's PID 1 that runs sshd *and holds the listening
        socket*. The executable alone does not tell: OpenSSH < 9.8 runs every session as a
        re-executed sshd, and sessions that outlived a killed listener are re-parented to PID
        1, so they look the same (killing one of those instead left sshd answering).
        """
        h = self.store.host(host)
        init = h.init_pid
        if init is None:
            return None
        listening = net.listen_inodes(init, SSH_PORT)
        if not listening:
            return None
        sshd = os.path.realpath(self.store.state["sshd"])
        for pid in procs.children(init):
            if (
                procs.exe_of(pid) == sshd
                and procs.start_time(pid) is not None
                and procs.socket_inodes(pid) & listening
            ):
                return pid
        return None

    def status(self, probe: bool = True) -> dict[str, Any]:
        """A JSON-able snapshot: per host its PIDs, whether sshd runs and answers, faults."""
        hosts = []
        for h in self.store.hosts:
            ok = None
            if probe and h.init_pid is not None:
                try:
                    net.wait_banner(h.mgmt_addr, 22, time.monotonic() + 0.5)
                    ok = True
                except LabError:
                    ok = False
            hosts.append(
                {
                    "name": h.name,
                    "ns": h.ns,
                    "mgmt_addr": h.mgmt_addr,
                    "data_addr": h.data_addr,
                    "nic": h.nic,
                    "gpus": h.gpus,
                    "init_pid": h.init_pid,
                    "sshd_pid": self.sshd_pid(h.name),
                    "ssh_ok": ok,
                }
            )
        return {
            "name": self.store.name,
            "dir": str(self.store.dir),
            "phase": self.store.state.get("phase"),
            "mgmt": self.store.state["mgmt"],
            "data": self.store.state.get("data"),
            "inventory": str(self.store.inventory_path),
            "ssh_config": str(self.store.ssh_config),
            "hosts": hosts,
            "faults": self.store.faults,
        }

    def reap_popen(self, h: LabHost) -> None:
        p = self.popens.pop(h.name, None)
        if p is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=STOP_TIMEOUT)
