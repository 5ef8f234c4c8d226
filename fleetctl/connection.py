"""One node: run commands, stream a long-running command, copy files. SSH or local.

An ``SSHConnection`` holds one authenticated paramiko transport per node for the whole
``fleetctl`` invocation; every phase opens cheap channels on it instead of new handshakes.
Host keys are verified against known_hosts; unknown or changed keys are refused with the exact
command that fixes it. ``LocalConnection`` runs the same commands on this machine without SSH
(the embedded default fleet).
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import ConnectError, HostKeyError, RemoteCommandError
from fleetctl.results import CommandResult

if TYPE_CHECKING:
    import paramiko

    from fleetctl.node import Node

Command = str | Sequence[str]


def to_shell(command: Command) -> str:
    """A command line for the remote shell. Sequences are quoted argument by argument."""
    return command if isinstance(command, str) else shlex.join(command)


def expand_home(path: str, home: str) -> str:
    """Resolve a leading ``~`` against the node's home, since quoted ``~`` never expands."""
    if path == "~":
        return home
    if path.startswith("~/"):
        return home.rstrip("/") + path[1:]
    return path


@dataclass(frozen=True)
class SSHSettings:
    """How to reach nodes; shared by every phase and by rsync/ansible so they verify keys alike.

    ``known_hosts`` overrides the node's ``fleetctl_known_hosts`` and ``~/.ssh/known_hosts``.
    ``ssh_config`` None means ``~/.ssh/config`` (or ``$FLEETCTL_SSH_CONFIG`` when set; tests set
    it to /dev/null to hide the developer's config).
    """

    known_hosts: str | None = None
    accept_new: bool = False
    connect_timeout: float = 10.0
    ssh_config: str | None = None
    keepalive: float = 2.0
    use_agent: bool = True

    def known_hosts_for(self, node: Node) -> str:
        path = self.known_hosts or node.known_hosts or "~/.ssh/known_hosts"
        return os.path.expanduser(path)

    def ssh_config_for(self, node: Node) -> str | None:
        path = self.ssh_config or node.ssh_config or os.environ.get("FLEETCTL_SSH_CONFIG")
        if path is None:
            default = os.path.expanduser("~/.ssh/config")
            return default if os.path.exists(default) else None
        return None if path == "/dev/null" else os.path.expanduser(path)


class Stream(ABC):
    """A long-running command (the node supervisor): stdout+stderr merged, stdin writable."""

    @abstractmethod
    def recv(self, timeout: float) -> bytes | None:
        """Next chunk of output; ``b""`` at end of output; ``None`` when nothing came in time."""

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write to the command's stdin. Raises OSError when the peer is gone."""

    @abstractmethod
    def close_stdin(self) -> None: ...

    @abstractmethod
    def exit_code(self, timeout: float) -> int | None:
        """The exit status once the command ended, else None after ``timeout``."""

    @abstractmethod
    def close(self) -> None: ...


class Connection(ABC):
    """One node's command and file channel. Thread-safe: phases fan out over it."""

    node: Node

    @abstractmethod
    def run(
        self, command: Command, *, timeout: float, stdin: bytes | None = None, check: bool = False
    ) -> CommandResult:
        """Run a command to completion. ``check`` raises RemoteCommandError on non-zero exit."""

    @abstractmethod
    def start(self, command: Command) -> Stream:
        """Start a command and stream it (stdout and stderr merged)."""

    @abstractmethod
    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None: ...

    @abstractmethod
    def get(self, remote: str, local: str | Path) -> None: ...

    @abstractmethod
    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        """Entries of a remote folder as (name, is_dir, size); symlinks are reported as files."""

    @property
    @abstractmethod
    def home(self) -> str:
        """The node user's home directory (resolves ``~`` in workdirs)."""

    def expand(self, path: str) -> str:
        return expand_home(path, self.home)

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _checked(self, command: Command, result: CommandResult, check: bool) -> CommandResult:
        if check and result.exit_code != 0:
            raise RemoteCommandError(self.node.label, to_shell(command), result)
        return result


