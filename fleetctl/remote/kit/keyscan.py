"""The push's private-key scan: whether a file holds a private key anywhere, in ASCII/UTF-8
or UTF-16, as keys really leak (a key file, a notebook's JSON strings, a JSON value with ``\\n``
escapes, a triple-quoted string, after a BOM), streamed in chunks and linear in the file."""

from __future__ import annotations

import re


def _key_pattern(order: str) -> re.Pattern[bytes]:
    """A private key in one encoding: ``order`` puts UTF-16's zero byte after each character
    (``le``), before it (``be``), or nowhere (ASCII/UTF-8).

    Two shapes count. A PEM/OpenSSH/PuTTY header at a line start (or after a BOM), as a key
    file holds it. Or a header anywhere followed by the key's body: base64 (an encrypted PEM's
    ``Proc-Type:``, PuTTY's ``Encryption:``) after nothing but line ends, indentation, quotes,
    commas, ``+`` and backslash escapes: a key inside a notebook's JSON strings, a JSON value
    with ``\\n`` escapes, a triple-quoted string. A header alone inside a line (a parser's
    constant, prose) is no key."""

    def u(atom: bytes) -> bytes:
        return {"le": b"(?:" + atom + b"\\x00)", "be": b"(?:\\x00" + atom + b")"}.get(order, atom)

    def lit(text: str) -> bytes:
        return b"".join(u(re.escape(c).encode()) for c in text)

    pem = lit("-----BEGIN ") + b"(?:" + u(b"[A-Z0-9]") + b"+" + lit(" ") + b")*"
    pem += lit("PRIVATE KEY-----")
    putty = lit("PuTTY-User-Key-File-") + u(b"[0-9]") + b"+" + lit(": ")
    line_start = {
        "le": b"(?:(?<=\\n\\x00)|(?<=\\xff\\xfe)|\\A)",
        "be": b"(?:(?<=\\x00\\n)|(?<=\\xfe\\xff)|\\A)",
    }.get(order, b"(?:^|(?<=\\xef\\xbb\\xbf))")
    # one backslash, with or without its n/r: no two ways to read a run of backslashes
    gap = b"(?:" + u(b"[\\s\"',+]") + b"|" + u(b"\\\\") + u(b"[nr]") + b"?){0,64}"
    body = u(b"[A-Za-z0-9+/=]") + b"{40}"
    in_string = (
        pem + gap + b"(?:" + body + b"|" + lit("Proc-Type:") + b")"
        b"|" + putty + u(b"[a-z0-9-]") + b"+" + gap + lit("Encryption: ")
    )
    header = b"(?:" + pem + b"|" + putty + b")"
    return re.compile(b"(?m)" + line_start + header + b"|" + in_string)


# each hint (a substring every key holds), where its header starts (``-----BEGIN ``, or the
# hint itself) and its encoding's pattern: the pattern is matched only at a header's start
# near a hint, so a file that merely mentions headers costs microseconds a mention
_KEY_HINTS = tuple(
    (text.encode(enc), (begin or text).encode(enc), _key_pattern(order))
    for enc, order in (("ascii", "ascii"), ("utf-16-le", "le"), ("utf-16-be", "be"))
    for text, begin in (("PRIVATE KEY-----", "-----BEGIN "), ("PuTTY-User-Key-File-", None))
)
_BEFORE, _AFTER = 256, 512  # around a hint: the header's start; the gap and the body
_OVERLAP = _BEFORE + _AFTER  # bytes kept from the chunk before: a key cut by a boundary


def _has_key(buf: bytes, start: int) -> bool:
    """Whether a key pattern matches at a header near any hint in ``buf[start:]``."""
    for hint, begin, pattern in _KEY_HINTS:
        i = buf.find(hint, start)
        while i >= 0:
            j = buf.rfind(begin, max(start, i - _BEFORE), i + len(begin))
            if j >= 0 and pattern.match(buf, j, i + _AFTER):
                return True
            i = buf.find(hint, i + 1)
    return False


class KeyScan:
    """Streams a file's chunks and says whether a private key is anywhere in it: the whole
    file, not its head (a key appended to a 12 MB CSV), in ASCII/UTF-8 or UTF-16. Linear in
    the file (a substring test per chunk), with a fixed overlap so a key split across two
    chunks is still found."""

    def __init__(self) -> None:
        self.found = False
        self._tail = b""
        self._start = True

    def feed(self, chunk: bytes) -> None:
        if self.found:
            return
        seam = self._tail + chunk[:_OVERLAP]  # a header cut by the chunk boundary
        if any(hint in chunk or hint in seam for hint, _, _ in _KEY_HINTS):
            # past the file's start, the buffer's first byte (from the overlap) only says
            # whether the next one starts a line: search from 1 (\A and ^ never match there)
            self.found = _has_key(self._tail + chunk, 0 if self._start else 1)
        keep = _OVERLAP + 1
        self._tail = chunk[-keep:] if len(chunk) >= keep else (self._tail + chunk)[-keep:]
        self._start = False


def looks_like_private_key(data: bytes) -> bool:
    """Whether ``data`` (a whole file) holds a private key (see ``_key_pattern``)."""
    scan = KeyScan()
    scan.feed(data)
    return scan.found
