"""Host patterns inside inventories: ``host[:port]`` addresses and ``[x:y(:step)]`` ranges."""

from __future__ import annotations

import ipaddress
import re
import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.plan.inventory.model import _Model

_RANGE = r"\[(?:[a-zA-Z]:[a-zA-Z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_LABEL = rf"(?:\w|{_RANGE})(?:[\w-]|{_RANGE})*(?<![_-])"
_HOSTNAME_RE = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.UNICODE)
_IPV4_PART = r"(?:25[0-5]|2[0-4][0-9]|[01]?[0-9]{1,2}|\[[0-9]+:[0-9]+(?::[0-9]+)?\])"
_IPV4_RE = re.compile(rf"^(?:{_IPV4_PART}\.){{3}}{_IPV4_PART}$")
_BRACKET_PORT_RE = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOST_PORT_RE = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


def _parse_address(text: str) -> tuple[str, int | None] | None:
    """``host[:port]`` (``[v6]:port`` for IPv6) -> (host, port), or None if not an address."""
    port: int | None = None
    for rx in (_BRACKET_PORT_RE, _HOST_PORT_RE):
        m = rx.match(text)
        if m:
            text, port = m.group(1), int(m.group(2))
    if _IPV4_RE.match(text) or _is_ipv6(text) or _HOSTNAME_RE.match(text):
        return text, port
    return None


MAX_RANGE_HOSTS = 10_000  # hosts one pattern may name (gpu[0:99999999] is a typo, not a fleet)


def _expand_range(pattern: str) -> list[str]:
    """``gpu[01:03]`` -> gpu01 gpu02 gpu03 (zero padding kept, letters, steps, several ranges).

    ValueError beyond ``MAX_RANGE_HOSTS`` names, checked before anything is generated."""
    if "[" not in pattern:
        return [pattern]
    head, sep, rest = pattern.partition("[")
    body, sep2, tail = rest.partition("]")
    if not sep or not sep2:
        raise ValueError("unbalanced '[' in host range")
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise ValueError("must be begin:end or begin:end:step")
    beg, end = bounds[0] or "0", bounds[1]
    step_text = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise ValueError("no end value")
    if not step_text.isdigit() or int(step_text) < 1:
        raise ValueError("step must be a positive integer")
    step = int(step_text)
    width = len(beg) if beg[0] == "0" and len(beg) > 1 else 0
    if width and width != len(end):
        raise ValueError("zero-padded begin and end must have equal length")
    letters = string.ascii_letters
    if beg in letters and end in letters and len(beg) == len(end) == 1:
        i, j = letters.index(beg), letters.index(end)
        if i > j:
            raise ValueError("begins after it ends")
        seq = list(letters[i : j + 1 : step])
    elif beg.isdigit() and end.isdigit():
        if int(beg) > int(end):
            raise ValueError("begins after it ends")
        count = (int(end) - int(beg)) // step + 1
        if count > MAX_RANGE_HOSTS:
            raise ValueError(f"names {count} hosts, more than {MAX_RANGE_HOSTS} per pattern")
        seq = [str(v).zfill(width) for v in range(int(beg), int(end) + 1, step)]
    else:
        raise ValueError("must be numbers or single letters")
    out: list[str] = []
    for item in seq:
        out.extend(_expand_range(f"{head}{item}{tail}"))
        if len(out) > MAX_RANGE_HOSTS:  # several ranges multiply
            raise ValueError(f"names more than {MAX_RANGE_HOSTS} hosts per pattern")
    return out


def _expand_hostpattern(
    model: _Model, pattern: str, line: int | None
) -> tuple[list[str], int | None]:
    parsed = _parse_address(pattern)
    name, port = parsed if parsed else (pattern, None)
    try:
        names = _expand_range(name)
    except ValueError as e:
        raise model.error(f"bad host range {pattern!r}: {e}", line, host=pattern) from e
    for n in names:
        if not n or n.strip() != n:
            raise model.error(f"invalid host name {n!r}", line, host=n)
    if port is not None and not 0 < port < 65536:
        raise model.error(
            f"host {pattern!r}: port {port} out of range", line, host=pattern, field="ansible_port"
        )
    return names, port