# ---------------------------------------------------------------------------------------- local


class _LocalStream(Stream):
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def recv(self, timeout: float) -> bytes | None:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        return os.read(fd, 65536)

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def close_stdin(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def exit_code(self, timeout: float) -> int | None:
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return code if code >= 0 else 128 - code

    def close(self) -> None:
        self.close_stdin()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class LocalConnection(Connection):
    """This machine, without SSH: same commands, run by ``/bin/sh -c``."""

    def __init__(self, node: Node) -> None:
        self.node = node

    def run(
        self, command: Command, *, timeout: float, stdin: bytes | None = None, check: bool = False
    ) -> CommandResult:
        line = to_shell(command)
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", line], input=stdin, capture_output=True, timeout=timeout,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            raise RemoteCommandError(
                self.node.label, line, None, f"{self.node.label}: `{line}` timed out after {timeout:g}s"
            ) from e
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        result = CommandResult(line, code, proc.stdout.decode(errors="replace"),
                               proc.stderr.decode(errors="replace"))
        return self._checked(command, result, check)

    def start(self, command: Command) -> Stream:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", to_shell(command)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        return _LocalStream(proc)

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None:
        import shutil

        dest = Path(self.expand(remote))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        shutil.copyfile(local, tmp)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, dest)

    def get(self, remote: str, local: str | Path) -> None:
        import shutil

        shutil.copyfile(self.expand(remote), local)

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        out = []
        with os.scandir(self.expand(remote)) as it:
            for e in it:
                is_dir = e.is_dir(follow_symlinks=False)
                out.append((e.name, is_dir, 0 if is_dir else e.stat(follow_symlinks=False).st_size))
        return out

    @property
    def home(self) -> str:
        return os.path.expanduser("~")

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------ ssh


class _SSHStream(Stream):
    def __init__(self, channel: paramiko.Channel) -> None:
        self._ch = channel

    def recv(self, timeout: float) -> bytes | None:
        ch = self._ch
        deadline = time.monotonic() + timeout
        while True:
            if ch.recv_ready():
                return ch.recv(65536)
            if ch.eof_received or ch.closed:
                return ch.recv(65536) if ch.recv_ready() else b""
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([ch], [], [], min(left, 0.5))
            if not ready and not ch.get_transport().is_active():  # type: ignore[union-attr]
                return b""

    def send(self, data: bytes) -> None:
        if self._ch.closed or self._ch.get_transport() is None:
            raise OSError("channel closed")
        self._ch.sendall(data)

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._ch.shutdown_write()

    def exit_code(self, timeout: float) -> int | None:
        if self._ch.status_event.wait(timeout):
            return self._ch.recv_exit_status()
        return None

    def close(self) -> None:
        self._ch.close()


