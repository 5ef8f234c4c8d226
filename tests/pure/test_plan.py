"""Unit tests for the plan helpers and launcher registry (the golden table covers whole plans)."""

from __future__ import annotations

from datetime import datetime, timezone

import click
import pytest

from fleetctl.errors import PlanError
from fleetctl.node import Node
from fleetctl.plan.launchers import LAUNCHER_NAMES, LAUNCHERS, build_argv, get_launcher
from fleetctl.plan.launchers.base import path_from
from fleetctl.plan.names import format_job_id
from fleetctl.plan.rankplan import JobSpec, NodeFacts, make_plan
from fleetctl.testing.pytest_plugin import import_or_skip

JOB = "20261122-001500-a1b2c3"


def _nodes(n: int = 2, **kw: object) -> list[Node]:
    return [Node(name=f"gpu{i:02d}", address=f"10.0.0.{i}", **kw) for i in range(1, n + 1)]


@pytest.mark.parametrize(
    ("cwd", "target", "want"),
    [
        ("~/.fleetctl/runs/j", "~/.fleetctl/code/d/train.py", "../../code/d/train.py"),
        ("~/.fleetctl/runs/j", "~/miniconda/bin/python", "../../../miniconda/bin/python"),
        ("~/.fleetctl/runs/j", "/opt/env/bin/python", "/opt/env/bin/python"),
        ("/scratch/runs/j", "/scratch/code/d/t.py", "/scratch/code/d/t.py"),
        ("/scratch/runs/j", "~/code/t.py", "~/code/t.py"),
        ("~/.fleetctl/runs/j", "~/.fleetctl/runs/j/hostfile", "hostfile"),
    ],
)
def test_path_from(cwd: str, target: str, want: str) -> None:
    assert path_from(cwd, target) == want


def test_format_job_id() -> None:
    now = datetime(2026, 11, 22, 3, 4, 5, tzinfo=timezone.utc)
    assert format_job_id(now, "0a1b2c") == "20261122-030405-0a1b2c"
    with pytest.raises(PlanError):
        format_job_id(now, "XYZ")


def test_registry_has_every_launcher() -> None:
    assert set(LAUNCHER_NAMES) == {"torchrun", "paddle", "deepspeed", "plain", "accelerate"}
    assert all(LAUNCHERS[name].name == name for name in LAUNCHER_NAMES)
    with pytest.raises(PlanError) as exc:
        get_launcher("horovodrun")
    assert exc.value.exit_code == 2 and "torchrun" in str(exc.value)


def test_build_argv_matches_plan() -> None:
    plan = make_plan(_nodes(), JobSpec(script="t.py", job_id=JOB, args=("x",)))
    for node in plan.nodes:
        assert tuple(build_argv("torchrun", plan.context, node)) == node.argv


def test_script_is_normalised_and_confined() -> None:
    plan = make_plan(_nodes(1), JobSpec(script="./src/../t.py", job_id=JOB))
    assert plan.script == "t.py"
    for bad in ("/abs/t.py", "../t.py", "", "."):
        with pytest.raises(PlanError):
            make_plan(_nodes(1), JobSpec(script=bad, job_id=JOB))


def test_jobspec_copies_args_and_env() -> None:
    args = ["a b"]
    env = {"K": "v"}
    spec = JobSpec(script="t.py", job_id=JOB, args=args, env=env)  # type: ignore[arg-type]
    args.append("late")
    env["K"] = "changed"
    assert spec.args == ("a b",) and spec.env == {"K": "v"}


def test_facts_for_unknown_hosts_are_ignored_and_partial_facts_merge() -> None:
    nodes = _nodes(2, nic="eth0", gpus=2)
    facts = {"gpu01": NodeFacts(nic="ib0"), "other": NodeFacts(train_addr="1.2.3.4")}
    plan = make_plan(nodes, JobSpec(script="t.py", job_id=JOB), facts=facts)
    assert [n.nic for n in plan.nodes] == ["ib0", "eth0"]
    assert plan.ips == ("10.0.0.1", "10.0.0.2") and plan.procs == 2


def test_a_plan_answers_to_plan_json_names_too() -> None:
    """A dry run's Plan, as library callers read it: ``master_port``/``nproc_per_node`` are
    the resolved ``rdzv_port``/``procs`` (the request "auto" and a moved port resolved)."""
    spec = JobSpec(script="t.py", job_id=JOB, rdzv_port=29611)
    plan = make_plan(_nodes(2, gpus=4), spec)
    assert (plan.master_port, plan.nproc_per_node) == (plan.rdzv_port, plan.procs) == (29611, 4)
    assert plan.to_dict()["master_port"] == 29611 and plan.to_dict()["nproc_per_node"] == 4


def test_bad_master_port_and_nproc() -> None:
    for kw in (
        {"rdzv_port": 0},
        {"rdzv_port": 70000},
        {"procs": 0},
        {"procs": "many"},
        {"backend": "mpi"},
    ):
        with pytest.raises(PlanError):
            make_plan(_nodes(1), JobSpec(script="t.py", job_id=JOB, **kw))  # type: ignore[arg-type]


def test_no_nodes() -> None:
    with pytest.raises(PlanError, match="no nodes"):
        make_plan([], JobSpec(script="t.py", job_id=JOB))


def test_torchrun_argv_parses_with_real_torchrun() -> None:
    """The flags we emit are ones torch's own torchrun parser accepts, with the values we mean."""
    run = import_or_skip("torch.distributed.run", "torch is not installed")
    plan = make_plan(_nodes(3, gpus=2), JobSpec(script="t.py", job_id=JOB, args=("--nnodes=9",)))
    node = plan.nodes[2]
    assert node.argv[1:3] == ("-m", "torch.distributed.run")
    a = run.get_args_parser().parse_args(list(node.argv[3:]))
    assert (a.nnodes, a.node_rank, a.nproc_per_node) == ("3", 2, "2")
    assert (a.rdzv_backend, a.master_addr, a.master_port) == ("static", "10.0.0.1", 29500)
    assert a.training_script == "t.py"  # the work folder's copy, run from the work folder
    assert a.training_script_args == ["--nnodes=9"]


def test_cli_value_parsers() -> None:
    from fleetctl.cli.run_cmd import NprocType, new_job_id, parse_env_vars

    t = NprocType()
    assert t.convert("auto", None, None) == "auto"
    assert t.convert("4", None, None) == 4
    for bad in ("0", "-1", "x"):
        with pytest.raises(click.BadParameter):
            t.convert(bad, None, None)
    assert parse_env_vars(("A=1", "B=x=y", "A=2", "E=")) == {"A": "2", "B": "x=y", "E": ""}
    for bad in ("NOEQ", "1A=x", "=x"):
        with pytest.raises(click.BadParameter):
            parse_env_vars((bad,))
    jid = new_job_id(datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc))
    assert jid.startswith("20260102-030405-") and len(jid) == 22
