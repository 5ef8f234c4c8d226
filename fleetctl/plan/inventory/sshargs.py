"""The OpenSSH arguments an Ansible inventory gives a host (``ansible_ssh_common_args`` and
``ansible_ssh_extra_args``), read into what fleetctl's own connections can honour.

Ansible users reach private clusters with ``-o ProxyJump=bastion`` there; fleetctl dials with
paramiko, not the ``ssh`` binary, so it cannot pass arbitrary flags through. Each option is
either mapped (jump host, port, user, key, ssh_config file, known_hosts file), accepted because
fleetctl already behaves that way (batch mode, strict host keys, keys only), or refused with
the option named — never silently dropped. Pure: no I/O.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

# -o options that fleetctl honours by itself already, with the value it needs (None: any
# value). Setting them to something else would be a promise fleetctl does not keep.
_ALREADY = {
    "batchmode": ("yes",),  # fleetctl never prompts
    "stricthostkeychecking": ("yes",),  # host keys are verified; --accept-new is the opt-in
    "identitiesonly": None,  # only the inventory's key (else ssh_config's) is offered
    "pubkeyauthentication": ("yes",),
    "passwordauthentication": ("no",),
    "kbdinteractiveauthentication": ("no",),
    "challengeresponseauthentication": ("no",),
    "gssapiauthentication": ("no",),
    "loglevel": None,  # fleetctl's own messages say what failed
    "serveraliveinterval": None,  # fleetctl's keepalive and heartbeat cover these
    "serveralivecountmax": None,
    "controlmaster": None,  # one connection per node, shared by every phase
    "controlpath": None,
    "controlpersist": None,
    "forwardagent": ("no",),
    "forwardx11": ("no",),
    "requesttty": ("no",),
    "compression": None,  # fleetctl sends little over SSH; rsync compresses itself
    "connecttimeout": None,  # --connect-timeout applies to every node alike
    "globalknownhostsfile": None,
    "hashknownhosts": None,
    "updatehostkeys": ("no",),
    "addkeystoagent": ("no",),
}
# -o options mapped onto a node field.
_MAPPED = {
    "proxyjump": "proxy_jump",
    "port": "port",
    "user": "user",
    "identityfile": "key_file",
    "userknownhostsfile": "known_hosts",
}
# Flags without a value that change nothing fleetctl does.
_HARMLESS_FLAGS = {"-q", "-T", "-n", "-x", "-a"}
# Flags with a value, mapped like their -o spelling.
_FLAGS = {"-J": "proxy_jump", "-p": "port", "-l": "user", "-i": "key_file", "-F": "ssh_config"}


@dataclass(frozen=True)
class SSHArgs:
    """What the inventory's ssh arguments ask of one host's connection (None: not said)."""

    proxy_jump: str | None = None
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    ssh_config: str | None = None
    known_hosts: str | None = None
    accepted: tuple[str, ...] = field(default=())  # options fleetctl already honours


def parse_ssh_args(text: str) -> SSHArgs:
    """Read one ``ansible_ssh_*_args`` value; ValueError (one line, the option named) for an
    option fleetctl cannot honour. The first value of an option wins, as in OpenSSH."""
    try:
        words = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"cannot be split into arguments: {e}") from e
    got: dict[str, str] = {}
    accepted: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w in _HARMLESS_FLAGS:
            i += 1
            continue
        flag, value = (w[:2], w[2:]) if w[:2] in (*_FLAGS, "-o") else (w, "")
        if flag not in _FLAGS and flag != "-o":
            raise ValueError(f"ssh option {w!r} is not supported by fleetctl")
        if not value:
            if i + 1 >= len(words):
                raise ValueError(f"ssh option {w!r} needs a value")
            value = words[i + 1]
            i += 1
        i += 1
        if flag != "-o":
            got.setdefault(_FLAGS[flag], value)
            continue
        name, sep, arg = value.partition("=")
        if not sep:  # "-o Name value" is OpenSSH syntax too
            name, _, arg = value.partition(" ")
        key, arg = name.strip().lower(), arg.strip()
        if not arg:
            raise ValueError(f"ssh option -o {value!r} has no value")
        if key in _MAPPED:
            if key == "proxyjump" and arg.lower() == "none":
                continue
            got.setdefault(_MAPPED[key], arg)
        elif key in _ALREADY:
            allowed = _ALREADY[key]
            if allowed is not None and arg.lower() not in allowed:
                hint = (
                    " (fleetctl verifies host keys; --accept-new adds unknown ones)"
                    if key == "stricthostkeychecking"
                    else ""
                )
                raise ValueError(f"ssh option -o {name}={arg} is not supported by fleetctl{hint}")
            accepted.append(name)
        elif key == "proxycommand":
            raise ValueError(
                f"ssh option -o {name} is not supported by fleetctl; use ProxyJump "
                "(or a ProxyCommand in an ssh_config file fleetctl reads: fleetctl_ssh_config)"
            )
        else:
            raise ValueError(f"ssh option -o {name} is not supported by fleetctl")
    port = None
    if "port" in got:
        if not got["port"].isdigit() or not 1 <= int(got["port"]) <= 65535:
            raise ValueError(f"ssh port {got['port']!r} is not a port number 1-65535")
        port = int(got["port"])
    jump = got.get("proxy_jump")
    if jump is not None and (not jump.strip() or any(c.isspace() for c in jump.strip())):
        raise ValueError(f"ProxyJump {jump!r} is not [user@]host[:port][,…]")
    return SSHArgs(
        proxy_jump=jump,
        port=port,
        user=got.get("user"),
        key_file=got.get("key_file"),
        ssh_config=got.get("ssh_config"),
        known_hosts=got.get("known_hosts"),
        accepted=tuple(accepted),
    )


def merge(first: SSHArgs, then: SSHArgs) -> SSHArgs:
    """``first``'s values win (common args come before extra args on Ansible's ssh line)."""
    return SSHArgs(
        proxy_jump=first.proxy_jump or then.proxy_jump,
        port=first.port or then.port,
        user=first.user or then.user,
        key_file=first.key_file or then.key_file,
        ssh_config=first.ssh_config or then.ssh_config,
        known_hosts=first.known_hosts or then.known_hosts,
        accepted=first.accepted + then.accepted,
    )
