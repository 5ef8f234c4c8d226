"""What a push takes and tells: its options, progress events, each node's outcome and the
report the run phase reads (code and env dirs per node)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


@dataclass(frozen=True)
class PushEvent:
    """Progress of one node, for a live display. ``stage``: probe, code, upload, fetch,
    finalize, done, failed. ``done``/``total`` are bytes for transfers, else 0."""

    node: str
    stage: str
    done: int = 0
    total: int = 0
    message: str = ""


ProgressFn = Callable[[PushEvent], None]


@dataclass(frozen=True)
class PushOptions:
    """How to push. ``peer`` None = peer distribution when at least ``peer_min_nodes`` nodes
    need the same archive; ``train_addrs`` (node name -> training-network address, from check
    facts) is where seed servers listen; ``require_nccl`` when the job uses the nccl backend."""

    keep_snapshots: int = 5
    require_nccl: bool = False
    check_torch: bool = False
    peer: bool | None = None
    peer_min_nodes: int = 4
    peer_fanout: int = 2
    seeds: int = 1
    train_addrs: Mapping[str, str] = field(default_factory=dict)
    use_rsync: bool = True
    transfer_timeout: float = 1800.0
    command_timeout: float = 300.0
    verify_timeout: float = 120.0
    server_timeout: float = 1800.0
    # Nodes where a preflight made moments ago (not a cached one) found this very code
    # snapshot: when they need no env either, there is nothing to probe or send.
    known_present: frozenset[str] = frozenset()


@dataclass
class NodePush:
    """What push did on one node. ``bytes_sent`` counts controller -> node payload bytes
    (rsync's "Total bytes sent", SFTP uploads); peer fetches cost the controller nothing."""

    node: str
    workdir: str = ""
    code_dir: str | None = None
    code_method: str | None = None  # present | rsync | sftp
    env_sha256: str | None = None
    env_dir: str | None = None
    env_method: str | None = None  # present | sftp | peer
    env_source: str | None = None  # the peer a fetched archive came from
    bytes_sent: int = 0
    nccl_version: str | None = None
    nccl_path: str | None = None
    python_version: str | None = None
    torch_version: str | None = None
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class PushReport:
    """The phase's result. ``code_dir`` is relative to each node's workdir (``code/<digest>``);
    ``code_dirs``/``env_dirs`` are absolute per node. ``env_dirs`` is None when no env was
    pushed; the run phase puts ``<env_dir>/bin`` first on PATH."""

    nodes: dict[str, NodePush]
    code_digest: str | None = None
    code_dir: str | None = None
    code_dirs: dict[str, str] = field(default_factory=dict)
    env_sha256: dict[str, str] = field(default_factory=dict)
    env_dirs: dict[str, str] | None = None
    nccl_versions: dict[str, str | None] = field(default_factory=dict)
    controller_bytes: int = 0
    archive_bytes: int = 0
    peer_fetches: int = 0
    warnings: list[str] = field(default_factory=list)  # a node's, each led by its name
    # about the code folder, before any node: files that look like checkpoints or data
    code_warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def bytes_by_node(self) -> dict[str, int]:
        return {k: v.bytes_sent for k, v in self.nodes.items()}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nodes"] = {k: v.to_dict() for k, v in self.nodes.items()}
        return d


def env_path_prefix(report: PushReport, node: str) -> str | None:
    """``<env>/bin`` to put first on PATH for ``node``'s job (None without an env)."""
    if not report.env_dirs or node not in report.env_dirs:
        return None
    return report.env_dirs[node].rstrip("/") + "/bin"
