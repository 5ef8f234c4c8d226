"""Fault injection on running lab hosts: cut/heal links, netem, kill/start sshd, crash/boot
a host, full disks, GPU counts and health (XIDs, ECC, throttling, IB flaps); each recorded in
lab.json so ``reset_faults`` undoes it."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import TYPE_CHECKING

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab import net, procs
from fleetctl.lab.constants import LINK_TIMEOUT, READY_TIMEOUT, SSH_PORT, STOP_TIMEOUT

if TYPE_CHECKING:
    from fleetctl.lab.files import LabFiles
    from fleetctl.lab.hosts import LabHost, LabHosts
    from fleetctl.lab.store import LabStore


class LabFaults:
    """Faults injected into a running lab, each recorded in the store's state so that
    ``reset_faults`` undoes it. Works through the hosts (``runner``) and the files."""

    def __init__(self, store: LabStore, runner: LabHosts, files: LabFiles) -> None:
        self.store = store
        self.runner = runner
        self.files = files

    def _veth(self, host: str, network: str) -> tuple[LabHost, str, str]:
        h = self.store.host(host)
        if network == "mgmt":
            return h, h.mgmt_veth, "eth0"
        if network == "data":
            if not h.data_veth or not h.data_nic:
                raise LabInputError(f"lab {self.store.name} has no data network (--networks 2)")
            return h, h.data_veth, h.data_nic
        raise LabInputError(f"network must be 'mgmt' or 'data', got {network!r}")

    def cut_link(self, host: str, network: str = "mgmt") -> None:
        """Unplug the host's cable on ``network``; returns once the host's NIC reads as down."""
        h, veth, nic = self._veth(host, network)
        with self.store.mutate():
            net.run(["ip", "link", "set", veth, "down"])
            self._wait_link(h, veth, nic, up=False)
            self.store.record_fault({"kind": "link", "host": h.name, "net": network}, True)

    def heal_link(self, host: str, network: str = "mgmt") -> None:
        """Plug the cable back in; returns once the link forwards and nobody's ARP is stale."""
        h, veth, nic = self._veth(host, network)
        with self.store.mutate():
            net.run(["ip", "link", "set", veth, "up"])
            self._wait_link(h, veth, nic, up=True)
            self._flush_neighbours(h, network, nic)
            self.store.record_fault({"kind": "link", "host": h.name, "net": network}, False)

    def _link_pending(self, h: LabHost, veth: str, nic: str, up: bool) -> str | None:
        """What still differs from a fully cut (``up=False``) or healed link; None when done."""
        info = net.link_info(nic, h.ns)
        inside = (info or {}).get("operstate", "?")
        if not up:
            # The host's NIC must read as down (what a node-side check looks at).
            if info is not None and inside == "UP":
                return f"{h.name} {nic} still reads as up"
            return None
        if net.sys_value(veth, "operstate") != "up":
            return f"{veth} is {net.sys_value(veth, 'operstate')}"
        port = net.sys_value(veth, "brport/state")
        if port != "3":  # BR_STATE_FORWARDING
            return f"bridge port {veth} is in state {port} (not forwarding)"
        if info is not None and "UP" in info.get("flags", []) and inside != "UP":
            return f"{h.name} {nic} is {inside}"
        return None

    def _wait_link(self, h: LabHost, veth: str, nic: str, *, up: bool) -> None:
        """Poll until a cut or heal has really taken effect on both ends of the cable.

        ``ip link set`` returns before the kernel's link watcher has handled the carrier
        change: it runs later, under the RTNL lock that namespace churn elsewhere on the
        machine can hold for long. Until it has, a healed bridge port is not forwarding yet
        and the host's NIC drops what it sends, and a cut NIC still reads as "up".
        """
        deadline = time.monotonic() + LINK_TIMEOUT
        while True:
            why = self._link_pending(h, veth, nic, up)
            if why is None:
                return
            if time.monotonic() >= deadline:
                state = "up" if up else "down"
                raise LabError(f"{h.name}: link {veth} not {state} after {LINK_TIMEOUT:g}s: {why}")
            time.sleep(0.01)

    def _flush_neighbours(self, h: LabHost, network: str, nic: str) -> None:
        """Forget every neighbour entry about the healed host, and the host's own on that NIC.

        Address resolution tried while the cable was out leaves entries that are still
        INCOMPLETE with all their probes spent; up to a retransmit interval (1 s) after the
        heal the kernel fails them, and with them every packet queued on them meanwhile
        ("No route to host" for a link that works). Fresh entries resolve at once.
        """
        addr = h.mgmt_addr if network == "mgmt" else h.data_addr
        cmds = [["ip", "-n", h.ns, "neigh", "flush", "dev", nic]]
        for o in self.store.hosts:
            dev = "eth0" if network == "mgmt" else o.data_nic
            if o is not h and dev and net.netns_exists(o.ns):
                cmds.append(["ip", "-n", o.ns, "neigh", "flush", "to", str(addr), "dev", dev])
        if network == "mgmt":  # this machine reaches the hosts through the management bridge
            cmds.append(["ip", "neigh", "flush", "to", str(addr), "dev", self.store.mgmt_bridge])
        errors = net.run_parallel(cmds)
        if errors:
            raise LabError(f"{h.name}: flushing neighbour entries failed: {'; '.join(errors)}")

    def netem(
        self,
        host: str,
        network: str = "mgmt",
        *,
        delay_ms: float = 0,
        jitter_ms: float = 0,
        loss_pct: float = 0,
    ) -> None:
        """Delay/loss on the host's link, applied in both directions (RTT grows by 2×delay)."""
        h, veth, nic = self._veth(host, network)
        if delay_ms < 0 or jitter_ms < 0 or not 0 <= loss_pct <= 100:
            raise LabInputError("netem: delay/jitter must be >= 0 and loss within 0..100")
        spec = ["netem"]
        if delay_ms or jitter_ms:
            spec += ["delay", f"{delay_ms:g}ms"] + ([f"{jitter_ms:g}ms"] if jitter_ms else [])
        if loss_pct:
            spec += ["loss", f"{loss_pct:g}%"]
        if not self.netem_supported():
            raise LabError(
                "this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM / sch_netem "
                "module): delay and loss faults are unavailable here"
            )
        with self.store.mutate():
            net.run(["tc", "qdisc", "replace", "dev", veth, "root", *spec])
            net.run(["tc", "-n", h.ns, "qdisc", "replace", "dev", nic, "root", *spec])
            self.store.state["faults"] = [
                f
                for f in self.store.state.get("faults", [])
                if not (f["kind"] == "netem" and f["host"] == h.name and f["net"] == network)
            ]
            self.store.record_fault(
                {
                    "kind": "netem",
                    "host": h.name,
                    "net": network,
                    "delay_ms": delay_ms,
                    "jitter_ms": jitter_ms,
                    "loss_pct": loss_pct,
                },
                True,
            )

    def netem_supported(self) -> bool:
        """Can this kernel do netem? Probed on a lab host's loopback (harmless, undone)."""
        ns = self.store.hosts[0].ns
        cp = net.run(
            ["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"],
            check=False,
        )
        if cp.returncode == 0:
            net.run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
        return cp.returncode == 0

    def clear_netem(self, host: str, network: str = "mgmt") -> None:
        h, veth, nic = self._veth(host, network)
        with self.store.mutate():
            net.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
            net.run(["tc", "-n", h.ns, "qdisc", "del", "dev", nic, "root"], check=False)
            self.store.state["faults"] = [
                f
                for f in self.store.state.get("faults", [])
                if not (f["kind"] == "netem" and f["host"] == h.name and f["net"] == network)
            ]

    def slow_link(self, host: str, network: str = "data", rate: str = "50mbit") -> None:
        """Throttle traffic into the host on ``network`` (tc tbf on the bridge side of its
        cable): a NIC that negotiated a low speed. tbf, unlike netem, is in every kernel here."""
        h, veth, _nic = self._veth(host, network)
        if not re.fullmatch(r"\d+(\.\d+)?[kmg]?bit", rate):
            raise LabInputError(f"slow: rate must look like 50mbit, got {rate!r}")
        spec = ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
        with self.store.mutate():
            net.run(["tc", "qdisc", "replace", "dev", veth, "root", *spec])
            self.store.state["faults"] = [
                f
                for f in self.store.state.get("faults", [])
                if not (f["kind"] == "slow" and f["host"] == h.name and f["net"] == network)
            ]
            self.store.record_fault(
                {"kind": "slow", "host": h.name, "net": network, "rate": rate}, True
            )

    def clear_slow(self, host: str, network: str = "data") -> None:
        h, veth, _nic = self._veth(host, network)
        with self.store.mutate():
            net.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
            self.store.state["faults"] = [
                f
                for f in self.store.state.get("faults", [])
                if not (f["kind"] == "slow" and f["host"] == h.name and f["net"] == network)
            ]

    def cpu_cap(self, host: str, percent: float = 20.0) -> None:
        """Hold every process of ``host`` to ``percent`` of one CPU (its own cpu cgroup)."""
        from fleetctl.lab import cpucap

        h = self.store.host(host)
        with self.store.mutate():
            prior = [f for f in self.store.faults if f["kind"] == "cpu_cap" and f["host"] == h.name]
            fault = cpucap.cap(self.store.name, h, percent)
            if prior:  # a new percent on a capped host: the way back stays the first one's
                fault["back"] = prior[0]["back"]
                self.store.record_fault(prior[0], False)
            self.store.record_fault(fault, True)

    def clear_cpu_cap(self, host: str) -> None:
        from fleetctl.lab import cpucap

        h = self.store.host(host)
        with self.store.mutate():
            mine = [f for f in self.store.faults if f["kind"] == "cpu_cap" and f["host"] == h.name]
            for f in mine:
                cpucap.clear(self.store.name, h, str(f.get("back") or "/"))
                self.store.record_fault(f, False)

    def kill_sshd(self, host: str, sig: int = signal.SIGKILL) -> int:
        """Kill only the host's sshd listener (open sessions live on, like a real crash).

        Returns once the listening socket is closed, so a connection attempt is refused.
        """
        h = self.store.host(host)
        with self.store.mutate():
            init = h.init_pid
            pid = self.runner.sshd_pid(h.name)
            if pid is None or init is None:
                raise LabError(f"{h.name}: sshd is not running")
            st = procs.start_time(pid)
            held = procs.socket_inodes(pid) & net.listen_inodes(init, SSH_PORT)
            procs.kill(pid, sig)
            if procs.wait_gone([(pid, st)], STOP_TIMEOUT):
                raise LabError(f"{h.name}: sshd pid {pid} did not exit")
            # A session child forked just before the kill may hold the socket a moment longer.
            deadline = time.monotonic() + STOP_TIMEOUT
            while h.init_pid is not None and held & net.listen_inodes(init, SSH_PORT):
                if time.monotonic() >= deadline:
                    raise LabError(f"{h.name}: sshd's listening socket stayed open")
                time.sleep(0.01)
            self.store.record_fault({"kind": "sshd", "host": h.name}, True)
        return pid

    def start_sshd(self, host: str, timeout: float = READY_TIMEOUT) -> None:
        """(Re)start the host's sshd in its namespaces (PID 1 does it) and wait for the banner."""
        h = self.store.host(host)
        with self.store.mutate():
            init = h.init_pid
            if init is None:
                raise LabError(f"{h.name}: host is not running (use boot_host)")
            os.kill(init, signal.SIGUSR1)
            net.wait_banner(
                h.mgmt_addr,
                22,
                time.monotonic() + timeout,
                alive=lambda: None if h.init_pid else "host PID 1 is gone",
            )
            self.store.record_fault({"kind": "sshd", "host": h.name}, False)

    def crash_host(self, host: str) -> None:
        """Kill the host's PID 1: the kernel kills every process on the host at once."""
        h = self.store.host(host)
        with self.store.mutate():
            init = h.init_pid
            if init is not None:
                procs.kill(init)
                self.runner.reap_popen(h)
                if procs.wait_gone([(init, h.starts.get("init"))], STOP_TIMEOUT):
                    raise LabError(f"{h.name}: PID 1 ({init}) did not exit")
            self.store.record_fault({"kind": "crash", "host": h.name}, True)

    def boot_host(self, host: str, timeout: float = READY_TIMEOUT) -> None:
        """Start a crashed host again (same disk area, network and keys) and wait for sshd."""
        h = self.store.host(host)
        with self.store.mutate():
            if h.init_pid is not None:
                raise LabError(f"{h.name}: host is already running")
            self.runner.spawn(h)
            self.runner.record_pids([h])
            net.wait_banner(
                h.mgmt_addr, 22, time.monotonic() + timeout, alive=lambda: self.runner.why_dead(h)
            )
            self.store.state["faults"] = [
                f
                for f in self.store.state.get("faults", [])
                if f["host"] != h.name or f["kind"] not in ("crash", "sshd", "disk")
            ]

    def disk_full(self, host: str, path: str | None = None, size: str = "1m") -> None:
        """Cover ``path`` (default: the workdir) on the host with a tiny tmpfs, so writes
        there fail with ENOSPC.

        Files under ``path`` are hidden until ``disk_ok``; pick a subdirectory (e.g.
        ``/root/.fleetctl/runs``) to keep the rest of the workdir visible.
        """
        h = self.store.host(host)
        path = path or self.store.workdir
        if not path.startswith("/") or not re.match(r"^[0-9]+[kmg]?$", size):
            raise LabInputError("disk_full: path must be absolute and size like 1m/512k")
        with self.store.mutate():
            self._make_dirs(h.name, path)
            # owned by the login user (uid/gid of the home), so it is the disk, not the
            # permissions, that fails the job's writes
            owner = self.runner.exec(
                h.name, ["stat", "-c", "uid=%u,gid=%g", self.store.home], check=True
            )
            opts = f"size={size},mode=0755,{owner.stdout.strip()}"
            self.runner.exec(
                h.name, ["mount", "-t", "tmpfs", "-o", opts, "fleetctl-lab-full", path], check=True
            )
            self.store.record_fault({"kind": "disk", "host": h.name, "path": path}, True)

    def _make_dirs(self, host: str, path: str) -> None:
        """``mkdir -p path``; the folders it makes under the login's home are the login's, as
        the login would have made them (a plain user's job can still write beside them)."""
        home = self.store.home.rstrip("/")
        if not path.startswith(home + "/"):
            self.runner.exec(host, ["mkdir", "-p", path], check=True)
            return
        parts = path[len(home) + 1 :].strip("/").split("/")
        chain = [f"{home}/{'/'.join(parts[: i + 1])}" for i in range(len(parts))]
        script = (
            'h=$1; shift; for d; do [ -d "$d" ] || '
            '{ mkdir "$d" && chown --reference="$h" "$d"; } || exit 1; done'
        )
        self.runner.exec(host, ["sh", "-c", script, "sh", home, *chain], check=True)

    def disk_ok(self, host: str, path: str | None = None) -> None:
        """Undo ``disk_full`` at ``path`` (default: the workdir). A full disk elsewhere on the
        host is an error, not a silent success: the caller named the wrong path."""
        h = self.store.host(host)
        path = path or self.store.workdir
        with self.store.mutate():
            mounts = self.runner.exec(h.name, ["cat", "/proc/self/mounts"], check=True).stdout
            full = [
                ln.split()[1] for ln in mounts.splitlines() if ln.startswith("fleetctl-lab-full ")
            ]
            ours = [p for p in full if p == path]
            if full and not ours:
                filled = ", ".join(sorted(set(full)))
                raise LabInputError(f"{h.name}: no full disk at {path}; the lab filled {filled}")
            for _ in ours:
                self.runner.exec(h.name, ["umount", path], check=True)
            self.store.record_fault({"kind": "disk", "host": h.name, "path": path}, False)

    def set_gpus(self, host: str, count: int | None) -> None:
        """Change what one host's fake nvidia-smi reports (declared ≠ real GPU tests).

        ``0`` keeps the tool but it finds no devices (exit 6, like a broken driver); ``None``
        removes it from the host (``nvidia-smi: command not found``).
        """
        h = self.store.host(host)
        if count is not None and not 0 <= int(count) <= 64:
            raise LabInputError(f"gpus must be 0..64 or None, got {count!r}")
        with self.store.mutate():
            prior = next(
                (f for f in self.store.faults if f["kind"] == "gpus" and f["host"] == h.name), None
            )
            before = prior["before"] if prior else [h.fake_smi, h.gpus]
            if prior is not None:
                self.store.record_fault(prior, False)
            h.fake_smi = count is not None
            h.gpus = int(count or 0)
            self.files.write_gpu_files(h)
            # a changed GPU count is a fault like any other: reset_faults puts it back
            changed = [h.fake_smi, h.gpus] != list(before)
            self.store.record_fault(
                {"kind": "gpus", "host": h.name, "before": list(before)}, changed
            )

    def set_gpu_busy(
        self, host: str, index: int, *, pid: int = 4242, mib: int = 2048, name: str = "python"
    ) -> None:
        """Another job on one of the host's fake GPUs: its compute process and memory show in
        ``nvidia-smi`` (``--query-compute-apps``, ``memory.used``) until ``reset_faults``."""
        h = self.store.host(host)
        if not h.fake_smi or not 0 <= index < h.gpus:
            raise LabInputError(f"{h.name} has no fake GPU {index}")
        with self.store.mutate():
            path = self.store.host_dir(h) / "bin" / "nvidia-smi.json"
            cfg = json.loads(path.read_text())
            cfg.setdefault("apps", []).append(
                {"gpu": index, "pid": pid, "used_memory": mib, "name": name}
            )
            path.write_text(json.dumps(cfg) + "\n")
            self.store.record_fault({"kind": "gpu_busy", "host": h.name}, True)

    def health_fault(
        self, host: str, kind: str, *, gpu: int, xid: int, count: int, reason: str
    ) -> str:
        """A GPU or link health fault on a host with fake GPUs, until ``reset_faults``."""
        from fleetctl.lab.health_faults import inject

        h = self.store.host(host)
        if not h.fake_smi:
            raise LabInputError(f"{h.name} has no fake GPUs (lab up --gpus K)")
        with self.store.mutate():
            what = inject(
                self.store.host_dir(h), kind, gpu, gpus=h.gpus, xid=xid, count=count, reason=reason
            )
            self.store.record_fault({"kind": "health", "host": h.name, "what": what}, True)
        return what

    def reset_faults(self) -> None:
        """Undo every recorded fault (newest first): the fixture's way back to a clean lab."""
        for f in reversed(self.store.faults):
            kind, host = f["kind"], f["host"]
            if kind == "link":
                self.heal_link(host, f["net"])
            elif kind == "netem":
                self.clear_netem(host, f["net"])
            elif kind == "slow":
                self.clear_slow(host, f["net"])
            elif kind == "cpu_cap":
                self.clear_cpu_cap(host)
            elif kind == "disk":
                if self.store.host(host).init_pid is not None:
                    self.disk_ok(host, f["path"])
                else:
                    with self.store.mutate():
                        self.store.record_fault(f, False)
            elif kind == "crash":
                self.boot_host(host)
            elif kind == "gpus":
                fake, count = f["before"]
                self.set_gpus(host, count if fake else None)
            elif kind in ("gpu_busy", "health"):
                with self.store.mutate():
                    self.files.write_gpu_files(self.store.host(host))  # the GPUs idle again
                    self.store.record_fault(f, False)
            elif kind == "sshd" and self.store.host(host).init_pid is not None:
                self.start_sshd(host)
