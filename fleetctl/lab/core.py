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
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab import net, procs

DEFAULT_PARENT = Path("/var/tmp/fleetctl-lab")
REGISTRY = Path("/run/fleetctl-lab")
WORKDIR = "/root/.fleetctl"  # root's default fleetctl workdir, made private per host
SSHD_PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_BASHRC = "/root/.bashrc"
#: Hosts get this instead of the machine's ~/.bashrc (bash sources it for every SSH command;
#: a `pyenv init`/`conda init` there costs ~0.5 s per command). PATH comes from sshd's SetEnv.
MINIMAL_BASHRC = (
    "# fleetctl lab host: minimal ~/.bashrc (the machine's own is hidden on lab hosts so SSH\n"
    "# commands stay fast; `fleetctl lab up --machine-bashrc` keeps it).\n"
)
MAX_HOSTS = 200
READY_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
LINK_TIMEOUT = 10.0  # cut/heal: how long the kernel may take to apply a carrier change
SSH_PORT = 22
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
STATE_VERSION = 1
_HERE = Path(__file__).resolve().parent


def _real_python() -> str:
    """The interpreter itself, not a pyenv shim (shims cost ~100 ms and may pick another)."""
    return os.path.realpath(sys.executable)


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


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    """Atomic write: readers (another `fleetctl lab` process) never see half a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _gen_keypair(comment: str) -> tuple[str, str]:
    """An ed25519 key pair in OpenSSH format (private, public line)."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ImportError:  # pragma: no cover - cryptography ships with paramiko
        return _gen_keypair_ssh_keygen(comment)
    key = Ed25519PrivateKey.generate()
    priv = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    pub = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return priv, f"{pub} {comment}"


def _gen_keypair_ssh_keygen(comment: str) -> tuple[str, str]:  # pragma: no cover
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "k"
        net.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(p)])
        return p.read_text(), p.with_suffix(".pub").read_text().strip()


