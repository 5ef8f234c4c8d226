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


def test_min_nodes_is_the_low_end_of_torchruns_node_range(tmp_path: Path) -> None:
    for np in plan(tmp_path, nodes=3, elastic=True, min_nodes=2).nodes:
        assert "--nnodes=2:3" in np.argv, np.argv


@pytest.mark.parametrize(
    ("options", "argv", "why"),
    [
        (
            {"min_nodes": 2, "nodes": 3},
            ["--min-nodes", "2", "--nodes", "3"],
            "--min-nodes 2 needs --elastic (a job without it ends when a node is lost)",
        ),
        (
            {"min_nodes": 4, "nodes": 3, "elastic": True},
            ["--min-nodes", "4", "--nodes", "3", "--elastic"],
            "--min-nodes 4 is more than --nodes 3",
        ),
    ],
)
def test_min_nodes_is_refused_alike_by_the_library_and_the_command(
    tmp_path: Path, options: dict[str, object], argv: list[str], why: str
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    fleet = Fleet(NODES, runs_dir=tmp_path / "runs")
    with pytest.raises(UsageError) as caught:
        fleet.run(str(tmp_path / "train.py"), launcher="torchrun", dry_run=True, **options)
    assert str(caught.value) == why
    res = run_cli("run", "--dry-run", *argv, "train.py", cwd=tmp_path)
    assert res.exit_code == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"fleetctl: error: {why}"], res.stderr
    assert not (tmp_path / "runs").exists()


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
        ({"elastic": True, "nodes": 2, "detach": True}, "not with --detach yet"),
        ({"elastic": True, "nodes": 1}, "needs --nodes 2 or more"),
        ({"elastic": True, "nodes": 3}, "no spare host .3 host.s.. and there is no --min-nodes"),
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


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--slurm"], "--elastic: not with --slurm yet (SSH nodes only)"),
        (["--job", "job.yaml"], "--elastic: not with a role job (--job): one torchrun world only"),
        (
            ["--detach", "train.py"],
            "--elastic: not with --detach yet (the job monitor does not replace a lost node)",
        ),
        (
            ["--launcher", "deepspeed", "train.py"],
            "--elastic: launcher deepspeed has no elastic rendezvous (torchrun only)",
        ),
    ],
)
def test_what_elastic_cannot_do_yet_is_one_line_before_any_host(
    tmp_path: Path, argv: list[str], line: str
) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yaml").write_text("roles: {}\n")
    (tmp_path / "hosts.ini").write_text(
        "node1 ansible_host=10.0.0.1\nnode2 ansible_host=10.0.0.2\n"
    )
    res = run_cli(
        "run", "-i", "hosts.ini", "--elastic", "--nodes", "2", "--dry-run", *argv, cwd=tmp_path
    )
    assert res.exit_code == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"fleetctl: error: {line}"], res.stderr
    assert not (tmp_path / "fleet-runs").exists()


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


def test_a_node_the_job_went_on_without_fails_nothing_and_is_said_in_the_summary(
    tmp_path: Path,
) -> None:
    from fleetctl.cli.render_summary import run_summary_lines
    from fleetctl.job.records.result import JobResult, NodeOutcome
    from fleetctl.job.records.state import JobState, JobStatus, NodeState
    from fleetctl.phases.collect import NodeCollect

    state = JobState(3)
    assert not state.end(2, NodeState.LEFT, 1.0).first_failure
    state.end(0, NodeState.SUCCEEDED)
    state.end(1, NodeState.SUCCEEDED)
    assert state.all_ended and state.outcome() is JobStatus.SUCCEEDED
    r = JobResult("j", tmp_path, status=JobStatus.SUCCEEDED, started=0.0, ended=9.0)
    r.nodes = [NodeOutcome(i, f"node{i + 1}", f"10.0.0.{i + 1}") for i in range(3)]
    for n, s in zip(r.nodes, state.states, strict=True):
        n.state = s
    r.nodes[2].reason = "no heartbeat for 3.0s"
    r.membership = [
        {"rank": 2, "left": "node3", "why": "no heartbeat for 3.0s", "joined": None, "world": 2}
    ]
    r.collected = [NodeCollect("node3", 2, str(tmp_path / "2-node3"), skipped="node lost")]
    assert r.exit_code == 0  # its logs were never coming home: not LOGS INCOMPLETE
    assert r.nodes[2].how() == "left (no heartbeat for 3.0s)"
    assert run_summary_lines(r)[:3] == [
        "2 of 3 nodes succeeded in 9.0 s; node 2 left the job (--min-nodes); nodes 0,1 had "
        "succeeded.",
        "  1 lost node(s) (--elastic):",
        "  node 2: node3 lost (no heartbeat for 3.0s); no spare left, went on with 2 nodes",
    ]
