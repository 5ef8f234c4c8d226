"""The namespace lab: N real sshd hosts on this machine, each in its own namespaces.

Why: every promise fleetctl makes is about several machines, and Docker/VMs are not available,
but network/mount/UTS/PID namespaces are. Each host is

* a named network namespace ``<lab>-<host>`` with ``eth0`` on the lab's management bridge
  (``<lab>-m``, which holds the gateway address so this machine can SSH in) and, with two
  networks, ``data0``/``ib0`` on a data bridge (``<lab>-d``, no address on the bridge);
* a PID 1 (``hostinit.py``) in its own mount/UTS/PID namespaces: hostname ``nodeK``, private
  ``/root/.fleetctl``, ``/tmp``, ``/dev/shm``, ``/etc/hosts`` and ``/sys``; the machine's Python
  and packages stay visible;
* its own sshd (own ed25519 host key, key-only auth, raised session limits) run by that PID 1.

No default route, no NAT, no ip_forward change: nothing can leave the machine. All state is in
``DIR/lab.json`` (written before anything is created) so ``down`` also cleans a crashed ``up``.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab import net, procs
from fleetctl.lab.constants import (
    DEFAULT_PARENT,
    MAX_HOSTS,
    NAME_RE,
    NEIGH_SAVED,
    READY_TIMEOUT,
    REGISTRY,
    STATE_VERSION,
    STOP_TIMEOUT,
    USER_RE,
    WORKDIR,
)
from fleetctl.lab.faults import LabFaults
from fleetctl.lab.files import LabFiles, _write
from fleetctl.lab.hosts import LabHost, LabHosts
from fleetctl.lab.registry import _entry_live, _locked, _name_in_use, _registry_entries
from fleetctl.lab.store import LabStore, plan_state
from fleetctl.lab.users import ensure_user, remove_user

Say = Callable[[str], None]  # where a long step says what it is doing


def _hosts(n: int) -> str:
    return f"{n} host{'s' if n != 1 else ''}"


def _real_python() -> str:
    """The interpreter itself, not a pyenv shim (shims cost ~100 ms and may pick another) —
    but in a virtualenv its own ``bin/python``: resolving that link would name the base
    interpreter, and the hosts would not see the venv's packages."""
    if sys.prefix != sys.base_prefix:  # a venv: its python reads pyvenv.cfg next to it
        return os.path.join(sys.prefix, "bin", os.path.basename(sys.executable) or "python")
    return os.path.realpath(sys.executable)


HOST_PRIVATE = ("/tmp", "/dev/shm", WORKDIR)  # each lab host mounts its own: this one's hidden


def _check_python_visible(python: str) -> str:
    """``python`` if the lab's hosts can run it; LabInputError naming it if it lives where
    each host has a private folder instead (a venv under /tmp): the hosts would get no Python
    and the lab would say ok."""
    for path in dict.fromkeys((python, os.path.realpath(python))):
        hidden = next((h for h in HOST_PRIVATE if path == h or path.startswith(h + "/")), None)
        if hidden is None:
            continue
        shown = python if path == python else f"{python} (-> {path})"
        base = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
        hint = ""
        if not any(base == h or base.startswith(h + "/") for h in HOST_PRIVATE):
            hint = f"; run it with a Python they see, e.g. {base} -m fleetctl lab up"
        raise LabInputError(
            f"the lab hosts cannot run {shown}: each host has its own private {hidden}{hint}"
        )
    return python


def _sshd_binary() -> str:
    found = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin:/usr/bin")
    if not found:
        raise LabError("sshd not found (install openssh-server)")
    return os.path.realpath(found)


def require_root() -> None:
    """Fail early with one line: everything the lab does needs CAP_SYS_ADMIN/CAP_NET_ADMIN."""
    if os.geteuid() != 0:
        raise LabError(
            "fleetctl lab needs root (it creates network namespaces, bridges and mounts; "
            "run it with sudo)"
        )
    for tool in ("ip", "nsenter", "unshare", "tc"):
        if shutil.which(tool) is None:
            raise LabError(f"fleetctl lab needs `{tool}` (install iproute2 and util-linux)")


def _check_dir(d: Path) -> Path:
    d = Path(os.path.abspath(d))
    s = str(d)
    if any(c.isspace() for c in s) or any(c in s for c in "\"'\\#"):
        raise LabInputError(f"--dir {s}: no spaces, quotes, backslashes or # please")
    real = os.path.realpath(s)
    for hidden in ("/tmp", WORKDIR):
        if real == hidden or real.startswith(hidden + "/"):
            raise LabInputError(
                f"--dir {s}: must not be under {hidden} (each lab host gets its own private "
                f"{hidden}, which would hide the lab's files); use e.g. {DEFAULT_PARENT}/NAME"
            )
    return d