def _registry_entries() -> list[dict[str, Any]]:
    out = []
    if not REGISTRY.is_dir():
        return out
    for p in sorted(REGISTRY.glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def _entry_live(entry: dict[str, Any]) -> bool:
    """A registry entry counts while its creator runs or any of its namespaces/links exist."""
    if procs.same_process(entry.get("creator_pid"), entry.get("creator_start")):
        return True
    name = entry.get("name", "")
    if net.link_exists(f"{name}-m"):
        return True
    try:
        return any(n.startswith(f"{name}-") for n in os.listdir("/run/netns"))
    except OSError:
        return False


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
    """A running (or half-built, or torn-down) lab, backed by ``DIR/lab.json``."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state
        self.dir = Path(state["dir"])
        self.name: str = state["name"]
        self.hosts: list[LabHost] = [LabHost(**h) for h in state["hosts"]]
        self._popens: dict[str, subprocess.Popen[bytes]] = {}
        self._lock_depth = 0
        self._rlock = threading.RLock()

    @contextlib.contextmanager
    def _dirlock(self) -> Iterator[None]:
        """Inter-process lock on DIR/.lock, re-entrant per thread (flock alone is not)."""
        with self._rlock:
            if self._lock_depth:
                self._lock_depth += 1
                try:
                    yield
                finally:
                    self._lock_depth -= 1
                return
            with _locked(self.dir / ".lock"):
                self._lock_depth = 1
                try:
                    yield
                finally:
                    self._lock_depth = 0

    # ------------------------------------------------------------------ paths
    @property
    def inventory_path(self) -> Path:
        return self.dir / "hosts.yml"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def key_path(self) -> Path:
        return self.dir / "id_ed25519"

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
    def faults(self) -> list[dict[str, Any]]:
        return list(self.state.get("faults", []))

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

    def __repr__(self) -> str:
        return f"Lab({self.name!r}, dir={str(self.dir)!r}, hosts={len(self.hosts)})"

    # ------------------------------------------------------------------ state
    def _save(self) -> None:
        self.state["hosts"] = [asdict(h) for h in self.hosts]
        _write(self.dir / "lab.json", json.dumps(self.state, indent=2) + "\n", 0o600)

    @contextlib.contextmanager
    def _mutate(self) -> Iterator[None]:
        """Serialize changes with other processes (CLI faults) and persist them."""
        with self._dirlock():
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
            self._save()

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
    ) -> Lab:
        """Create ``n`` hosts and wait until every sshd answers. Cleans up fully on any failure."""
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
        want = net.parse_subnet(subnet) if subnet else None
        if want is not None:
            try:
                net.host_addr(want, n, n)
            except LabError as e:
                raise LabInputError(f"--subnet {want}: too small for {n} hosts") from e
        require_root()
        sshd = _sshd_binary()
        python = _real_python()

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
            os.chmod(d, 0o700)
            if d.parent == DEFAULT_PARENT:
                os.chmod(DEFAULT_PARENT, 0o700)
            state = cls._plan(name, d, n, networks, gpus, mgmt_net, data_net, python, sshd)
            state["created_dir"] = created_dir
            state["machine_bashrc"] = bool(machine_bashrc)
            lab = cls(state)
            lab._save()
            entry = {
                "name": name,
                "dir": str(d),
                "subnets": [str(mgmt_net), str(data_net)],
                "creator_pid": os.getpid(),
                "creator_start": procs.start_time(os.getpid()),
                "owner": owner,
            }
            REGISTRY.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write(REGISTRY / f"{name}.json", json.dumps(entry) + "\n", 0o600)
        try:
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

    @staticmethod
    def _plan(
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
        """Every name and address the lab will create, decided before creating anything."""
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

    def _build(self, ready_timeout: float) -> None:
        t0 = time.monotonic()
        os.makedirs(WORKDIR, exist_ok=True)  # the mountpoint must exist in the real tree
        self._write_keys_and_configs()
        self._create_network()
        for h in self.hosts:
            self._spawn(h)
        self._record_pids()
        deadline = time.monotonic() + ready_timeout
        for h in self.hosts:
            net.wait_banner(h.mgmt_addr, 22, deadline, alive=lambda h=h: self._why_dead(h))
        self.state["phase"] = "up"
        self.state["up_seconds"] = round(time.monotonic() - t0, 3)
        with self._dirlock():
            self._save()

    # files -------------------------------------------------------------
    def _write_keys_and_configs(self) -> None:
        d = self.dir
        priv, pub = _gen_keypair(f"fleetctl-lab-{self.name}")
        _write(d / "id_ed25519", priv, 0o600)
        _write(d / "id_ed25519.pub", pub + "\n", 0o644)
        _write(d / "authorized_keys", pub + "\n", 0o600)
        known = []
        etc_hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        etc_hosts += [f"{h.mgmt_addr}\t{h.name}" for h in self.hosts]
        for h in self.hosts:
            hd = self.host_dir(h)
            for sub in ("ssh", "fleetctl", "bin"):
                (hd / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
            (hd / "tmp").mkdir(exist_ok=True)
            os.chmod(hd / "tmp", 0o1777)
            hpriv, hpub = _gen_keypair(f"root@{h.name}")
            _write(hd / "ssh" / "ssh_host_ed25519_key", hpriv, 0o600)
            _write(hd / "ssh" / "ssh_host_ed25519_key.pub", hpub + "\n", 0o644)
            names = ",".join(a for a in (h.name, h.mgmt_addr, h.data_addr) if a)
            known.append(f"{names} {' '.join(hpub.split()[:2])}")
            _write(hd / "ssh" / "sshd_config", self._sshd_config(h), 0o600)
            _write(hd / "hosts", "\n".join(etc_hosts) + "\n", 0o644)
            self._write_gpu_files(h)
            binds = [[str(hd / "fleetctl"), WORKDIR], [str(hd / "hosts"), "/etc/hosts"]]
            if not self.state.get("machine_bashrc") and os.path.isfile(ROOT_BASHRC):
                _write(hd / "bashrc", MINIMAL_BASHRC, 0o644)
                binds.append([str(hd / "bashrc"), ROOT_BASHRC])
            binds.append([str(hd / "tmp"), "/tmp"])  # last: it hides /tmp for later binds
            init_cfg = {
                "hostname": h.name,
                "binds": binds,
                "sshd_argv": [
                    self.state["sshd"],
                    "-D",
                    "-e",
                    "-f",
                    str(hd / "ssh" / "sshd_config"),
                ],
                "sshd_env": {"PATH": SSHD_PATH_ENV, "LANG": "C.UTF-8"},
                "sshd_log": str(hd / "sshd.log"),
            }
            _write(hd / "host.json", json.dumps(init_cfg, indent=2) + "\n", 0o600)
        _write(self.known_hosts, "\n".join(known) + "\n", 0o644)
        _write(self.ssh_config, self._ssh_client_config(), 0o644)
        _write(self.inventory_path, self._inventory(), 0o644)

    def _host_path(self, h: LabHost) -> str:
        """This host's bin dir (fake nvidia-smi), the lab's Python, then Debian's root PATH."""
        pybin = os.path.dirname(self.state["python"])
        return f"{self.host_dir(h) / 'bin'}:{pybin}:{SSHD_PATH_ENV}"

    def _sshd_config(self, h: LabHost) -> str:
        hd = self.host_dir(h)
        listen = [h.mgmt_addr] + ([h.data_addr] if h.data_addr else [])
        lines = [
            f"# fleetctl lab {self.name} host {h.name} (generated; removed by `fleetctl lab down`)",
            *[f"ListenAddress {a}:22" for a in listen],
            f"HostKey {hd / 'ssh' / 'ssh_host_ed25519_key'}",
            f"PidFile {hd / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.dir / 'authorized_keys'}",
            # StrictModes would reject DIR under world-writable /var/tmp; the lab owns DIR (0700).
            "StrictModes no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "GSSAPIAuthentication no",
            "PermitRootLogin prohibit-password",
            "PermitEmptyPasswords no",
            "PermitUserEnvironment no",
            "UsePAM no",
            "UseDNS no",
            "MaxSessions 256",
            "MaxStartups 256:30:512",
            "MaxAuthTries 6",
            "LoginGraceTime 30",
            "X11Forwarding no",
            "AllowAgentForwarding no",
            "PrintMotd no",
            "PrintLastLog no",
            "LogLevel INFO",
            # First on PATH: this host's bin dir (fake nvidia-smi), the lab's Python, then
            # Debian's root PATH. SetEnv overrides sshd's default PATH (sshd_config(5)).
            f"SetEnv PATH={self._host_path(h)}",
            "Subsystem sftp internal-sftp",
        ]
        return "\n".join(lines) + "\n"

    def _ssh_client_config(self) -> str:
        pats = " ".join(
            [h.name for h in self.hosts]
            + [h.mgmt_addr for h in self.hosts]
            + [h.data_addr for h in self.hosts if h.data_addr]
        )
        out = [f"# fleetctl lab {self.name}: ssh -F {self.ssh_config} node1", ""]
        for h in self.hosts:
            out += [f"Host {h.name}", f"  HostName {h.mgmt_addr}", ""]
        out += [
            f"Host {pats}",
            "  User root",
            "  Port 22",
            f"  IdentityFile {self.key_path}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.known_hosts}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "  ConnectTimeout 5",
            "  ForwardAgent no",
            "  LogLevel ERROR",
            "",
        ]
        return "\n".join(out)

    def _inventory(self) -> str:
        import yaml

        common = (
            f"-F /dev/null -o UserKnownHostsFile={self.known_hosts} "
            "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
        )
        hosts: dict[str, Any] = {}
        for h in self.hosts:
            v: dict[str, Any] = {
                "ansible_host": h.mgmt_addr,
                "ansible_port": 22,
                "ansible_user": "root",
                "ansible_ssh_private_key_file": str(self.key_path),
                "ansible_ssh_common_args": common,
                "ansible_python_interpreter": self.state["python"],
                "fleetctl_known_hosts": str(self.known_hosts),
                "fleetctl_python": self.state["python"],
                "fleetctl_nic": h.nic,
            }
            if h.gpus:
                v["fleetctl_gpus"] = h.gpus
            hosts[h.name] = v
        doc = {"all": {"children": {"nodes": {"hosts": hosts}}}}
        head = (
            f"# fleetctl lab {self.name} ({len(self.hosts)} hosts, {self.networks} "
            f"network{'s' if self.networks == 2 else ''}); generated by `fleetctl lab up`\n"
        )
        return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)

    def _write_gpu_files(self, h: LabHost) -> None:
        bindir = self.host_dir(h) / "bin"
        smi = bindir / "nvidia-smi"
        if not h.fake_smi:
            for p in (smi, bindir / "nvidia-smi.json"):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            return
        src = (_HERE / "fake_nvidia_smi.py").read_text()
        _write(smi, f"#!{self.state['python']} -IS\n" + src, 0o755)
        cfg = {"count": h.gpus, "seed": f"{self.name}/{h.name}"}
        _write(bindir / "nvidia-smi.json", json.dumps(cfg) + "\n", 0o644)

    # network -----------------------------------------------------------
    def _create_network(self) -> None:
        mg, dt = self.state["mgmt"], self.state.get("data")
        plen = ipaddress.IPv4Network(mg["subnet"]).prefixlen
        dlen = ipaddress.IPv4Network(dt["subnet"]).prefixlen if dt else 0
        create = [f"link add {mg['bridge']} type bridge"]
        if dt:
            create.append(f"link add {dt['bridge']} type bridge")
        for h in self.hosts:
            create.append(f"netns add {h.ns}")
            create.append(f"link add {h.mgmt_veth} type veth peer name eth0 netns {h.ns}")
            if h.data_veth:
                create.append(
                    f"link add {h.data_veth} type veth peer name {h.data_nic} netns {h.ns}"
                )
        net.ip_batch(create)
        roots = [mg["bridge"]] + ([dt["bridge"]] if dt else [])
        roots += [x for h in self.hosts for x in (h.mgmt_veth, h.data_veth) if x]
        for ifname in roots:  # no IPv6 chatter (RS/MLD) from the lab's root-side links
            with contextlib.suppress(OSError):
                Path(f"/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6").write_text("1")
        up = [f"addr add {mg['gateway']}/{plen} dev {mg['bridge']}", f"link set {mg['bridge']} up"]
        if dt:
            up.append(f"link set {dt['bridge']} up")
        for h in self.hosts:
            up.append(f"link set {h.mgmt_veth} master {mg['bridge']} up")
            if h.data_veth:
                up.append(f"link set {h.data_veth} master {dt['bridge']} up")
        net.ip_batch(up)
        procs_: list[subprocess.Popen[str]] = []
        for h in self.hosts:  # inside each namespace, in parallel
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
            batch = self.host_dir(h) / "net.batch"
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
        for h, p in zip(self.hosts, procs_, strict=True):
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
    def _spawn(self, h: LabHost) -> None:
        """Start the host's PID 1 in its netns + fresh mount/UTS/PID namespaces."""
        hd = self.host_dir(h)
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
                    self.state["python"],
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
        self._popens[h.name] = p
        h.pids = {"unshare": p.pid}
        h.starts = {}
        st = procs.start_time(p.pid)
        if st is not None:
            h.starts["unshare"] = st

    def _record_pids(self, hosts: Sequence[LabHost] | None = None) -> None:
        """Find each host's PID 1 (the child unshare forks) and persist all PIDs."""
        deadline = time.monotonic() + 5.0
        for h in hosts or self.hosts:
            upid = h.pids["unshare"]
            while True:
                kids = procs.children(upid)
                if kids:
                    st = procs.start_time(kids[0])
                    if st is not None:
                        h.pids["init"], h.starts["init"] = kids[0], st
                        break
                why = self._why_dead(h)
                if why:
                    raise LabError(f"{h.name}: host did not start: {why}")
                if time.monotonic() > deadline:
                    raise LabError(f"{h.name}: host PID 1 did not appear within 5 s")
                time.sleep(0.002)
        with self._dirlock():
            self._save()

    def _why_dead(self, h: LabHost) -> str | None:
        p = self._popens.get(h.name)
        if p is not None and p.poll() is not None:
            return f"exited with {p.returncode}; {self._log_tail(h)}"
        if p is None and "init" in h.pids and h.init_pid is None:
            return f"PID 1 is gone; {self._log_tail(h)}"
        return None

    def _log_tail(self, h: LabHost) -> str:
        tails = []
        for f in ("init.log", "sshd.log"):
            with contextlib.suppress(OSError):
                lines = (self.host_dir(h) / f).read_text(errors="replace").strip().splitlines()
                if lines:
                    tails.append(f"{f}: {lines[-1]}")
        return " | ".join(tails) or "no log output"

    # ------------------------------------------------------------------ exec
    def host_env(self, h: LabHost | str) -> dict[str, str]:
        """The environment ``exec`` gives commands: like an SSH session on that host."""
        host = self.host(h) if isinstance(h, str) else h
        return {
            "PATH": self._host_path(host),
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "LANG": "C.UTF-8",
            "SHELL": "/bin/bash",
        }

    def nsenter_argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``nsenter`` into every namespace of ``host`` (net, mount, UTS, PID) running argv."""
        h = self.host(host)
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
        h = self.host(host)
        init = h.init_pid
        if init is None:
            return None
        listening = net.listen_inodes(init, SSH_PORT)
        if not listening:
            return None
        sshd = os.path.realpath(self.state["sshd"])
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
        for h in self.hosts:
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
            "name": self.name,
            "dir": str(self.dir),
            "phase": self.state.get("phase"),
            "mgmt": self.state["mgmt"],
            "data": self.state.get("data"),
            "inventory": str(self.inventory_path),
            "ssh_config": str(self.ssh_config),
            "hosts": hosts,
            "faults": self.faults,
        }

    # ------------------------------------------------------------------ faults
    def _record(self, fault: dict[str, Any], present: bool) -> None:
        faults = [f for f in self.state.get("faults", []) if f != fault]
        if present:
            faults.append(fault)
        self.state["faults"] = faults

    def _veth(self, host: str, network: str) -> tuple[LabHost, str, str]:
        h = self.host(host)
        if network == "mgmt":
            return h, h.mgmt_veth, "eth0"
        if network == "data":
            if not h.data_veth or not h.data_nic:
                raise LabInputError(f"lab {self.name} has no data network (--networks 2)")
            return h, h.data_veth, h.data_nic
        raise LabInputError(f"network must be 'mgmt' or 'data', got {network!r}")

    def cut_link(self, host: str, network: str = "mgmt") -> None:
        """Unplug the host's cable on ``network``; returns once the host's NIC reads as down."""
        h, veth, nic = self._veth(host, network)
        with self._mutate():
            net.run(["ip", "link", "set", veth, "down"])
            self._wait_link(h, veth, nic, up=False)
            self._record({"kind": "link", "host": h.name, "net": network}, True)

    def heal_link(self, host: str, network: str = "mgmt") -> None:
        """Plug the cable back in; returns once the link forwards and nobody's ARP is stale."""
        h, veth, nic = self._veth(host, network)
        with self._mutate():
            net.run(["ip", "link", "set", veth, "up"])
            self._wait_link(h, veth, nic, up=True)
            self._flush_neighbours(h, network, nic)
            self._record({"kind": "link", "host": h.name, "net": network}, False)

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
        for o in self.hosts:
            dev = "eth0" if network == "mgmt" else o.data_nic
            if o is not h and dev and net.netns_exists(o.ns):
                cmds.append(["ip", "-n", o.ns, "neigh", "flush", "to", str(addr), "dev", dev])
        if network == "mgmt":  # this machine reaches the hosts through the management bridge
            cmds.append(["ip", "neigh", "flush", "to", str(addr), "dev", self.mgmt_bridge])
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
        with self._mutate():
            net.run(["tc", "qdisc", "replace", "dev", veth, "root", *spec])
            net.run(["tc", "-n", h.ns, "qdisc", "replace", "dev", nic, "root", *spec])
            self.state["faults"] = [
                f
                for f in self.state.get("faults", [])
                if not (f["kind"] == "netem" and f["host"] == h.name and f["net"] == network)
            ]
            self._record(
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
        ns = self.hosts[0].ns
        cp = net.run(
            ["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"],
            check=False,
        )
        if cp.returncode == 0:
            net.run(["tc", "-n", ns, "qdisc", "del", "dev", "lo", "root"], check=False)
        return cp.returncode == 0

    def clear_netem(self, host: str, network: str = "mgmt") -> None:
        h, veth, nic = self._veth(host, network)
        with self._mutate():
            net.run(["tc", "qdisc", "del", "dev", veth, "root"], check=False)
            net.run(["tc", "-n", h.ns, "qdisc", "del", "dev", nic, "root"], check=False)
            self.state["faults"] = [
                f
                for f in self.state.get("faults", [])
                if not (f["kind"] == "netem" and f["host"] == h.name and f["net"] == network)
            ]

    def kill_sshd(self, host: str, sig: int = signal.SIGKILL) -> int:
        """Kill only the host's sshd listener (open sessions live on, like a real crash).

        Returns once the listening socket is closed, so a connection attempt is refused.
        """
        h = self.host(host)
        with self._mutate():
            init = h.init_pid
            pid = self.sshd_pid(h.name)
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
            self._record({"kind": "sshd", "host": h.name}, True)
        return pid

    def start_sshd(self, host: str, timeout: float = READY_TIMEOUT) -> None:
        """(Re)start the host's sshd in its namespaces (PID 1 does it) and wait for the banner."""
        h = self.host(host)
        with self._mutate():
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
            self._record({"kind": "sshd", "host": h.name}, False)

    def crash_host(self, host: str) -> None:
        """Kill the host's PID 1: the kernel kills every process on the host at once."""
        h = self.host(host)
        with self._mutate():
            init = h.init_pid
            if init is not None:
                procs.kill(init)
                self._reap_popen(h)
                if procs.wait_gone([(init, h.starts.get("init"))], STOP_TIMEOUT):
                    raise LabError(f"{h.name}: PID 1 ({init}) did not exit")
            self._record({"kind": "crash", "host": h.name}, True)

    def boot_host(self, host: str, timeout: float = READY_TIMEOUT) -> None:
        """Start a crashed host again (same disk area, network and keys) and wait for sshd."""
        h = self.host(host)
        with self._mutate():
            if h.init_pid is not None:
                raise LabError(f"{h.name}: host is already running")
            self._spawn(h)
            self._record_pids([h])
            net.wait_banner(
                h.mgmt_addr, 22, time.monotonic() + timeout, alive=lambda: self._why_dead(h)
            )
            self.state["faults"] = [
                f
                for f in self.state.get("faults", [])
                if f["host"] != h.name or f["kind"] not in ("crash", "sshd", "disk")
            ]

    def disk_full(self, host: str, path: str = WORKDIR, size: str = "1m") -> None:
        """Cover ``path`` on the host with a tiny tmpfs, so writes there fail with ENOSPC.

        Files under ``path`` are hidden until ``disk_ok``; pick a subdirectory (e.g.
        ``/root/.fleetctl/runs``) to keep the rest of the workdir visible.
        """
        h = self.host(host)
        if not path.startswith("/") or not re.match(r"^[0-9]+[kmg]?$", size):
            raise LabInputError("disk_full: path must be absolute and size like 1m/512k")
        with self._mutate():
            self.exec(h.name, ["mkdir", "-p", path], check=True)
            self.exec(
                h.name,
                ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "fleetctl-lab-full", path],
                check=True,
            )
            self._record({"kind": "disk", "host": h.name, "path": path}, True)

    def disk_ok(self, host: str, path: str = WORKDIR) -> None:
        h = self.host(host)
        with self._mutate():
            mounts = self.exec(h.name, ["cat", "/proc/self/mounts"], check=True).stdout
            ours = [
                ln for ln in mounts.splitlines() if ln.split()[:2] == ["fleetctl-lab-full", path]
            ]
            for _ in ours:
                self.exec(h.name, ["umount", path], check=True)
            self._record({"kind": "disk", "host": h.name, "path": path}, False)

    def set_gpus(self, host: str, count: int | None) -> None:
        """Change what one host's fake nvidia-smi reports (declared ≠ real GPU tests).

        ``0`` keeps the tool but it finds no devices (exit 6, like a broken driver); ``None``
        removes it from the host (``nvidia-smi: command not found``).
        """
        h = self.host(host)
        if count is not None and not 0 <= int(count) <= 64:
            raise LabInputError(f"gpus must be 0..64 or None, got {count!r}")
        with self._mutate():
            h.fake_smi = count is not None
            h.gpus = int(count or 0)
            self._write_gpu_files(h)

    def reset_faults(self) -> None:
        """Undo every recorded fault (newest first): the fixture's way back to a clean lab."""
        for f in reversed(self.faults):
            kind, host = f["kind"], f["host"]
            if kind == "link":
                self.heal_link(host, f["net"])
            elif kind == "netem":
                self.clear_netem(host, f["net"])
            elif kind == "disk":
                if self.host(host).init_pid is not None:
                    self.disk_ok(host, f["path"])
                else:
                    with self._mutate():
                        self._record(f, False)
            elif kind == "crash":
                self.boot_host(host)
            elif kind == "sshd" and self.host(host).init_pid is not None:
                self.start_sshd(host)

    # ------------------------------------------------------------------ down
    def _reap_popen(self, h: LabHost) -> None:
        p = self._popens.pop(h.name, None)
        if p is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=STOP_TIMEOUT)

    def down(self, keep_dir: bool = False) -> list[str]:
        """Remove everything the lab made; idempotent; works from lab.json after a crashed up.

        Returns what had to be removed (empty when already down). Raises LabError naming any
        leftover it could not remove.
        """
        require_root()
        if (self.dir / "lab.json").exists():  # PIDs may have changed in another process
            with contextlib.suppress(OSError, ValueError), self._mutate():
                pass
        removed: list[str] = []
        # 1. Processes: PID 1 of each host (verified by start time) takes its whole PID
        #    namespace with it; then anything else still inside a lab network namespace.
        pending: list[tuple[int, int | None]] = []
        for h in self.hosts:
            for key in ("init", "unshare"):
                pid, st = h.pids.get(key), h.starts.get(key)
                if pid and procs.same_process(pid, st):
                    procs.kill(pid)
                    pending.append((pid, st))
                    removed.append(f"{h.name} {key} pid {pid}")
        for h in self.hosts:
            self._reap_popen(h)
        stuck = procs.wait_gone(pending, STOP_TIMEOUT)
        deadline = time.monotonic() + STOP_TIMEOUT
        for h in self.hosts:
            while True:
                left = procs.pids_in_netns(f"/run/netns/{h.ns}")
                if not left or time.monotonic() > deadline:
                    stuck += left
                    break
                for pid in left:
                    procs.kill(pid)
                    removed.append(f"{h.name} stray pid {pid}")
                procs.wait_gone([(p, None) for p in left], 1.0)
        # 2. Links (root-side veth ends take their peers along), bridges, namespaces.
        links = [x for h in self.hosts for x in (h.mgmt_veth, h.data_veth) if x]
        links += [b for b in (self.mgmt_bridge, self.data_bridge) if b]
        cmds = [f"link del {x}" for x in links if net.link_exists(x)]
        cmds += [f"netns del {h.ns}" for h in self.hosts if net.netns_exists(h.ns)]
        removed += [c.split(" ", 2)[2] for c in cmds]
        net.ip_batch(cmds, force=True)
        leftovers = [x for x in links if net.link_exists(x)]
        leftovers += [h.ns for h in self.hosts if net.netns_exists(h.ns)]
        leftovers += [f"pid {p}" for p in stuck]
        if leftovers:  # keep the registry entry: `fleetctl lab down` must still find the lab
            raise LabError(f"lab {self.name}: could not remove {', '.join(leftovers)}")
        with contextlib.suppress(FileNotFoundError):
            (REGISTRY / f"{self.name}.json").unlink()
        self.state["phase"] = "down"
        for h in self.hosts:
            h.pids, h.starts = {}, {}
        self.state["faults"] = []
        if keep_dir:
            if self.dir.is_dir():
                with self._dirlock():
                    self._save()
        else:
            self._remove_dir()
        return removed

    def _remove_dir(self) -> None:
        """Delete what the lab wrote in DIR (and DIR itself if the lab created it)."""
        d = self.dir
        if not (d / "lab.json").exists():
            return
        for sub in ("hosts",):
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


def _name_in_use(name: str) -> bool:
    """Any interface or namespace already carrying this lab-name prefix?"""
    prefix = f"{name}-"
    try:
        if any(x.startswith(prefix) for x in os.listdir("/sys/class/net")):
            return True
        return any(x.startswith(prefix) for x in os.listdir("/run/netns"))
    except FileNotFoundError:
        return False
