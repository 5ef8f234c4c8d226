"""The files a lab writes: its SSH key pair, each host's sshd_config, the users'
ssh_config, known_hosts and hosts.yml, and each host's fake GPU files."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.lab import net
from fleetctl.lab.constants import _HERE, MINIMAL_BASHRC, ROOT_BASHRC, SSHD_PATH_ENV, WORKDIR
from fleetctl.lab.health_faults import health_files, write_health_files

if TYPE_CHECKING:
    from fleetctl.lab.hosts import LabHost
    from fleetctl.lab.store import LabStore


class LabFolder:
    """A lab's folder as its users see it, the namespace lab's and the container fleet's
    alike: the inventory, the known_hosts it trusts and the key it logs in with."""

    dir: Path

    @property
    def inventory_path(self) -> Path:
        return self.dir / "hosts.yml"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def key_path(self) -> Path:
        return self.dir / "id_ed25519"


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


def _root_paths_needed(python: str) -> list[str]:
    """What of root's home a login user's hosts must still see: the folder the lab's Python
    (and the base of a virtualenv's) lives in, e.g. ``/root/.pyenv``; the rest is hidden."""
    out = []
    for p in (python, os.path.realpath(python)):
        parts = Path(p).parts
        if len(parts) > 2 and parts[:2] == ("/", "root"):
            keep = str(Path(*parts[:3]))
            if keep not in out:
                out.append(keep)
    cfg = Path(python).parent.parent / "pyvenv.cfg"
    if cfg.is_file():  # a venv's base interpreter (``home = /root/.pyenv/…/bin``)
        for line in cfg.read_text().splitlines():
            key, _, val = line.partition("=")
            if key.strip() == "home":
                out += [x for x in _root_paths_needed(val.strip() + "/python3") if x not in out]
    return out


class LabFiles:
    """The files a lab writes (in DIR and each host's folder): keys, sshd and client configs,
    the inventory, each PID 1's config, the fake nvidia-smi. Its state is the store's."""

    def __init__(self, store: LabStore) -> None:
        self.store = store

    # files -------------------------------------------------------------
    def write_keys_and_configs(self) -> None:
        d = self.store.dir
        priv, pub = _gen_keypair(f"fleetctl-lab-{self.store.name}")
        _write(d / "id_ed25519", priv, 0o600)
        _write(d / "id_ed25519.pub", pub + "\n", 0o644)
        _write(d / "authorized_keys", pub + "\n", 0o600)
        known = []
        etc_hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        etc_hosts += [f"{h.mgmt_addr}\t{h.name}" for h in self.store.hosts]
        for h in self.store.hosts:
            hd = self.store.host_dir(h)
            for sub in ("ssh", "fleetctl", "bin"):
                (hd / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
            (hd / "tmp").mkdir(exist_ok=True)
            os.chmod(hd / "tmp", 0o1777)
            hpriv, hpub = _gen_keypair(f"root@{h.name}")
            _write(hd / "ssh" / "ssh_host_ed25519_key", hpriv, 0o600)
            _write(hd / "ssh" / "ssh_host_ed25519_key.pub", hpub + "\n", 0o644)
            names = ",".join(a for a in (h.name, h.mgmt_addr, h.data_addr) if a)
            known.append(f"{names} {' '.join(hpub.split()[:2])}")
            _write(hd / "ssh" / "sshd_config", self.sshd_config(h), 0o600)
            _write(hd / "hosts", "\n".join(etc_hosts) + "\n", 0o644)
            self.write_gpu_files(h)
            keep_root: list[str] = []
            if self.store.user is None:
                binds = [[str(hd / "fleetctl"), WORKDIR], [str(hd / "hosts"), "/etc/hosts"]]
                if not self.store.state.get("machine_bashrc") and os.path.isfile(ROOT_BASHRC):
                    _write(hd / "bashrc", MINIMAL_BASHRC, 0o644)
                    binds.append([str(hd / "bashrc"), ROOT_BASHRC])
            else:  # a login user: its own home (or the shared one); root's home hidden
                os.chmod(hd, 0o711)
                os.chmod(hd / "bin", 0o755)
                home = self.user_home(h, pub)
                binds = [[str(home), self.store.home], [str(hd / "hosts"), "/etc/hosts"]]
                keep_root = _root_paths_needed(self.store.state["python"])
            binds.append([str(hd / "tmp"), "/tmp"])  # last: it hides /tmp for later binds
            init_cfg = {
                "hostname": h.name,
                "binds": binds,
                "keep_root": keep_root,
                "sshd_argv": [
                    self.store.state["sshd"],
                    "-D",
                    "-e",
                    "-f",
                    str(hd / "ssh" / "sshd_config"),
                ],
                "sshd_env": {"PATH": SSHD_PATH_ENV, "LANG": "C.UTF-8"},
                "sshd_log": str(hd / "sshd.log"),
            }
            _write(hd / "host.json", json.dumps(init_cfg, indent=2) + "\n", 0o600)
        _write(self.store.known_hosts, "\n".join(known) + "\n", 0o644)
        _write(self.store.ssh_config, self.ssh_client_config(), 0o644)
        _write(self.store.inventory_path, self.inventory(), 0o644)

    def user_home(self, h: LabHost, pub: str) -> Path:
        """The login user's home for host ``h`` (one for all hosts with a shared home): the
        lab's key in ``.ssh/authorized_keys`` and a minimal ``.bashrc``, owned by the user."""
        import pwd

        assert self.store.user is not None
        pw = pwd.getpwnam(self.store.user)
        st = self.store
        home = st.dir / "shared-home" if st.state.get("shared_home") else st.host_dir(h) / "home"
        if not (home / ".ssh" / "authorized_keys").exists():
            (home / ".ssh").mkdir(parents=True, exist_ok=True)
            _write(home / ".ssh" / "authorized_keys", pub + "\n", 0o600)
            _write(home / ".bashrc", MINIMAL_BASHRC, 0o644)
            for p in (home, home / ".ssh", home / ".ssh" / "authorized_keys", home / ".bashrc"):
                os.chown(p, pw.pw_uid, pw.pw_gid)
            os.chmod(home, 0o700)
            os.chmod(home / ".ssh", 0o700)
        return home

    def host_path(self, h: LabHost) -> str:
        """This host's bin dir (fake nvidia-smi), the lab's Python, then Debian's root PATH."""
        pybin = os.path.dirname(self.store.state["python"])
        return f"{self.store.host_dir(h) / 'bin'}:{pybin}:{SSHD_PATH_ENV}"

    def sshd_config(self, h: LabHost) -> str:
        st = self.store
        hd = st.host_dir(h)
        listen = [h.mgmt_addr] + ([h.data_addr] if h.data_addr else [])
        lines = [
            f"# fleetctl lab {st.name} host {h.name} (generated; removed by `fleetctl lab down`)",
            *[f"ListenAddress {a}:22" for a in listen],
            f"HostKey {hd / 'ssh' / 'ssh_host_ed25519_key'}",
            f"PidFile {hd / 'sshd.pid'}",
            # sshd reads a user's keys with the user's rights: a login user's are in its home
            "AuthorizedKeysFile "
            + (".ssh/authorized_keys" if st.user else str(st.dir / "authorized_keys")),
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
            f"SetEnv PATH={self.host_path(h)}",
            "Subsystem sftp internal-sftp",
        ]
        return "\n".join(lines) + "\n"

    def ssh_client_config(self) -> str:
        pats = " ".join(
            [h.name for h in self.store.hosts]
            + [h.mgmt_addr for h in self.store.hosts]
            + [h.data_addr for h in self.store.hosts if h.data_addr]
        )
        out = [f"# fleetctl lab {self.store.name}: ssh -F {self.store.ssh_config} node1", ""]
        for h in self.store.hosts:
            out += [f"Host {h.name}", f"  HostName {h.mgmt_addr}", ""]
        out += [
            f"Host {pats}",
            f"  User {self.store.user or 'root'}",
            "  Port 22",
            f"  IdentityFile {self.store.key_path}",
            "  IdentitiesOnly yes",
            f"  UserKnownHostsFile {self.store.known_hosts}",
            "  GlobalKnownHostsFile /dev/null",
            "  StrictHostKeyChecking yes",
            "  BatchMode yes",
            "  ConnectTimeout 5",
            "  ForwardAgent no",
            "  LogLevel ERROR",
            "",
        ]
        return "\n".join(out)

    def inventory(self) -> str:
        import yaml

        st = self.store
        common = (
            f"-F /dev/null -o UserKnownHostsFile={self.store.known_hosts} "
            "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes"
        )
        hosts: dict[str, Any] = {}
        for h in self.store.hosts:
            v: dict[str, Any] = {
                "ansible_host": h.mgmt_addr,
                "ansible_port": 22,
                "ansible_user": self.store.user or "root",
                "ansible_ssh_private_key_file": str(self.store.key_path),
                "ansible_ssh_common_args": common,
                "ansible_python_interpreter": self.store.state["python"],
                "fleetctl_known_hosts": str(self.store.known_hosts),
                "fleetctl_python": self.store.state["python"],
                "fleetctl_nic": h.nic,
            }
            if h.gpus:
                v["fleetctl_gpus"] = h.gpus
                # its fake IB ports (fleetctl.lab.health_faults), read by the health gate
                v["fleetctl_ib_root"] = str(st.host_dir(h) / "sys" / "class" / "infiniband")
            hosts[h.name] = v
        doc = {"all": {"children": {"nodes": {"hosts": hosts}}}}
        head = (
            f"# fleetctl lab {st.name} ({len(st.hosts)} hosts, {st.networks} "
            f"network{'s' if st.networks == 2 else ''}); generated by `fleetctl lab up`\n"
        )
        return head + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)

    def write_gpu_files(self, h: LabHost) -> None:
        bindir = self.store.host_dir(h) / "bin"
        smi = bindir / "nvidia-smi"
        if not h.fake_smi:
            for p in (smi, bindir / "nvidia-smi.json", *health_files(bindir)):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
            return
        src = (_HERE / "fake_nvidia_smi.py").read_text()
        _write(smi, f"#!{self.store.state['python']} -IS\n" + src, 0o755)
        cfg = {"count": h.gpus, "seed": f"{self.store.name}/{h.name}"}
        _write(bindir / "nvidia-smi.json", json.dumps(cfg) + "\n", 0o644)
        write_health_files(self.store.host_dir(h), self.store.state["python"])
