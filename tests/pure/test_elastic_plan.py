"""``run --elastic`` (issue 38), what the plan says: torchrun's elastic argv and env (a c10d
rendezvous on node 0's training address, hosted by node 0's agent), a job without the option
exactly as before, and the refusals (no --nodes, a launcher without an elastic rendezvous)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.api import Fleet
from fleetctl.errors import UsageError
from fleetctl.node import Node
from fleetctl.testing.cli_runner import run_cli

NODES = [Node(f"node{i}", f"10.0.0.{i}", train_addr=f"10.1.0.{i}", gpus=0) for i in (1, 2, 3)]
STATIC = ["--rdzv-backend=static", "--node-rank=1", "--master-addr=10.1.0.1"]


def plan(tmp_path: Path, **options: object):  # type: ignore[no-untyped-def]
    (tmp_path / "train.py").write_text("print('hi')\n")
    fleet = Fleet(NODES, runs_dir=tmp_path / "runs")
    return fleet.run(
        str(tmp_path / "train.py"), launcher="torchrun", nproc_per_node=1, dry_run=True, **options
    )


def test_an_elastic_job_rendezvous_with_c10d_on_node_0_and_has_room_for_the_spares(
    tmp_path: Path,
) -> None:
    p = plan(tmp_path, nodes=2, elastic=True)
    for np in p.nodes:
        argv = list(np.argv)
        assert "--nnodes=2:3" in argv and "--rdzv-backend=c10d" in argv, argv
        assert "--rdzv-endpoint=10.1.0.1:29500" in argv and "--max-restarts=3" in argv
        assert f"--local-addr={np.train_addr}" in argv
        conf = next(a for a in argv if a.startswith("--rdzv-conf="))
        assert conf.endswith(f"is_host={'true' if np.node_rank == 0 else 'false'}"), conf
        assert "join_timeout=60" in conf and "last_call_timeout=2" in conf
        assert not any(a.startswith(("--node-rank", "--master-addr")) for a in argv)
        assert np.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_without_elastic_the_static_rendezvous_is_unchanged(tmp_path: Path) -> None:
    node = plan(tmp_path, nodes=2).nodes[1]
    assert all(a in node.argv for a in STATIC) and "--nnodes=3" in node.argv
    assert not any("rdzv-conf" in a or "local-addr" in a for a in node.argv)
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in node.env


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"elastic": True}, "--elastic needs --nodes N"),
        ({"elastic": True, "nodes": 2, "launcher": "plain"}, "launcher plain has no elastic"),
        ({"elastic": True, "nodes": 2, "detach": True}, "not with --job or --detach"),
    ],
)
def test_elastic_is_refused_where_it_cannot_work(
    tmp_path: Path, options: dict[str, object], why: str
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    fleet = Fleet(NODES, runs_dir=tmp_path / "runs")
    options = {"launcher": "torchrun", **options}
    with pytest.raises(UsageError, match=why):
        fleet.run(str(tmp_path / "train.py"), dry_run=True, **options)


def test_the_command_refuses_it_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "hosts.ini").write_text(
        "node1 ansible_host=10.0.0.1\nnode2 ansible_host=10.0.0.2\n"
    )
    res = run_cli("run", "-i", "hosts.ini", "--elastic", "--dry-run", "train.py", cwd=tmp_path)
    assert res.exit_code == 2, res.stderr
    assert (
        res.stderr.strip()
        .splitlines()[-1]
        .endswith("--elastic needs --nodes N (the hosts past N are the spares)")
    ), res.stderr
