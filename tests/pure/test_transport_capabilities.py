"""What each transport answers where callers used to test its kind: the ping target, rsync's
reach, what connect.json keeps, a health source beside the connection, a remembered home, a
push's upload with progress. Pure: no SSH is dialled, no srun step runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetctl.node import Node
from fleetctl.transport.connection import (
    PingTarget,
    SSHSettings,
    reach_fields,
    reached_vars,
    transport,
)
from fleetctl.transport.local import LocalConnection
from fleetctl.transport.nodestate import NodeStateWatch
from fleetctl.transport.openssh import RsyncTarget
from fleetctl.transport.srun import SrunConnection, srun_vars
from fleetctl.transport.ssh import SSHConnection

SETTINGS = SSHSettings(ssh_config="/dev/null")
LOCAL = Node.localhost()
SRUN = Node("c1", "c1", vars=srun_vars("42"))
SSH = Node("n1", "10.9.0.5", port=2222, user="u")
JUMPED = Node("n2", "10.9.0.6", proxy_jump="bastion")

# node, its transport, where the controller pings it, rsync, what connect.json keeps
CASES = [
    (LOCAL, LocalConnection, PingTarget(skip="local"), True, {}),
    (SRUN, SrunConnection, PingTarget(skip="reached by srun"), False, {"slurm_job": "42"}),
    (SSH, SSHConnection, PingTarget("10.9.0.5", 2222), True, {}),
    (JUMPED, SSHConnection, PingTarget(skip="behind a jump host"), True, {}),
]


@pytest.mark.parametrize(("node", "cls", "ping", "rsync", "kept"), CASES, ids=lambda x: None)
def test_each_transport_answers_for_its_nodes(
    node: Node, cls: type, ping: PingTarget, rsync: bool, kept: dict[str, str]
) -> None:
    assert transport(node) is cls
    assert cls.ping_target(node, SETTINGS) == ping
    assert cls.can_rsync is rsync
    assert cls.can_join_elastic is not kept  # a Slurm node's membership is Slurm's
    assert cls.can_prove_post_mortem is not kept  # and Slurm's word on it is the proof
    assert reach_fields(node) == kept
    # read back from connect.json: the same transport, the same Slurm job
    assert transport(Node(node.name, node.address, vars=reached_vars(kept))) is (
        SrunConnection if kept else SSHConnection
    )


def test_only_a_slurm_node_has_a_health_source_beside_its_connection() -> None:
    assert LocalConnection.watch_health(["a"], lambda n, why: True) is None
    assert SSHConnection.watch_health(["a"], lambda n, why: True) is None
    watch = SrunConnection.watch_health(["c1", "c2"], lambda n, why: True)
    try:  # it asks scontrol only after its first interval: stopped before that
        assert isinstance(watch, NodeStateWatch) and watch.names == ["c1", "c2"]
    finally:
        assert watch is not None
        watch.stop()


def test_a_remembered_home_saves_the_srun_step_that_would_ask_for_it() -> None:
    conn = SrunConnection(SRUN)
    conn.remember_home("/home/probe-said")  # no srun on PATH is needed from here
    assert conn.expand("~/w") == "/home/probe-said/w"
    local = LocalConnection(LOCAL)
    local.remember_home("/elsewhere")  # nothing to save: the real home stays
    assert local.home == os.path.expanduser("~")


def test_the_local_node_copies_with_progress_and_rsyncs_folder_to_folder(tmp_path: Path) -> None:
    src = tmp_path / "archive"
    src.write_bytes(os.urandom((3 << 20) + 5))
    dest = tmp_path / "envs" / "a.archive"
    dest.parent.mkdir()
    seen: list[tuple[int, int]] = []
    LocalConnection(LOCAL).upload(src, str(dest), lambda done, total: seen.append((done, total)))
    assert dest.read_bytes() == src.read_bytes()
    assert not dest.with_name("a.archive.part").exists()
    size = src.stat().st_size
    assert [d for d, _ in seen] == [1 << 20, 2 << 20, 3 << 20, size]
    assert {t for _, t in seen} == {size}
    assert LocalConnection(LOCAL).rsync_target("/w/code/x/") == RsyncTarget((), "/w/code/x/")
    with pytest.raises(NotImplementedError, match="rsync cannot reach"):
        SrunConnection(SRUN).rsync_target("/w/code/x/")
