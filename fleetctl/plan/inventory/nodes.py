"""One host's effective vars -> a validated :class:`~fleetctl.node.Node`, and the check
that no machine is listed twice."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetctl.errors import InventoryError
from fleetctl.node import DEFAULT_PYTHON, DEFAULT_WORKDIR, POSIX_SHELLS, WRAPPED_SHELLS, Node
from fleetctl.plan.inventory.ranges import _parse_address
from fleetctl.plan.inventory.sshargs import SSHArgs, merge, parse_ssh_args
from fleetctl.plan.inventory.vars import _effective_vars
from fleetctl.plan.inventory.yaml_source import _Unsafe, _Vault

if TYPE_CHECKING:
    from fleetctl.plan.inventory.model import _Host, _Model, _Origin

SSH_CONNECTIONS = frozenset({"ssh", "smart", "paramiko", "paramiko_ssh"})
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")  # \Z: "$" lets "A\n" pass


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, _Vault):
        return "<vault>"
    if isinstance(value, str):
        return str(value)  # plain str, not our YAML marker subclasses
    return value


class _Fields:
    """Reads one host's mapped vars, raising errors that name host, field and line."""

    def __init__(self, model: _Model, host: _Host) -> None:
        self.model, self.host = model, host
        self.values, self.origins = _effective_vars(model, host)

    def where(self, key: str | None) -> _Origin:
        """File and line that set ``key`` (else where the host was declared)."""
        path, line = self.origins.get(key, (None, None)) if key else (None, None)
        if path is None or (path == self.model.path and line is None):
            return self.model.path, self.host.line
        return path, line

    def fail(self, key: str | None, message: str) -> InventoryError:
        path, line = self.where(key)
        return InventoryError(
            f"host {self.host.name}: {message}",
            path=path,
            line=line,
            host=self.host.name,
            field=key,
        )

    def get(self, *keys: str) -> tuple[str | None, Any]:
        for k in keys:
            if k in self.values:
                return k, self.values[k]
        return None, None

    def text(self, *keys: str, default: str | None = None, required: bool = False) -> str | None:
        key, value = self.get(*keys)
        if key is None:
            return default
        if isinstance(value, _Vault):
            raise self.fail(key, f"{key} is vault-encrypted; fleetctl cannot decrypt it")
        if value is None or value == "":
            if required:
                raise self.fail(key, f"{key} is empty")
            return default
        if isinstance(value, (bool, float)) or not isinstance(value, (str, int)):
            raise self.fail(key, f"{key} must be a string, got {type(value).__name__} {value!r}")
        bad = _CONTROL.search(str(value))
        if bad:  # a newline in a name or path reaches a shell line or an argv on the node
            raise self.fail(key, f"{key} {value!r} holds a control character ({bad.group()!r})")
        if key.startswith("fleetctl_") and str(value).startswith("-"):
            raise self.fail(key, f"{key} {value!r} starts with '-' (it would read as a flag)")
        if not isinstance(value, _Unsafe) and ("{{" in str(value) or "{%" in str(value)):
            raise self.fail(
                key,
                f"{key}={value!r} is a Jinja template; fleetctl does not "
                "template inventory values, write the value out",
            )
        return str(value)

    def integer(self, key: str, lo: int, hi: int | None, what: str) -> int | None:
        k, value = self.get(key)
        if k is None or value is None:
            return None
        ok = isinstance(value, int) and not isinstance(value, bool)
        if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
            value, ok = int(value), True
        if not ok or value < lo or (hi is not None and value > hi):
            raise self.fail(key, f"{key} must be {what}, got {value!r}")
        return int(value)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _check_plan_vars(f: _Fields) -> None:
    """The host variables read later, at plan and check time, checked here where the
    inventory is read: a bad one is this file's line, not a failure on a node."""
    from fleetctl.plan.userinput import image_problem

    name = f.text("fleetctl_image")
    why = image_problem(name) if name else None
    if why:
        raise f.fail("fleetctl_image", f"fleetctl_image: {why}")
    f.text("fleetctl_image_python")
    key, value = f.get("fleetctl_container_runtime")
    if key is not None and value not in (None, ""):
        from fleetctl.plan.runtimes import ORDER

        if f.text(key) not in ORDER:
            raise f.fail(key, f"{key} {value!r} is not one of {', '.join(ORDER)}")
    key, value = f.get("fleetctl_ports")
    if key is not None and value not in (None, ""):
        ports = value if isinstance(value, list) else [value]
        if not all(
            isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= 65535 for p in ports
        ):
            raise f.fail(key, f"{key} must be a port 1-65535 or a list of them, got {value!r}")


