"""One node: run commands, stream a long-running command, copy files. SSH or local.

An ``SSHConnection`` holds one authenticated paramiko transport per node for the whole
``fleetctl`` invocation; every phase opens cheap channels on it instead of new handshakes.
Host keys are verified against known_hosts; unknown or changed keys are refused with the exact
command that fixes it. ``LocalConnection`` runs the same commands on this machine without SSH
(the embedded default fleet).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import shlex
import socket
import subprocess
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import ConnectError, HostKeyError, RemoteCommandError
from fleetctl.results import CommandResult

if TYPE_CHECKING:
    import paramiko

    from fleetctl.node import Node

Command = str | Sequence[str]

SFTP_IDLE_TIMEOUT = 30.0  # an SFTP request unanswered this long means the link is gone


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
        if self._proc.stdin.closed:  # like a closed SSH channel: OSError, as documented
            raise OSError("stdin closed")
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
                ["/bin/sh", "-c", line],
                input=stdin,
                capture_output=True,
                timeout=timeout,
                stdin=None if stdin is not None else subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            raise RemoteCommandError(
                self.node.label,
                line,
                None,
                f"{self.node.label}: `{line}` timed out after {timeout:g}s",
            ) from e
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        result = CommandResult(
            line, code, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
        )
        return self._checked(command, result, check)

    def start(self, command: Command) -> Stream:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", to_shell(command)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
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


# AEAD first: with aes-ctr + hmac-sha2 (paramiko's default order) every packet costs a Python
# HMAC set-up and a byte-by-byte MAC comparison in Python; AES-GCM is one C call per packet.
# The others stay, in paramiko's order, for servers without GCM (OpenSSH < 6.2).
_AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport, preferring AES-GCM (``transport_factory`` of SSHClient.connect)."""
    import paramiko

    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    have = tuple(opts.ciphers)
    first = tuple(c for c in _AEAD_CIPHERS if c in have)
    opts.ciphers = first + tuple(c for c in have if c not in first)
    return t


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
    def _connect(self):
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
        kwargs["transport_factory"] = _transport
        if node.key_file:
            key = os.path.expanduser(node.key_file)
            if not os.path.isfile(key):
                raise ConnectError(node.label, f"private key file {key} not found")
            kwargs["key_filename"] = [key]
            kwargs["look_for_keys"] = False
        conn = FabricConnection(
            host=node.address,
            user=node.user,
            port=node.port if node.port != 22 else None,
            config=config,
            connect_timeout=st.connect_timeout,
            connect_kwargs=kwargs,
        )
        known_hosts = st.known_hosts_for(node)
        # fabric builds one Connection per ProxyJump hop from ssh_config, each with AutoAddPolicy,
        # fabric's own connect kwargs and no timeout: verify and bound every hop like the target.
        hops = [conn]
        while isinstance(hops[-1].gateway, FabricConnection):
            hops.append(hops[-1].gateway)
        for hop in hops:
            self._strict_host_keys(hop.client, known_hosts)
            hop.connect_timeout = st.connect_timeout  # fabric int()s it: 0.5 would mean no limit
            # Like OpenSSH, skip IdentityFile entries that do not exist (paramiko would abort the
            # whole login with FileNotFoundError at the first missing one).
            keys = [
                k
                for k in hop.connect_kwargs.get("key_filename") or []
                if os.path.isfile(os.path.expanduser(k))
            ]
            hop.connect_kwargs = {
                k: v for k, v in hop.connect_kwargs.items() if k != "key_filename"
            }
            if keys:
                hop.connect_kwargs["key_filename"] = keys
        for gw in hops[1:]:  # keys: the hop's own IdentityFile (fabric merged it), not the node's
            gw.connect_kwargs = {
                **gw.connect_kwargs,
                "transport_factory": _transport,
                "allow_agent": kwargs["allow_agent"],
                "banner_timeout": st.connect_timeout,
                "auth_timeout": st.connect_timeout,
                "channel_timeout": st.connect_timeout,  # the direct-tcpip open to the next hop
            }
        try:
            conn.open()
        except BaseException as e:
            _close_hops(conn)
            raise self._translate(e, conn, known_hosts) from e
        transport = conn.client.get_transport()
        if transport is not None and st.keepalive:
            transport.set_keepalive(max(1, int(st.keepalive)))
        if transport is not None:
            _record_exit_signals(transport)
        return conn

    def _strict_host_keys(self, client: paramiko.SSHClient, known_hosts: str) -> None:
        """Only known_hosts decides (fabric installs AutoAddPolicy); accept-new records, never
        replaces."""
        import paramiko

        client._host_keys = paramiko.HostKeys()
        client._system_host_keys = paramiko.HostKeys()
        if os.path.exists(known_hosts):
            try:
                client.load_host_keys(known_hosts)
            except (OSError, paramiko.SSHException) as e:
                raise ConnectError(
                    self.node.label, f"cannot read known_hosts {known_hosts}: {e}"
                ) from e
        elif self.settings.accept_new:
            client._host_keys_filename = known_hosts
        if self.settings.accept_new:
            client.set_missing_host_key_policy(_AcceptNewPolicy(known_hosts))
        else:
            client.set_missing_host_key_policy(paramiko.RejectPolicy())

    def _translate(self, e: BaseException, conn: object, known_hosts: str) -> BaseException:
        import paramiko

        node = self.node
        host, port = getattr(conn, "host", node.address), getattr(conn, "port", node.port)
        where = f"{host}:{port}"
        key_name = host if port == 22 else f"[{host}]:{port}"
        gateway = getattr(conn, "gateway", None)
        if gateway is not None and hasattr(gateway, "host"):
            where += f" (via {gateway.host}:{gateway.port})"
        # Which hop's key was refused: paramiko names it; it is a ProxyJump hop unless it is ours.
        named = getattr(e, "hostname", None)
        if named is None and isinstance(e, paramiko.SSHException):
            m = re.search(r"Server '(.+)' not found in known_hosts", str(e))
            named = m.group(1) if m else None
        if named and named != key_name:
            key_name = named
            host, _, p = named[1:].partition("]:") if named.startswith("[") else (named, "", "22")
            port = int(p)
            where = f"jump host {host}:{port}"
        if isinstance(e, paramiko.BadHostKeyException):
            return HostKeyError(
                node.label,
                f"host key for {where} CHANGED (got {e.key.get_name()} "
                f"{e.key.fingerprint}), refusing to connect",
                hint=f"if the host was reinstalled: ssh-keygen -f {known_hosts} -R '{key_name}'",
            )
        if isinstance(e, paramiko.SSHException) and "not found in known_hosts" in str(e):
            return HostKeyError(
                node.label,
                f"host key for {where} is unknown (not in {known_hosts}), refusing",
                hint=f"verify it, then: ssh-keyscan -p {port} {host} >> {known_hosts}"
                " (or pass --accept-new)",
            )
        if isinstance(e, paramiko.PasswordRequiredException):
            return ConnectError(
                node.label,
                f"private key for {where} needs a passphrase; "
                "load it into ssh-agent (batch mode never prompts)",
            )
        if isinstance(e, paramiko.SSHException) and "No authentication methods" in str(e):
            return ConnectError(
                node.label,
                f"authentication failed for {conn.user}@{where}: no key to offer "  # type: ignore[attr-defined]
                "(no key file, no ssh-agent key, no IdentityFile that exists)",
            )
        if isinstance(e, paramiko.AuthenticationException):
            return ConnectError(node.label, f"authentication failed for {conn.user}@{where}: {e}")  # type: ignore[attr-defined]
        if isinstance(e, socket.gaierror):
            return ConnectError(node.label, f"cannot resolve host name {host!r}: {e.strerror}")
        if isinstance(e, UnicodeError):  # not a valid DNS name (empty or >63-char label)
            return ConnectError(node.label, f"cannot resolve host name {host!r}: invalid name")
        if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
            # paramiko folds "no route to host" (nobody answers ARP: host down) into this too
            if any(x.errno == errno.EHOSTUNREACH for x in e.errors.values()):
                return ConnectError(node.label, f"no route to {where} (host unreachable)")
            return ConnectError(node.label, f"connection refused by {where}")
        if isinstance(e, ConnectionRefusedError):
            return ConnectError(node.label, f"connection refused by {where}")
        if isinstance(e, (socket.timeout, TimeoutError)):
            return ConnectError(
                node.label,
                f"timed out after {self.settings.connect_timeout:g}s connecting to {where}",
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
        timed_out = RemoteCommandError(
            self.node.label,
            line,
            None,
            f"{self.node.label}: `{_short(line)}` timed out after {timeout:g}s",
        )
        # exec_command waits for the server's reply and sendall for window space, both without
        # a limit (a lost link, stdin nobody reads): closing the channel at the deadline wakes them.
        expired = threading.Event()
        watchdog = threading.Timer(timeout, lambda: (expired.set(), ch.close()))
        watchdog.daemon = True
        watchdog.start()
        try:
            try:
                ch.exec_command(line)
                if stdin is not None:
                    ch.sendall(stdin)
                ch.shutdown_write()
            except (OSError, EOFError, _paramiko_errors()) as e:
                if expired.is_set():
                    raise timed_out from e
                raise ConnectError(self.node.label, f"SSH channel failed: {e}") from e
            while True:
                if ch.recv_ready():
                    out += ch.recv(65536)
                    continue
                if ch.recv_stderr_ready():
                    err += ch.recv_stderr(65536)
                    continue
                if (
                    ch.exit_status_ready()
                    and not ch.recv_ready()
                    and not ch.recv_stderr_ready()
                    and (ch.eof_received or ch.closed)
                ):
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise timed_out
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
            if expired.is_set():  # the watchdog closed the channel: -1 is not the command's code
                raise timed_out
            code = ch.recv_exit_status()
        finally:
            watchdog.cancel()
            ch.close()
        result = CommandResult(
            line, code, out.decode(errors="replace"), err.decode(errors="replace")
        )
        return self._checked(command, result, check)

    def start(self, command: Command) -> Stream:
        line = to_shell(command)
        ch = self._channel()
        ch.set_combine_stderr(True)
        watchdog = threading.Timer(self.settings.connect_timeout, ch.close)  # as in run()
        watchdog.daemon = True
        watchdog.start()
        try:
            ch.exec_command(line)
        except (OSError, EOFError, _paramiko_errors()) as e:
            ch.close()
            raise ConnectError(self.node.label, f"cannot start `{_short(line)}`: {e}") from e
        finally:
            watchdog.cancel()
        return _SSHStream(ch)

    # -- files ------------------------------------------------------------------------------
    def sftp(self) -> paramiko.SFTPClient:
        with self._sftp_lock:
            if self._sftp is None:
                import paramiko

                ch = self._channel()
                # invoke_subsystem waits for the server without a limit (like exec_command); the
                # channel timeout then bounds every SFTP read and write (paramiko's default: none).
                watchdog = threading.Timer(self.settings.connect_timeout, ch.close)
                watchdog.daemon = True
                watchdog.start()
                try:
                    ch.settimeout(SFTP_IDLE_TIMEOUT)
                    ch.invoke_subsystem("sftp")
                    self._sftp = paramiko.SFTPClient(ch)
                except Exception as e:
                    ch.close()
                    raise ConnectError(self.node.label, f"cannot open SFTP: {e}") from e
                finally:
                    watchdog.cancel()
            return self._sftp

    @contextlib.contextmanager
    def _sftp_guard(self, what: str) -> Iterator[None]:
        """A lost link inside an SFTP call is a ConnectError, and the session is dropped (its
        replies would be out of step) so the next call opens a new one. File errors pass."""
        try:
            yield
        except (OSError, EOFError, _paramiko_errors()) as e:
            if isinstance(e, OSError) and e.errno is not None and not isinstance(e, TimeoutError):
                raise  # the remote file's own error (ENOENT, EACCES, ...)
            with contextlib.suppress(Exception):
                self._sftp.close()  # type: ignore[union-attr]
            self._sftp = None
            raise ConnectError(self.node.label, f"SFTP {what}: {e or 'no answer'}") from e

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None:
        sftp = self.sftp()
        dest = self.expand(remote)
        tmp = dest + ".part"
        with self._sftp_lock, self._sftp_guard(f"put {dest}"):
            sftp.put(str(local), tmp)
            if mode is not None:
                sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, dest)

    def get(self, remote: str, local: str | Path) -> None:
        sftp = self.sftp()
        path = self.expand(remote)  # before the lock: the first expand() takes it (home)
        with self._sftp_lock, self._sftp_guard(f"get {path}"):
            sftp.get(path, str(local))

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        import stat

        sftp = self.sftp()
        path = self.expand(remote)  # before the lock: the first expand() takes it (home)
        with self._sftp_lock, self._sftp_guard(f"listdir {path}"):
            attrs = sftp.listdir_attr(path)
        dirs = [stat.S_ISDIR(a.st_mode or 0) for a in attrs]  # size 0 for folders, like local
        return [
            (a.filename, d, 0 if d else a.st_size or 0) for a, d in zip(attrs, dirs, strict=True)
        ]

    @property
    def home(self) -> str:
        if self._home is None:
            sftp = self.sftp()
            with self._sftp_lock, self._sftp_guard("home"):
                self._home = sftp.normalize(".")
        return self._home

    def set_home(self, home: str) -> None:
        """Record the home a probe already reported, saving an SFTP round trip."""
        self._home = home

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        _close_hops(self._fabric)


