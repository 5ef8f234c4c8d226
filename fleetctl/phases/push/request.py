"""What a push ships and under which policy: one record that ``fleetctl push`` (``Fleet.push``)
and ``fleetctl run`` (``RunSpec``'s ``Program.push_request``) both build, and that every layer
after them passes whole: the push phase, the check's look for the snapshot, a spare's push
(``run --elastic``) and the checkpoint relay, whose scan on the node lets the same files through
as the snapshot's here (:meth:`PushRequest.snapshot`, :meth:`PushRequest.node_scan`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.phases.codesync import CodeSnapshot


@dataclass(frozen=True)
class PushRequest:
    """``code``: the local folder shipped (None: no code); ``env_archive``: the conda-pack
    archive every node gets (None: each node's own ``fleetctl_env_archive``, if any);
    ``allow_secrets``: files that look like private keys, shipped on purpose (paths relative
    to the code folder, or to the work folder a checkpoint relay reads)."""

    code: str | Path | None = None
    env_archive: str | Path | None = None
    allow_secrets: tuple[str, ...] = ()

    def asked(self) -> bool:
        """Code or an archive named: ``run`` pushes only then (an inventory's archive alone
        is ``fleetctl push``'s to ship)."""
        return self.code is not None or self.env_archive is not None

    def env_given(self) -> bool:
        """An archive named here, over the inventory's: its python runs the launcher."""
        return bool(self.env_archive)

    def archive_of(self, node: Node) -> tuple[str | Path | None, bool]:
        """The archive ``node`` gets (None: no env), and whether it is the node's own
        (``fleetctl_env_archive``: an error about it names the host)."""
        if self.env_archive:
            return self.env_archive, False
        return node.env_archive, True

    def snapshot(self) -> CodeSnapshot:
        """The code folder's snapshot; SecretError for a file that looks like a private key
        and is not allowed (UsageError when there is no folder or it is not one)."""
        from fleetctl.phases.codesync import snapshot

        if self.code is None:
            raise ValueError("PushRequest.snapshot: no code folder")
        return snapshot(self.code, allow_secrets=self.allow_secrets)

    def node_scan(self) -> dict[str, list[str]]:
        """The node-side scan's arguments (``relay-pack``'s, in ``remote/``): the files it
        lets through although they look like private keys, as the snapshot does here."""
        return {"allow_secrets": sorted(self.allow_secrets)}