def _build_node(model: _Model, host: _Host) -> Node:
    """Map one host's effective vars to a Node, validating the fields fleetctl uses."""
    name = host.name
    f = _Fields(model, host)
    conn = f.text("ansible_connection", default="ssh") or "ssh"
    local = conn.removeprefix("ansible.builtin.") == "local"
    if not local and conn.removeprefix("ansible.builtin.") not in SSH_CONNECTIONS:
        raise f.fail(
            "ansible_connection", f"ansible_connection {conn!r} is not supported (use ssh or local)"
        )
    addr_key, _ = f.get("ansible_host", "ansible_ssh_host")
    address = f.text("ansible_host", "ansible_ssh_host", default=name, required=True) or name
    if not local and not _is_dialable(address):
        if addr_key:
            msg = f"{addr_key} {address!r} is not a valid host name or IP address"
        else:
            msg = f"no ansible_host, and the name {address!r} is not a valid host name or IP"
        raise f.fail(addr_key, msg)
    port_key = "ansible_port" if "ansible_port" in f.values else "ansible_ssh_port"
    port = f.integer(port_key, 1, 65535, "a port number 1-65535")
    ssh = _ssh_args(f)
    gpus, gpu_ids = _gpus(f)
    _check_plan_vars(f)
    if port is None:
        port = ssh.port
    return Node(
        name=name,
        address=address,
        port=port if port is not None else 22,
        user=f.text("ansible_user", "ansible_ssh_user") or ssh.user,
        key_file=f.text("ansible_ssh_private_key_file", "ansible_private_key_file") or ssh.key_file,
        proxy_jump=ssh.proxy_jump,
        shell_type=_shell_type(f),
        nic=f.text("fleetctl_nic"),
        train_addr=f.text("fleetctl_addr"),
        gpus=gpus,
        gpu_ids=gpu_ids,
        workdir=f.text("fleetctl_workdir", default=DEFAULT_WORKDIR) or DEFAULT_WORKDIR,
        python=f.text("fleetctl_python", default=DEFAULT_PYTHON) or DEFAULT_PYTHON,
        env=_env(f),
        env_archive=f.text("fleetctl_env_archive"),
        known_hosts=f.text("fleetctl_known_hosts") or ssh.known_hosts,
        ssh_config=f.text("fleetctl_ssh_config") or ssh.ssh_config,
        local=local,
        groups=tuple(sorted(g.name for g in model.host_groups(host) if g.name != "all")),
        vars=_plain(f.values),
        source=f"{model.path}:{host.line}" if host.line else model.path,
    )


def _shell_type(f: _Fields) -> str | None:
    """``ansible_shell_type``: None for POSIX login shells, else one fleetctl wraps for."""
    key, value = f.get("ansible_shell_type")
    if key is None or value is None:
        return None
    shell = str(value).strip().lower()
    if shell in POSIX_SHELLS:
        return None
    if shell in WRAPPED_SHELLS:
        return shell
    known = ", ".join(sorted(POSIX_SHELLS | WRAPPED_SHELLS))
    raise f.fail(key, f"ansible_shell_type {value!r} is not supported (nodes run {known})")


