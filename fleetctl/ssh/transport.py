"""paramiko transport tuning shared by every hop: cipher order and exit codes of signals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import paramiko

# AEAD first: with aes-ctr + hmac-sha2 (paramiko's default order) every packet costs a Python
# HMAC set-up and a byte-by-byte MAC comparison in Python; AES-GCM is one C call per packet.
# The others stay, in paramiko's order, for servers without GCM (OpenSSH < 6.2).
_AEAD_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def transport_factory(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport, preferring AES-GCM (``transport_factory`` of SSHClient.connect)."""
    import paramiko

    t = paramiko.Transport(sock, **kwargs)
    opts = t.get_security_options()
    have = tuple(opts.ciphers)
    first = tuple(c for c in _AEAD_CIPHERS if c in have)
    opts.ciphers = first + tuple(c for c in have if c not in first)
    return t


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
