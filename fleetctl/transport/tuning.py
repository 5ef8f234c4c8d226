"""paramiko transport tuning shared by every hop: no Nagle delay, cipher order, exit codes of
signals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import paramiko

# AEAD first: with aes-ctr + hmac-sha2 (paramiko's default order) every packet costs a Python
# HMAC set-up and a byte-by-byte MAC comparison in Python; AES-GCM is one C call per packet.
# The others stay, in paramiko's order, for servers without GCM (OpenSSH < 6.2).
_AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def transport_factory(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport, preferring AES-GCM (``transport_factory`` of SSHClient.connect),
    on a TCP socket without Nagle's delay (:func:`no_delay`)."""
    import paramiko

    no_delay(sock)
    t = paramiko.Transport(sock, **kwargs)
    _ack_unanswered(t)
    opts = t.get_security_options()
    have = tuple(opts.ciphers)
    first = tuple(c for c in _AEAD_CIPHERS if c in have)
    opts.ciphers = first + tuple(c for c in have if c not in first)
    return t


def no_delay(sock: Any) -> None:
    """TCP_NODELAY, as OpenSSH's client sets it: with Nagle's algorithm on, a small SSH packet
    (a channel open, a window adjust) waits for the ACK of the one before, which the node sends
    only after its 40 ms delayed-ACK timer: every channel open cost 40 ms (0.3 ms without).
    Not a socket (a jump host's channel, a ProxyCommand): nothing to do."""
    import contextlib
    import socket

    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):  # keeps working, only slower
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _ack_unanswered(t: paramiko.Transport) -> None:
    """ACK at once what sshd sends that needs no answer: right after the authentication it sends
    a ``hostkeys-00@openssh.com`` global request and a debug message (the key's options), and,
    Nagle being on for its non-interactive sessions, holds its next packet (the first channel's
    confirmation) until they are ACKed, which this side delays by its 40 ms delayed-ACK timer.
    Every connection's first command waited 40 ms. TCP_QUICKACK sends the pending ACK now
    (Linux; elsewhere the wait stays)."""
    import contextlib
    import socket

    from paramiko.common import MSG_GLOBAL_REQUEST

    sock, opt = t.sock, getattr(socket, "TCP_QUICKACK", None)
    table = getattr(t, "_handler_table", None)
    if opt is None or not isinstance(sock, socket.socket) or not isinstance(table, dict):
        return
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return

    def ack() -> None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, opt, 1)

    on_global, on_debug = table.get(MSG_GLOBAL_REQUEST), t._parse_debug  # type: ignore[attr-defined]

    def global_request(m: paramiko.Message) -> None:
        if on_global is not None:
            on_global(m)
        ack()

    def debug(m: paramiko.Message) -> None:
        on_debug(m)
        ack()

    table[MSG_GLOBAL_REQUEST] = global_request
    t._parse_debug = debug  # type: ignore[attr-defined]


def record_exit_signals(transport: paramiko.Transport) -> None:
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