def _close_hops(conn: object) -> None:
    """Close a fabric connection and its ProxyJump hops (fabric's close() leaves them open)."""
    while conn is not None and hasattr(conn, "client"):
        with contextlib.suppress(Exception):
            conn.close()  # type: ignore[attr-defined]
        conn = getattr(conn, "gateway", None)


def _record_exit_signals(transport: paramiko.Transport) -> None:
    """A command killed by signal N gets exit code 128+N (like LocalConnection and a shell).

    sshd reports it as "exit-signal" with no "exit-status"; paramiko ignores that request, so
    recv_exit_status() would say -1. Its channel handlers are a class-level table: this
    transport gets its own copy with a request handler that records the signal first.
    """
    import signal

    from paramiko.common import MSG_CHANNEL_REQUEST

    table = getattr(type(transport), "_channel_handler_table", None)
    if not isinstance(table, dict) or MSG_CHANNEL_REQUEST not in table:
        return  # a paramiko without this table: keep its behaviour
    base = table[MSG_CHANNEL_REQUEST]

    def handle(chan: paramiko.Channel, m: paramiko.Message) -> None:
        pos = m.packet.tell()
        try:
            if m.get_text() == "exit-signal":
                m.get_boolean()  # want_reply
                name = m.get_text()
                sig = getattr(signal.Signals, f"SIG{name}", None)
                if sig is not None and chan.exit_status == -1:
                    chan.exit_status = 128 + int(sig)
                    chan.status_event.set()
        except Exception:  # a malformed request: leave it to paramiko
            pass
        m.packet.seek(pos)
        base(chan, m)

    transport._channel_handler_table = {**table, MSG_CHANNEL_REQUEST: handle}


def _paramiko_errors() -> type[Exception]:
    """paramiko's exception root, imported lazily like the rest of paramiko."""
    import paramiko

    return paramiko.SSHException


def _short(line: str, limit: int = 80) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"


class _AcceptNewPolicy:
    """``--accept-new``: like OpenSSH's accept-new — record unknown keys, still refuse changed.

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


def connect(node: Node, settings: SSHSettings | None = None) -> Connection:
    """The right connection for a node: local for the embedded default, SSH otherwise."""
    if node.local:
        return LocalConnection(node)
    return SSHConnection(node, settings)
