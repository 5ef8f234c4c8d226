"""The workdir's id (``W/.fleetctl-id``): nodes that read one id share one folder (an NFS
home), so one of them pushes for all. Shared by the check's probe and the push helper.

Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

import os
import time


def workdir_id(workdir: str, wait: float = 2.0) -> str | None:
    """A random id kept in the workdir (made once, atomically): nodes that read the same id
    see the same folder, e.g. a home shared over NFS. None when it cannot be made or read.

    Nodes of one shared home run this at once: the id is written whole under a name of its
    own and hard-linked into place, so no node reads it half made; where links are not
    allowed it is created exclusively and written, and a reader that finds it still empty
    reads again for up to ``wait`` seconds."""
    path = os.path.join(workdir, ".fleetctl-id")
    try:
        os.makedirs(workdir, mode=0o700, exist_ok=True)
        if not os.path.exists(path):
            _make_id(path)
    except OSError:
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(path) as f:
                text = f.read(64).strip()
        except OSError:
            return None
        if text or time.monotonic() >= deadline:
            return text or None
        time.sleep(0.05)


def _make_id(path: str) -> None:
    data = (os.urandom(8).hex() + "\n").encode()
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.link(tmp, path)  # whole, or not at all: another node's id stays
        return
    except FileExistsError:
        return
    except OSError:
        pass  # no hard links here: create it exclusively instead
    finally:
        try:  # noqa: SIM105 - contextlib stays unimported on the probe's path
            os.unlink(tmp)
        except OSError:
            pass
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "wb") as f:
        f.write(data)
