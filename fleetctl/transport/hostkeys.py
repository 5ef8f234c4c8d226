"""Host-key trust: only known_hosts decides; unknown or changed keys are refused with the fix.

A paramiko ``SSHClient`` may load other files or carry an ``AutoAddPolicy`` (take any key,
silently): ``strict`` makes known_hosts its only trust source on every hop's client before it
connects. ``--accept-new`` behaves like
OpenSSH's ``StrictHostKeyChecking=accept-new``: records unknown keys, still refuses changed ones.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

from fleetctl.errors import ConnectError, HostKeyError
from fleetctl.transport.filecache import FileCache

if TYPE_CHECKING:
    import paramiko


class AcceptNewPolicy:
    """``--accept-new``: record an unknown key in known_hosts and accept it.

    Duck-types paramiko.MissingHostKeyPolicy (paramiko only calls ``missing_host_key``), so
    importing this module does not import paramiko: ``--help``, ``lab`` and ``--dry-run``
    start faster.
    """

    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(self, client, hostname, key) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def _parse(path: str) -> list[Any]:
    """known_hosts' entries. Raises OSError or paramiko's SSHException."""
    import paramiko

    keys = paramiko.HostKeys()
    keys.load(path)
    return keys._entries


# Every connection used to parse the whole file: N hosts in it cost N × N key parses (64 lab
# hosts: 0.3 s of controller CPU; a fleet's known_hosts of thousands of lines: tens of ms per
# connection). Now once per version of the file.
_KNOWN_HOSTS: FileCache[list[Any]] = FileCache(_parse)


def strict(client: paramiko.SSHClient, known_hosts: str, *, accept_new: bool, label: str) -> None:
    """Make ``known_hosts`` the client's only trust source, with a refusing (or accept-new)
    policy. accept-new records, never replaces."""
    import paramiko

    client._host_keys = paramiko.HostKeys()
    client._system_host_keys = paramiko.HostKeys()
    if os.path.exists(known_hosts):
        try:
            entries = _KNOWN_HOSTS.get(known_hosts)
        except (OSError, paramiko.SSHException) as e:
            raise ConnectError(label, f"cannot read known_hosts {known_hosts}: {e}") from e
        client._host_keys._entries = list(entries)  # its own list: accept-new may add to it
        client._host_keys_filename = known_hosts
    elif accept_new:
        client._host_keys_filename = known_hosts
    if accept_new:
        client.set_missing_host_key_policy(AcceptNewPolicy(known_hosts))
    else:
        client.set_missing_host_key_policy(paramiko.RejectPolicy())


def refused_key_name(e: BaseException) -> str | None:
    """The known_hosts name of the host whose key paramiko refused (a jump host's or ours)."""
    import paramiko

    named = getattr(e, "hostname", None)
    if named is None and isinstance(e, paramiko.SSHException):
        m = re.search(r"Server '(.+)' not found in known_hosts", str(e))
        named = m.group(1) if m else None
    return named


def key_error(
    e: BaseException, label: str, where: str, host: str, port: int, key_name: str, known_hosts: str
) -> HostKeyError | None:
    """A changed or unknown host key as a HostKeyError with the command that fixes it."""
    import paramiko

    if isinstance(e, paramiko.BadHostKeyException):
        return HostKeyError(
            label,
            f"host key for {where} CHANGED (got {e.key.get_name()} "
            f"{e.key.fingerprint}), refusing to connect",
            hint=f"if the host was reinstalled: ssh-keygen -f {known_hosts} -R '{key_name}'",
        )
    if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
        return HostKeyError(
            label,
            f"host key for {where} is unknown (not in {known_hosts}), refusing",
            hint=f"verify it, then: ssh-keyscan -p {port} {host} >> {known_hosts}"
            " (or pass --accept-new)",
        )
    return None
