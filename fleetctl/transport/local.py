"""This machine as a node, without SSH (the embedded default fleet): each command a
``/bin/sh -c`` process here (``ExecConnection`` runs and streams it), files copied in place."""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from fleetctl.transport.connection import PingTarget
from fleetctl.transport.execclient import ExecConnection
from fleetctl.transport.openssh import RsyncTarget

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings


class LocalConnection(ExecConnection):
    """This machine, without SSH: same commands, run by ``/bin/sh -c``."""

    can_rsync = True  # from folder to folder, no remote shell

    def argv(self, line: str) -> list[str]:
        return ["/bin/sh", "-c", line]

    def rsync_target(self, path: str) -> RsyncTarget:
        return RsyncTarget((), path)

    def upload(self, local: Path, remote: str, progress: Callable[[int, int], None]) -> None:
        """A copy in 1 MiB chunks (progress per chunk) to ``remote.part``, renamed into place."""
        part = remote + ".part"
        size, done = local.stat().st_size, 0
        with open(local, "rb") as fi, open(part, "wb") as fo:
            for chunk in iter(lambda: fi.read(1 << 20), b""):
                fo.write(chunk)
                done += len(chunk)
                progress(done, size)
        os.replace(part, remote)

    @classmethod
    def ping_target(cls, node: Node, settings: SSHSettings) -> PingTarget:
        return PingTarget(skip="local")

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None:
        dest = Path(self.expand(remote))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{dest.name}.{secrets.token_hex(4)}.part")  # see SSHConnection.put
        try:
            shutil.copyfile(local, tmp)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get(self, remote: str, local: str | Path) -> None:
        shutil.copyfile(self.expand(remote), local)

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        out = []
        with os.scandir(self.expand(remote)) as it:
            for e in it:
                is_dir = e.is_dir(follow_symlinks=False)
                out.append((e.name, is_dir, 0 if is_dir else e.stat(follow_symlinks=False).st_size))
        return out

    @property
    def home(self) -> str:
        return os.path.expanduser("~")

    def close(self) -> None:
        pass
