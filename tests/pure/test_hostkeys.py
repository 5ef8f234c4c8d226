"""known_hosts: parsed once per version of the file, shared by every connection."""

from __future__ import annotations

import os
from pathlib import Path

import paramiko
import pytest

from fleetctl.errors import ConnectError
from fleetctl.transport import hostkeys


@pytest.fixture
def keys(tmp_path: Path) -> list[str]:
    """Three real ed25519 public keys, as known_hosts lines' key parts."""
    import subprocess

    out = []
    for i in range(3):
        f = tmp_path / f"k{i}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(f)], check=True)
        out.append(" ".join((f.with_suffix(".pub").read_text().split())[:2]))
    return out


def test_known_hosts_is_parsed_once_per_version_for_all_connections(
    tmp_path: Path, keys: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    kh = tmp_path / "known_hosts"
    kh.write_text(f"10.0.0.1 {keys[0]}\n10.0.0.2 {keys[1]}\n")
    loads = []
    real = paramiko.HostKeys.load
    monkeypatch.setattr(
        paramiko.HostKeys, "load", lambda self, p: (loads.append(p), real(self, p))[1]
    )
    clients = [paramiko.SSHClient() for _ in range(5)]
    for c in clients:
        hostkeys.strict(c, str(kh), accept_new=False, label="n")
    assert loads == [str(kh)]  # one parse for five connections
    for c in clients:
        assert (
            c.get_host_keys().lookup("10.0.0.2")["ssh-ed25519"].get_base64() == keys[1].split()[1]
        )
        assert c.get_host_keys().lookup("10.0.0.3") is None
    # a connection's accept-new addition stays its own until the file says so
    clients[0].get_host_keys().add(
        "10.0.0.3", "ssh-ed25519", paramiko.PKey.from_type_string(*_split(keys[2]))
    )
    assert clients[1].get_host_keys().lookup("10.0.0.3") is None
    with kh.open("a") as f:  # what AcceptNewPolicy writes: the next connection reads it
        f.write(f"10.0.0.3 {keys[2]}\n")
    os.utime(kh, ns=(1, 1))
    late = paramiko.SSHClient()
    hostkeys.strict(late, str(kh), accept_new=False, label="n")
    assert len(loads) == 2 and late.get_host_keys().lookup("10.0.0.3") is not None


def test_a_known_hosts_that_cannot_be_read_fails_every_connection(tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    kh.mkdir()  # a folder where the file should be
    for _ in range(2):
        with pytest.raises(ConnectError, match="cannot read known_hosts"):
            hostkeys.strict(paramiko.SSHClient(), str(kh), accept_new=False, label="n")


def _split(line: str) -> tuple[str, bytes]:
    import base64

    kind, data = line.split()
    return kind, base64.b64decode(data)
