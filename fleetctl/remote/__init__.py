"""Programs that run on the nodes: stdlib only, Python >= 3.8, shipped as source.

Nothing here is imported by a node: the controller reads each file with :func:`source` and
sends it (over stdin, or once per content hash into the node's workdir).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def path(name: str) -> Path:
    """The file of node program ``name`` (e.g. ``"supervisor.py"``)."""
    return HERE / name


def source(name: str) -> bytes:
    """The source of node program ``name``, as shipped to nodes."""
    return path(name).read_bytes()
