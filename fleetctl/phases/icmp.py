"""The controller's ICMP echo, in-process: no ``ping`` process per host.

``fleetctl check`` pings every host from this machine; a ``ping`` process each cost the
controller a fork and an exec per host (at 64 hosts a quarter of a second of CPU on two cores).
An unprivileged datagram ICMP socket where ``net.ipv4.ping_group_range`` allows it, else a raw
socket (root); where neither may be opened the caller runs the ``ping`` binary as before.
"""

from __future__ import annotations

import errno
import itertools
import os
import socket
import struct
import threading
import time

_SEQ = itertools.count(1)
_SEQ_LOCK = threading.Lock()


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def _open() -> tuple[socket.socket, bool] | None:
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP), False
    except OSError:
        pass
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP), True
    except OSError:
        return None


def echo(ip: str, timeout: float) -> float | str | None:
    """One echo to IPv4 ``ip``: the round trip in seconds, ``"timeout"``, or None when this
    process may not send ICMP (the caller falls back to the ``ping`` binary)."""
    opened = _open()
    if opened is None:
        return None
    s, raw = opened
    with _SEQ_LOCK:
        seq = next(_SEQ) & 0xFFFF
    ident = (os.getpid() ^ threading.get_ident()) & 0xFFFF
    token = os.urandom(8)
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    packet = struct.pack("!BBHHH", 8, 0, checksum(header + token), ident, seq) + token
    start = time.monotonic()
    deadline = start + timeout
    try:
        s.sendto(packet, (ip, 0))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            s.settimeout(left)
            try:
                data, addr = s.recvfrom(2048)
            except TimeoutError:
                return "timeout"
            if raw:  # a raw socket sees every ICMP packet, IP header first
                data = data[(data[0] & 0x0F) * 4 :]
            if addr[0] != ip or len(data) < 16 or data[0] != 0:
                continue
            _type, _code, _sum, rid, rseq = struct.unpack("!BBHHH", data[:8])
            # a datagram socket's id is the kernel's (its port): match on seq and payload
            if rseq == seq and data[8:16] == token and (rid == ident or not raw):
                return time.monotonic() - start
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "timeout"
        if e.errno in (errno.EPERM, errno.EACCES):
            return None
        raise
    finally:
        s.close()
