"""One ICMP echo sent and awaited inside this process: the check probe's ping of its peers and
the controller's ping of each node (``phases/check/preflight.py``), one implementation.

Node module: stdlib only, Python >= 3.8 (the probe's: 3.7+).
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import threading
import time


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


_ECHO_SEQ = [0]
_ECHO_LOCK = threading.Lock()


def icmp_echo(src: str, dst: str, timeout: float) -> str | None:
    """One ICMP echo from ``src`` to ``dst`` inside this process — no ``ping`` process per
    peer, which at 64+ hosts costs more than the mesh itself. An unprivileged datagram ICMP
    socket where ``net.ipv4.ping_group_range`` allows it, else a raw socket (root); None when
    neither may be opened (the caller falls back to the ``ping`` binary)."""
    raw = False
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    except OSError:
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
            raw = True
        except OSError:
            return None
    with _ECHO_LOCK:
        _ECHO_SEQ[0] = (_ECHO_SEQ[0] + 1) & 0xFFFF
        seq = _ECHO_SEQ[0]
    ident = (os.getpid() ^ threading.get_ident()) & 0xFFFF
    token = os.urandom(8)
    header = struct.pack("!BBHHH", 8, 0, 0, ident, seq)
    packet = struct.pack("!BBHHH", 8, 0, _checksum(header + token), ident, seq) + token
    deadline = time.monotonic() + timeout
    try:
        s.bind((src, 0))
        s.sendto(packet, (dst, 0))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            s.settimeout(left)
            try:
                data, addr = s.recvfrom(2048)
            except socket.timeout:
                return "timeout"
            if raw:  # a raw socket sees every ICMP packet, IP header first
                data = data[(data[0] & 0x0F) * 4 :]
            if addr[0] != dst or len(data) < 16 or data[0] != 0:
                continue
            _type, _code, _sum, rid, rseq = struct.unpack("!BBHHH", data[:8])
            # a datagram socket's id is the kernel's (its port): match on seq and payload
            if rseq == seq and data[8:16] == token and (rid == ident or not raw):
                return "ok"
    except OSError as e:
        if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "timeout"
        if e.errno in (errno.EPERM, errno.EACCES):
            return None
        return "error: " + (e.strerror or str(e))
    finally:
        s.close()