class Lab:
    """A running (or half-built, or torn-down) lab, backed by ``DIR/lab.json``.

    Composed of parts with explicit state: ``store`` (lab.json: names, addresses, PIDs, faults,
    and the lock), ``files`` (keys, configs, inventory), ``runner`` (the hosts' network, PID 1s
    and sshds, exec, status; it holds the processes it started) and ``injector`` (faults).
    ``Lab`` creates and removes a lab and forwards the parts' public methods."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.store = LabStore(state)
        self.files = LabFiles(self.store)
        self.runner = LabHosts(self.store, self.files)
        self.injector = LabFaults(self.store, self.runner, self.files)

    # ------------------------------------------------------------------ the store's
    @property
    def state(self) -> dict[str, Any]:
        return self.store.state

    @property
    def dir(self) -> Path:
        return self.store.dir

    @property
    def name(self) -> str:
        return self.store.name

    @property
    def hosts(self) -> list[LabHost]:
        return self.store.hosts

    @property
    def inventory_path(self) -> Path:
        return self.store.inventory_path

    @property
    def known_hosts(self) -> Path:
        return self.store.known_hosts

    @property
    def key_path(self) -> Path:
        return self.store.key_path

    @property
    def ssh_config(self) -> Path:
        return self.store.ssh_config

    @property
    def networks(self) -> int:
        return self.store.networks

    @property
    def mgmt_bridge(self) -> str:
        return self.store.mgmt_bridge

    @property
    def data_bridge(self) -> str | None:
        return self.store.data_bridge

    @property
    def faults(self) -> list[dict[str, Any]]:
        return self.store.faults

    @property
    def user(self) -> str | None:
        """The non-root user fleetctl logs in as (None: root)."""
        return self.store.user

    @property
    def home(self) -> str:
        """The login user's home on every host."""
        return self.store.home

    @property
    def workdir(self) -> str:
        """fleetctl's default workdir on the hosts, as an absolute path."""
        return self.store.workdir

    def host(self, name: str) -> LabHost:
        return self.store.host(name)

    def host_dir(self, host: LabHost | str) -> Path:
        return self.store.host_dir(host)

    def __repr__(self) -> str:
        return f"Lab({self.name!r}, dir={str(self.dir)!r}, hosts={len(self.hosts)})"

    # ------------------------------------------------------------------ the runner's
    def host_env(self, h: LabHost | str) -> dict[str, str]:
        return self.runner.host_env(h)

    def nsenter_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        return self.runner.nsenter_argv(host, argv)

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
        return self.runner.exec(host, argv, input=input, timeout=timeout, check=check, env=env)

    def sshd_pid(self, host: str) -> int | None:
        return self.runner.sshd_pid(host)

    def status(self, probe: bool = True) -> dict[str, Any]:
        return self.runner.status(probe)

    # ------------------------------------------------------------------ the injector's
    def cut_link(self, host: str, network: str = "mgmt") -> None:
        self.injector.cut_link(host, network)

    def heal_link(self, host: str, network: str = "mgmt") -> None:
        self.injector.heal_link(host, network)

    def netem(
        self,
        host: str,
        network: str = "mgmt",
        *,
        delay_ms: float = 0,
        jitter_ms: float = 0,
        loss_pct: float = 0,
    ) -> None:
        self.injector.netem(
            host, network, delay_ms=delay_ms, jitter_ms=jitter_ms, loss_pct=loss_pct
        )

    def netem_supported(self) -> bool:
        return self.injector.netem_supported()

    def clear_netem(self, host: str, network: str = "mgmt") -> None:
        self.injector.clear_netem(host, network)

    def slow_link(self, host: str, network: str = "data", rate: str = "50mbit") -> None:
        self.injector.slow_link(host, network, rate)

    def clear_slow(self, host: str, network: str = "data") -> None:
        self.injector.clear_slow(host, network)

    def cpu_cap(self, host: str, percent: float = 20.0) -> None:
        self.injector.cpu_cap(host, percent)

    def clear_cpu_cap(self, host: str) -> None:
        self.injector.clear_cpu_cap(host)

    def kill_sshd(self, host: str, sig: int = signal.SIGKILL) -> int:
        return self.injector.kill_sshd(host, sig)

    def start_sshd(self, host: str, timeout: float = READY_TIMEOUT) -> None:
        self.injector.start_sshd(host, timeout)

    def crash_host(self, host: str) -> None:
        self.injector.crash_host(host)

    def boot_host(self, host: str, timeout: float = READY_TIMEOUT) -> None:
        self.injector.boot_host(host, timeout)

    def disk_full(self, host: str, path: str | None = None, size: str = "1m") -> None:
        self.injector.disk_full(host, path, size)

    def disk_ok(self, host: str, path: str | None = None) -> None:
        self.injector.disk_ok(host, path)

    def set_gpus(self, host: str, count: int | None) -> None:
        self.injector.set_gpus(host, count)

    def set_gpu_busy(
        self, host: str, index: int, *, pid: int = 4242, mib: int = 2048, name: str = "python"
    ) -> None:
        self.injector.set_gpu_busy(host, index, pid=pid, mib=mib, name=name)

    def health_fault(self, host: str, kind: str, **how: Any) -> str:
        """``lab fault gpu-xid|ecc|throttle|ib-flap HOST`` (fleetctl.lab.health_faults):
        ``gpu``, ``xid``, ``count``, ``reason``."""
        how = {"gpu": 0, "xid": 79, "count": 1, "reason": "hw_slowdown", **how}
        return self.injector.health_fault(host, kind, **how)

    def reset_faults(self) -> None:
        self.injector.reset_faults()

    @classmethod
    def load(cls, dir: str | os.PathLike[str]) -> Lab:
        """The lab whose state is in ``dir/lab.json``."""
        path = Path(dir) / "lab.json"
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise LabError(f"{path}: no lab here") from e
        except (OSError, ValueError) as e:
            raise LabError(f"{path}: unreadable lab state ({e})") from e
        if state.get("version") != STATE_VERSION:
            raise LabError(f"{path}: unknown lab state version {state.get('version')!r}")
        return cls(state)

    @classmethod
    def running(cls) -> list[Lab]:
        """Labs registered on this machine (``/run/fleetctl-lab``) whose state is readable."""
        labs = []
        for e in _registry_entries():
            with contextlib.suppress(LabError):
                labs.append(cls.load(e["dir"]))
        return labs

    @classmethod
    def find(cls, dir: str | os.PathLike[str] | None = None, name: str | None = None) -> Lab:
        """Resolve ``--dir``/``--name``, or the only running lab."""
        if dir is not None:
            return cls.load(dir)
        entries = _registry_entries()
        if name is not None:
            for e in entries:
                if e.get("name") == name:
                    return cls.load(e["dir"])
            default = DEFAULT_PARENT / name
            if (default / "lab.json").exists():
                return cls.load(default)
            raise LabError(f"no lab named {name!r} on this machine")
        if not entries:
            raise LabError("no lab is running on this machine (start one with `fleetctl lab up`)")
        if len(entries) > 1:
            names = ", ".join(e.get("name", "?") for e in entries)
            raise LabInputError(f"several labs are running ({names}): pass --name or --dir")
        return cls.load(entries[0]["dir"])

    # ------------------------------------------------------------------ up
    @classmethod
    def up(
        cls,
        n: int,
        dir: str | os.PathLike[str] | None = None,
        networks: int = 1,
        gpus: int = 0,
        name: str | None = None,
        subnet: str | None = None,
        *,
        machine_bashrc: bool = False,
        owner: str | None = None,
        ready_timeout: float = READY_TIMEOUT,
        user: str | None = None,
        shared_home: bool = False,
    ) -> Lab:
        """Create ``n`` hosts and wait until every sshd answers. Cleans up fully on any failure.

        ``user``: fleetctl logs in as this non-root user (made if missing, with a home of its
        own on every host, or one home all hosts share with ``shared_home``, as on an NFS
        home); root's home is then hidden on the hosts, but for the Python the lab runs."""
        if not isinstance(n, int) or not 1 <= n <= MAX_HOSTS:
            raise LabInputError(f"host count must be 1..{MAX_HOSTS}, got {n!r}")
        if networks not in (1, 2):
            raise LabInputError(f"--networks must be 1 or 2, got {networks!r}")
        if not isinstance(gpus, int) or not 0 <= gpus <= 64:
            raise LabInputError(f"--gpus must be 0..64, got {gpus!r}")
        if name is not None and not NAME_RE.match(name):
            raise LabInputError(
                f"--name {name!r}: 1-8 lowercase letters/digits starting with a letter "
                "(it prefixes interface names, which Linux limits to 15 characters)"
            )
        if user == "root":
            user = None
        if user is not None and not USER_RE.match(user):
            raise LabInputError(f"--user {user!r}: a login name (lowercase letters, digits, _-)")
        if shared_home and user is None:
            raise LabInputError("--shared-home needs --user (root's home is never shared)")
        want = net.parse_subnet(subnet) if subnet else None
        if want is not None:
            try:
                net.host_addr(want, n, n)
            except LabError as e:
                raise LabInputError(f"--subnet {want}: too small for {n} hosts") from e
        require_root()
        sshd = _sshd_binary()
        python = _check_python_visible(_real_python())

        with _locked(REGISTRY / ".lock"):
            entries = [e for e in _registry_entries() if _entry_live(e)]
            for e in _registry_entries():
                if e not in entries:  # stale: its creator and its namespaces are gone
                    with contextlib.suppress(OSError):
                        (REGISTRY / f"{e['name']}.json").unlink()
            used_names = {e.get("name") for e in entries}
            if name is None:
                for _ in range(100):
                    cand = "fl" + secrets.token_hex(2)
                    if cand not in used_names and not _name_in_use(cand):
                        name = cand
                        break
                else:  # pragma: no cover
                    raise LabError("could not pick a free lab name")
            elif name in used_names or _name_in_use(name):
                raise LabInputError(f"--name {name}: a lab (or interfaces) named {name} exist")
            d = _check_dir(Path(dir) if dir is not None else DEFAULT_PARENT / name)
            if (d / "lab.json").exists():
                try:
                    old: Lab | None = cls.load(d)
                except LabError:
                    old = None
                if old is not None and old.state.get("phase") != "down":
                    raise LabInputError(
                        f"{d}: lab {old.name} already lives here (run `fleetctl lab down "
                        f"--dir {d}` first)"
                    )
            taken: list[ipaddress.IPv4Network] = net.route_networks()
            for e in entries:
                taken += [ipaddress.IPv4Network(s) for s in e.get("subnets", [])]
            if want is not None:
                pair = (want, net.next_block(want))
                nets = pair if networks == 2 else pair[:1]
                clash = net.overlaps(nets, taken)
                if clash is not None:
                    which = f"{want} (data network {pair[1]})" if networks == 2 else str(want)
                    raise LabInputError(
                        f"--subnet {which} overlaps {clash}, which is already routed on this "
                        "machine or used by another lab"
                    )
            else:
                pair = net.choose_pair(taken)
            mgmt_net, data_net = pair
            created_dir = not d.exists()
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
            # a login user must traverse DIR to its hosts' bin dirs (fake nvidia-smi); 0711
            # lists nothing, and every secret in DIR is 0600 or in a 0700 folder
            os.chmod(d, 0o711 if user else 0o700)
            if d.parent == DEFAULT_PARENT:
                os.chmod(DEFAULT_PARENT, 0o711)
            state = cls._plan(name, d, n, networks, gpus, mgmt_net, data_net, python, sshd)
            state["created_dir"] = created_dir
            state["machine_bashrc"] = bool(machine_bashrc)
            state["user"] = user
            state["shared_home"] = bool(shared_home)
            lab = cls(state)
            lab.store.save()
            entry = {
                "name": name,
                "dir": str(d),
                "subnets": [str(mgmt_net), str(data_net)],
                "creator_pid": os.getpid(),
                "creator_start": procs.start_time(os.getpid()),
                "owner": owner,
                "user": user,
                "hosts": n,
            }
            REGISTRY.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write(REGISTRY / f"{name}.json", json.dumps(entry) + "\n", 0o600)
            hosts = n + sum(int(e.get("hosts") or 0) for e in entries)
        try:  # registered: a failure from here on is cleaned up by down()
            net.fit_neighbour_table(hosts, REGISTRY / NEIGH_SAVED)
            lab._build(ready_timeout)
        except BaseException as e:
            try:
                lab.down()
            except Exception as cleanup:  # keep the original error; mention the leftover
                raise LabError(f"lab up failed ({e}); cleanup also failed: {cleanup}") from e
            if isinstance(e, LabError):
                raise
            if isinstance(e, Exception):
                raise LabError(f"lab up failed: {e}") from e
            raise
        return lab

    _plan = staticmethod(plan_state)  # every name and address, before creating anything

    def _build(self, ready_timeout: float) -> None:
        t0 = time.monotonic()
        if self.user is None:
            os.makedirs(WORKDIR, exist_ok=True)  # the mountpoint must exist in the real tree
        else:
            ensure_user(self.store)
        self.files.write_keys_and_configs()
        self.runner.create_network()
        for h in self.hosts:
            self.runner.spawn(h)
        self.runner.record_pids()
        deadline = time.monotonic() + ready_timeout
        for h in self.hosts:
            net.wait_banner(h.mgmt_addr, 22, deadline, alive=lambda h=h: self.runner.why_dead(h))
        self.state["phase"] = "up"
        self.state["up_seconds"] = round(time.monotonic() - t0, 3)
        with self.store.dirlock():
            self.store.save()

    # ------------------------------------------------------------------ down
    def down(self, keep_dir: bool = False, progress: Say | None = None) -> list[str]:
        """Remove everything the lab made; idempotent; works from lab.json after a crashed up.

        Returns what had to be removed (empty when already down). Raises LabError naming any
        leftover it could not remove. ``progress`` hears each step as it starts and each
        host as it is gone: a teardown may wait (a lock, processes that take seconds to die).
        """
        say = progress or (lambda _: None)
        require_root()
        if (self.dir / "lab.json").exists():  # PIDs may have changed in another process
            with contextlib.suppress(OSError, ValueError), self.store.mutate(on_wait=say):
                pass
        removed: list[str] = []
        # 0. Slurm's daemons (`lab up --slurm`), by PID: munged and slurmctld live out here
        from fleetctl.lab import slurm

        removed += slurm.stop(self, say)
        # 1. Processes: PID 1 of each host (verified by start time) takes its whole PID
        #    namespace with it; then anything else still inside a lab network namespace.
        pending: dict[str, list[tuple[int, int | None]]] = {}
        for h in self.hosts:
            for key in ("init", "unshare"):
                pid, st = h.pids.get(key), h.starts.get(key)
                if pid and procs.same_process(pid, st):
                    procs.kill(pid)
                    pending.setdefault(h.name, []).append((pid, st))
                    removed.append(f"{h.name} {key} pid {pid}")
        for h in self.hosts:
            self.runner.reap_popen(h)
        if pending:
            n, its = len(pending), "its" if len(pending) == 1 else "their"
            say(f"stopping {_hosts(n)}: up to {STOP_TIMEOUT:g} s for {its} processes to end")
        stuck: list[int] = []
        deadline = time.monotonic() + STOP_TIMEOUT
        for name, pids in pending.items():
            left = procs.wait_gone(pids, max(0.0, deadline - time.monotonic()))
            stuck += left
            say(f"{name}: stopped" if not left else f"{name}: pid {left[0]} still running")
        deadline = time.monotonic() + STOP_TIMEOUT
        for h in self.hosts:
            while True:
                left = procs.pids_in_netns(f"/run/netns/{h.ns}")
                if not left or time.monotonic() > deadline:
                    stuck += left
                    break
                say(f"{h.name}: stopping {len(left)} process(es) left in its network namespace")
                for pid in left:
                    procs.kill(pid)
                    removed.append(f"{h.name} stray pid {pid}")
                procs.wait_gone([(p, None) for p in left], 1.0)
        from fleetctl.lab import cpucap  # the cpu-cap fault's groups, empty now

        removed += cpucap.remove_all(self.name)
        # 2. Links (root-side veth ends take their peers along), bridges, namespaces.
        links = [x for h in self.hosts for x in (h.mgmt_veth, h.data_veth) if x]
        links += [b for b in (self.mgmt_bridge, self.data_bridge) if b]
        cmds = [f"link del {x}" for x in links if net.link_exists(x)]
        cmds += [f"netns del {h.ns}" for h in self.hosts if net.netns_exists(h.ns)]
        data = self.state.get("data") or {}
        if data.get("subnet") and ipaddress.IPv4Network(data["subnet"]) in net.route_networks():
            cmds.append(f"route del unreachable {data['subnet']}")
        removed += [c.split(" ", 2)[2] for c in cmds]
        if cmds:
            say(f"removing {len(cmds)} link(s), network namespace(s) and route(s)")
        net.ip_batch(cmds, force=True)
        leftovers = [x for x in links if net.link_exists(x)]
        leftovers += [h.ns for h in self.hosts if net.netns_exists(h.ns)]
        leftovers += [f"pid {p}" for p in stuck]
        if leftovers:  # keep the registry entry: `fleetctl lab down` must still find the lab
            raise LabError(f"lab {self.name}: could not remove {', '.join(leftovers)}")
        with contextlib.suppress(FileNotFoundError):
            (REGISTRY / f"{self.name}.json").unlink()
        # the last lab went: the machine's neighbour-table limits as they were
        last = not _registry_entries()
        if last and net.restore_neighbour_table(REGISTRY / NEIGH_SAVED) is not None:
            removed.append("neighbour table limits raised for the labs")
        removed += remove_user(self.store)
        self.state["phase"] = "down"
        for h in self.hosts:
            h.pids, h.starts = {}, {}
        self.state["faults"] = []
        if keep_dir:
            if self.dir.is_dir():
                with self.store.dirlock():
                    self.store.save()
        else:
            self.store.remove_files()
        return removed