_GPU_ID = re.compile(r"(?:[0-9]+|(?:GPU|MIG)-[0-9A-Za-z/-]+)")


def _gpus(f: _Fields) -> tuple[int | None, tuple[str, ...]]:
    """``fleetctl_gpus``: a count (``4``), or the GPUs to use — ``"2,3"``, ``[2, 3]``, UUIDs
    (``GPU-…``, ``MIG-…``) — in CUDA_VISIBLE_DEVICES order."""
    key, value = f.get("fleetctl_gpus")
    if key is None or value is None:
        return None, ()
    if isinstance(value, int) and not isinstance(value, bool):
        return f.integer(key, 0, None, "a count or a list of GPU indices/UUIDs"), ()
    if isinstance(value, str) and "," not in value and value.strip().isdigit():
        return f.integer(key, 0, None, "a count or a list of GPU indices/UUIDs"), ()
    if isinstance(value, str):
        items = [x.strip() for x in value.split(",")]
    elif isinstance(value, (list, tuple)):
        items = [str(x).strip() for x in value]
    else:
        raise f.fail(key, f"fleetctl_gpus must be a count or a list of GPUs, got {value!r}")
    bad = [x for x in items if not _GPU_ID.fullmatch(x)]
    if not items or bad:
        what = f"{bad[0]!r} is not a GPU index or UUID" if bad else "empty"
        raise f.fail(
            key,
            f"fleetctl_gpus must be a count or a list of GPU indices/UUIDs, got {value!r} ({what})",
        )
    if len(set(items)) != len(items):
        raise f.fail(key, f"fleetctl_gpus {value!r} names a GPU twice")
    return len(items), tuple(items)


def _ssh_args(f: _Fields) -> SSHArgs:
    """The host's ``ansible_ssh_common_args`` then ``ansible_ssh_extra_args``, as fleetctl's
    connections can honour them; an option they cannot is an error naming it (file, line)."""
    merged = SSHArgs()
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        text = f.text(key)
        if not text:
            continue
        try:
            merged = merge(merged, parse_ssh_args(text))
        except ValueError as e:
            raise f.fail(key, f"{key}: {e}") from e
    return merged


def _is_dialable(address: str) -> bool:
    parsed = _parse_address(address)
    return parsed is not None and parsed[1] is None and "[" not in address


def _env(f: _Fields) -> dict[str, str]:
    key, value = f.get("fleetctl_env")
    if key is None or value is None:
        return {}
    if not isinstance(value, Mapping):
        raise f.fail(key, f"fleetctl_env must be a mapping of NAME: value, got {value!r}")
    env: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise f.fail(key, f"fleetctl_env: {k!r} is not a valid environment variable name")
        if isinstance(v, _Vault):
            raise f.fail(key, f"fleetctl_env.{k} is vault-encrypted; fleetctl cannot decrypt it")
        if isinstance(v, bool):
            env[k] = "true" if v else "false"
        elif v is None:
            env[k] = ""
        elif isinstance(v, (str, int, float)):
            env[k] = str(v)
        else:
            raise f.fail(key, f"fleetctl_env.{k} must be a scalar, got {type(v).__name__}")
    return env


def _check_duplicates(nodes: tuple[Node, ...], model: _Model) -> None:
    """Two remote hosts dialing the same address:port are one box counted twice."""
    seen: dict[tuple[str, int], Node] = {}
    for node in nodes:
        if node.local:
            continue
        key = (_canonical(node.address), node.port)
        other = seen.get(key)
        if other is not None:
            fields = _Fields(model, model.hosts[node.name])
            raise fields.fail(
                "ansible_host" if "ansible_host" in fields.values else None,
                f"address {node.address} port {node.port} is already host "
                f"{other.name}'s ({other.source}); one machine listed twice?",
            )
        seen[key] = node


def _canonical(address: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return address.lower().rstrip(".")
