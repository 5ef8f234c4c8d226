"""One node over SSH: one paramiko transport, opened once and shared by every phase.

``SSHConnection`` is the default transport (``connection.transport``): ``dial`` opens it
(ssh_config through ``sshconfig``, ProxyJump hops, host keys through ``hostkeys``); commands,
the supervisor's stream and copies run on cheap channels of that one transport instead of new
handshakes.
"""

from __future__ import annotations

import contextlib
import secrets
import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.errors import ConnectError, RemoteCommandError
from fleetctl.results import CommandResult
from fleetctl.transport import dial
from fleetctl.transport.connection import (
    Command,
    Connection,
    PingTarget,
    SSHSettings,
    Stream,
    to_shell,
)
from fleetctl.transport.loginshell import for_login_shell

if TYPE_CHECKING:
    import paramiko

    from fleetctl.node import Node
    from fleetctl.transport.openssh import RsyncTarget

SFTP_IDLE_TIMEOUT = 30.0  # an SFTP request unanswered this long means the link is gone


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

    def fileno(self) -> int | None:
        return self._ch.fileno()  # paramiko's pipe: set while data or EOF is waiting


class SSHConnection(Connection):
    """One authenticated transport to a node, opened once and reused by every phase.

    ``dial`` opens it (ssh_config, jump hosts, auth); commands, the streamed supervisor and files
    use paramiko channels on its transport: every wait bounded, stdin sent whole, a signal death
    as 128+N, streams both ways, and ``put`` renames a ``.part`` file into place.
    """

    can_rsync = True

    def __init__(self, node: Node, settings: SSHSettings | None = None) -> None:
        self.node = node
        self.settings = settings or SSHSettings()
        self._sftp: paramiko.SFTPClient | None = None
        self._sftp_lock = threading.Lock()
        self._home: str | None = None
        self._clients = dial.dial(node, self.settings)  # jump hosts first, the node's last
        self.client: paramiko.SSHClient = self._clients[-1]

    # -- capabilities -----------------------------------------------------------------------
    def rsync_target(self, path: str) -> RsyncTarget:
        """OpenSSH with this connection's trust settings as rsync's shell (``openssh``)."""
        from fleetctl.transport.openssh import rsync_target

        return rsync_target(self.node, self.settings, path)

    def upload(self, local: Path, remote: str, progress: Callable[[int, int], None]) -> None:
        """SFTP on a channel of its own (parallel uploads don't serialise behind ``put``'s
        session), progress per SFTP write, through ``remote.part`` and a rename."""
        part = remote + ".part"
        sftp = self.client.open_sftp()
        try:
            sftp.put(str(local), part, callback=progress, confirm=True)
            sftp.posix_rename(part, remote)
        finally:
            sftp.close()

    def use_settings(self, settings: SSHSettings) -> None:
        self.settings = settings

    @classmethod
    def ping_target(cls, node: Node, settings: SSHSettings) -> PingTarget:
        """The address the connection itself resolves (ssh_config aliases); a node behind a
        jump host cannot be pinged from here."""
        from fleetctl.transport import sshconfig

        target = sshconfig.resolve(node, settings)
        if target.proxied:
            return PingTarget(skip="behind a jump host")
        return PingTarget(target.hostname, target.port)

    @property
    def jump_clients(self) -> list[paramiko.SSHClient]:
        """The jump hosts' clients, nearest to here first (empty when dialled directly)."""
        return self._clients[:-1]

    def alive(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

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
                ch.exec_command(for_login_shell(line, self.node.shell_type))
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
            ch.exec_command(for_login_shell(line, self.node.shell_type))
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
        # a name of its own: nodes on one shared home put the same file at once (py-spy)
        tmp = f"{dest}.{secrets.token_hex(4)}.part"
        with self._sftp_lock, self._sftp_guard(f"put {dest}"):
            try:
                sftp.put(str(local), tmp)
                if mode is not None:
                    sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, dest)
            except BaseException:
                with contextlib.suppress(Exception):
                    sftp.remove(tmp)
                raise

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

    def remember_home(self, home: str) -> None:
        """Record the home a probe already reported, saving an SFTP round trip."""
        self._home = home

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._sftp is not None:
                self._sftp.close()
        dial.close(self._clients)


def _paramiko_errors() -> type[Exception]:
    """paramiko's exception root, imported lazily like the rest of paramiko."""
    import paramiko

    return paramiko.SSHException


def _short(line: str, limit: int = 80) -> str:
    return line if len(line) <= limit else line[: limit - 1] + "…"