class SSHConnection(Connection):
    """One authenticated transport to a node, opened once and reused by every phase."""

    def __init__(self, node: Node, settings: SSHSettings | None = None) -> None:
        self.node = node
        self.settings = settings or SSHSettings()
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.Lock()
        self._home: str | None = None
        self._fabric = self._connect()
        self.client: paramiko.SSHClient = self._fabric.client

    # -- connecting -------------------------------------------------------------------------
    def _connect(self):  # noqa: ANN202 - fabric.Connection
        import paramiko
        from fabric import Config
        from fabric import Connection as FabricConnection

        node, st = self.node, self.settings
        ssh_config = st.ssh_config_for(node)
        config = Config(
            runtime_ssh_path=ssh_config,
            overrides={"load_ssh_configs": ssh_config is not None},
            lazy=ssh_config is None,
        )
        kwargs: dict[str, object] = {
            "allow_agent": st.use_agent and bool(os.environ.get("SSH_AUTH_SOCK")),
            "banner_timeout": st.connect_timeout,
            "auth_timeout": st.connect_timeout,
        }
        if node.key_file:
            kwargs["key_filename"] = [os.path.expanduser(node.key_file)]
            kwargs["look_for_keys"] = False
        conn = FabricConnection(
            host=node.address, user=node.user, port=node.port if node.port != 22 else None,
            config=config, connect_timeout=st.connect_timeout, connect_kwargs=kwargs,
        )
        client = conn.client
        # fabric installs AutoAddPolicy and loads ~/.ssh/known_hosts; we verify strictly.
        client._host_keys = paramiko.HostKeys()  # noqa: SLF001 - drop fabric's implicit file
        client._system_host_keys = paramiko.HostKeys()  # noqa: SLF001
        known_hosts = st.known_hosts_for(node)
        if os.path.exists(known_hosts):
            try:
                client.load_host_keys(known_hosts)
            except (OSError, paramiko.SSHException) as e:
                raise ConnectError(node.label, f"cannot read known_hosts {known_hosts}: {e}") from e
        elif st.accept_new:
            client._host_keys_filename = known_hosts  # noqa: SLF001
        if st.accept_new:
            client.set_missing_host_key_policy(_AcceptNewPolicy(known_hosts))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            conn.open()
        except BaseException as e:
            with contextlib.suppress(Exception):
                conn.close()
            raise self._translate(e, conn, known_hosts) from e
        transport = client.get_transport()
        if transport is not None and st.keepalive:
            transport.set_keepalive(max(1, int(st.keepalive)))
        return conn

    def _translate(self, e: BaseException, conn: object, known_hosts: str) -> BaseException:
        import paramiko

        node = self.node
        host, port = getattr(conn, "host", node.address), getattr(conn, "port", node.port)
        where = f"{host}:{port}"
        key_name = host if port == 22 else f"[{host}]:{port}"
        if isinstance(e, paramiko.BadHostKeyException):
            return HostKeyError(
                node.label, f"host key for {where} CHANGED (got {e.key.get_name()} "
                f"{e.key.fingerprint}), refusing to connect",
                hint=f"if the host was reinstalled: ssh-keygen -f {known_hosts} -R '{key_name}'",
            )
        if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
            return HostKeyError(
                node.label, f"host key for {where} is unknown (not in {known_hosts}), refusing",
                hint=f"verify it, then: ssh-keyscan -p {port} {host} >> {known_hosts}"
                " (or pass --accept-new)",
            )
        if isinstance(e, paramiko.PasswordRequiredException):
            return ConnectError(node.label, f"private key for {where} needs a passphrase; "
                                "load it into ssh-agent (batch mode never prompts)")
        if isinstance(e, paramiko.AuthenticationException):
            return ConnectError(node.label, f"authentication failed for {conn.user}@{where}: {e}")  # type: ignore[attr-defined]
        if isinstance(e, socket.gaierror):
            return ConnectError(node.label, f"cannot resolve host name {host!r}: {e.strerror}")
        if isinstance(e, UnicodeError):  # not a valid DNS name (empty or >63-char label)
            return ConnectError(node.label, f"cannot resolve host name {host!r}: invalid name")
        if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
            return ConnectError(node.label, f"connection refused by {where}")
        if isinstance(e, ConnectionRefusedError):
            return ConnectError(node.label, f"connection refused by {where}")
        if isinstance(e, (socket.timeout, TimeoutError)):
            return ConnectError(
                node.label, f"timed out after {self.settings.connect_timeout:g}s connecting to {where}"
            )
        if isinstance(e, OSError):
            return ConnectError(node.label, f"cannot connect to {where}: {e.strerror or e}")
        if isinstance(e, paramiko.SSHException):
            return ConnectError(node.label, f"SSH error with {where}: {e}")
        return e

    # -- commands ---------------------------------------------------------------------------
    def _channel(self) -> paramiko.Channel:
        transport = self.client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectError(self.node.label, "SSH connection lost")
        try:
            return transport.open_session(timeout=self.settings.connect_timeout)
        except Exception as e:
            raise ConnectError(self.node.label, f"cannot open SSH channel: {e}") from e

    def run(
        self, command: Command, *, timeout: float, stdin: bytes | None = None, check: bool = False
    ) -> CommandResult:
        line = to_shell(command)
        ch = self._channel()
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        try:
            ch.exec_command(line)
            if stdin is not None:
                ch.sendall(stdin)
            ch.shutdown_write()
            while True:
                if ch.recv_ready():
                    out += ch.recv(65536)
                    continue
                if ch.recv_stderr_ready():
                    err += ch.recv_stderr(65536)
                    continue
                if ch.exit_status_ready() and not ch.recv_ready() and not ch.recv_stderr_ready():
                    if ch.eof_received or ch.closed:
                        break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RemoteCommandError(
                        self.node.label, line, None,
                        f"{self.node.label}: `{_short(line)}` timed out after {timeout:g}s",
                    )
                transport = ch.get_transport()
                if transport is None or not transport.is_active():
                    raise ConnectError(self.node.label, "SSH connection lost during a command")
                if ch.eof_received or ch.closed:
                    # Output is over but the exit status is not in yet: the channel's pipe stays
                    # readable after EOF, so select() would return at once and spin (measured:
                    # 500 wake-ups for `true`, a core busy while a command that closed its
                    # stdout runs on). Sleep on the status event instead.
                    ch.status_event.wait(min(left, 0.2))
                    continue
                select.select([ch], [], [], min(left, 0.2))
            code = ch.recv_exit_status()
        finally:
            ch.close()
        result = CommandResult(line, code, out.decode(errors="replace"), err.decode(errors="replace"))
        return self._checked(command, result, check)

    def start(self, command: Command) -> Stream:
        ch = self._channel()
        ch.set_combine_stderr(True)
        ch.exec_command(to_shell(command))
        return _SSHStream(ch)

    # -- files ------------------------------------------------------------------------------
    def sftp(self) -> paramiko.SFTPClient:
        with self._sftp_lock:
            if self._sftp is None:
                try:
                    self._sftp = self.client.open_sftp()
                except Exception as e:
                    raise ConnectError(self.node.label, f"cannot open SFTP: {e}") from e
            return self._sftp

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None:
        sftp = self.sftp()
        dest = self.expand(remote)
        tmp = dest + ".part"
        with self._sftp_lock:
            sftp.put(str(local), tmp)
            if mode is not None:
                sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, dest)

    def get(self, remote: str, local: str | Path) -> None:
        sftp = self.sftp()
        with self._sftp_lock:
            sftp.get(self.expand(remote), str(local))

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        import stat

        sftp = self.sftp()
        with self._sftp_lock:
            attrs = sftp.listdir_attr(self.expand(remote))
        return [
            (a.filename, stat.S_ISDIR(a.st_mode or 0), a.st_size or 0) for a in attrs
        ]

    @property
    def home(self) -> str:
        if self._home is None:
            sftp = self.sftp()
            with self._sftp_lock:
                self._home = sftp.normalize(".")
        return self._home

    def set_home(self, home: str) -> None:
        """Record the home a probe already reported, saving an SFTP round trip."""
        self._home = home

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        with contextlib.suppress(Exception):
            self._fabric.close()


def _short(line: str, limit: int = 80) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _accept_new_policy_base():  # noqa: ANN202
    import paramiko

    return paramiko.MissingHostKeyPolicy


class _AcceptNewPolicy(_accept_new_policy_base()):  # type: ignore[misc]
    """``--accept-new``: like OpenSSH's accept-new — record unknown keys, still refuse changed."""

    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(self, client, hostname, key) -> None:  # noqa: ANN001
        client.get_host_keys().add(hostname, key.get_name(), key)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


def connect(node: Node, settings: SSHSettings | None = None) -> Connection:
    """The right connection for a node: local for the embedded default, SSH otherwise."""
    if node.local:
        return LocalConnection(node)
    return SSHConnection(node, settings)
