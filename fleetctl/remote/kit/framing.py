"""The one frame writer of the node programs that answer in lines on stdout: the check's probe,
the push helper, the port probe, stack dumps and the supervisor's one-shot modes. A frame is
``<kind> <json>`` and a newline, flushed at once (``fleetctl/phases/frames.py`` decodes it);
a frame of raw text (``L``, ``E``) is made by :func:`line` for writers that own their fd.

JSON by json's C encoder (json's defaults: ASCII, ``", "``/``": "``): importing json brings re
and enum, ~5 ms, a quarter of a no-op push probe's CPU on every node; json itself only where the
C half is missing or refuses a value. The supervisor's ``run`` mode writes :func:`line`'s
frames through its own thread (``output.py``: a stalled channel never blocks the job).
``tests/remote/test_one_reader.py`` fails when a program writes frames any other way.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import sys


def dumps(obj: object, sort_keys: bool = False) -> str:
    """``json.dumps(obj, sort_keys=sort_keys)``, by json's C encoder."""
    try:
        import _json

        make = _json.make_encoder
        enc = make(
            None, None, _json.encode_basestring_ascii, None, ": ", ", ", sort_keys, False, True
        )
        return "".join(enc(obj, 0))
    except Exception:  # not CPython's C half, its signature moved, or a value it refuses
        import json

        return json.dumps(obj, sort_keys=sort_keys)


def line(kind: str, payload: bytes = b"") -> bytes:
    """A frame's bytes: ``<kind> <payload>`` (raw text or JSON already encoded), or ``<kind>``
    alone; for the writers that own their fd (``output.Out``, ``follow``, ``reattach``)."""
    return kind.encode() + (b" " + payload if payload else b"") + b"\n"


def frame(kind: str, payload: object, *, sort_keys: bool = False) -> None:
    """One frame on stdout: ``<kind> <json>``."""
    sys.stdout.write(kind + " " + dumps(payload, sort_keys) + "\n")
    sys.stdout.flush()
