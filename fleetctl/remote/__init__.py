"""Programs that run on the nodes: stdlib only, Python >= 3.8, shipped as source.

Nothing here is imported by a node: the controller reads each file with :func:`source` and
sends it (over stdin, or once per content hash into the node's workdir).
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent

# Node programs are stdlib only, so their python skips ``site`` (``-S``): its .pth files cost
# every start ~36 ms of CPU with this machine's python (an editable install's finder, certifi),
# more in a big conda env, and a no-op run starts several node programs on every node. Not for
# what runs the user's packages: the launcher-module import, envinfo, the job itself.
NO_SITE = "-S"


def path(name: str) -> Path:
    """The file of node program ``name`` (e.g. ``"supervisor.py"``)."""
    return HERE / name


def source(name: str) -> bytes:
    """The source of node program ``name``, as shipped to nodes."""
    return path(name).read_bytes()
