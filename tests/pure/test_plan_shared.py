"""The compact ``--dry-run --json``: fleet-wide values (FLEET_NODE_IPS, paddle's ``--ips``,
deepspeed's hostfile) written once under ``shared``, so the output grows with the fleet, not
with its square; nothing lost (``--full`` and ``Plan.from_dict`` give every node back whole).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.errors import PlanError
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.job.records.runs import load_plan
from fleetctl.node import Node
from fleetctl.plan.launchers import LAUNCHER_NAMES
from fleetctl.plan.rankplan import JobSpec, Plan, make_plan
from fleetctl.plan.roles import (
    assign_ports,
    assign_tasks,
    make_role_plan,
    parse_job_file,
    port_needs,
)
from fleetctl.plan.shared import SHARED_MIN_CHARS, expand_shared, share_values
from fleetctl.testing.cli_runner import run_cli

JOB = "20261124-120000-a1b2c3"


def _addr(i: int) -> str:
    return f"10.0.{i // 250}.{i % 250 + 1}"


def _inventory(tmp_path: Path, hosts: int) -> Path:
    """``gpu0 … gpuN-1`` with their own addresses, 8 GPUs, one NIC: the 5,000-host shape."""
    lines = ["[gpu]", *(f"gpu{i} ansible_host={_addr(i)}" for i in range(hosts))]
    lines += ["", "[gpu:vars]", "fleetctl_gpus=8", "fleetctl_nic=ib0", "ansible_user=train"]
    path = tmp_path / f"hosts{hosts}.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def _dry_run(tmp_path: Path, hosts: int, launcher: str, *extra: str) -> str:
    (tmp_path / "train.py").write_text("print('hi')\n")
    inv = _inventory(tmp_path, hosts)
    r = run_cli(
        "run", "-i", str(inv), "--dry-run", "--json", "--launcher", launcher, *extra, "train.py",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    return r.stdout


def _nodes(n: int) -> list[Node]:
    return [Node(name=f"gpu{i}", address=_addr(i), gpus=8, nic="ib0") for i in range(n)]


@pytest.mark.parametrize("launcher", LAUNCHER_NAMES)
def test_dry_run_json_grows_linearly_with_the_fleet(tmp_path: Path, launcher: str) -> None:
    small = len(_dry_run(tmp_path, 200, launcher))
    large = len(_dry_run(tmp_path, 400, launcher))
    assert large / small < 2.5, (small, large)  # the full form: ~4 (every node holds every IP)


@pytest.mark.parametrize("launcher", LAUNCHER_NAMES)
def test_fleet_wide_values_are_printed_once_and_marked_on_every_node(
    tmp_path: Path, launcher: str
) -> None:
    out = _dry_run(tmp_path, 200, launcher)
    plan = json.loads(out)
    ips = ",".join(plan["ips"])
    assert plan["ips"] == [_addr(i) for i in range(200)]
    assert out.count(json.dumps(ips)) == 1  # FLEET_NODE_IPS's value: once, under shared
    assert plan["shared"]["env.FLEET_NODE_IPS"] == ips
    for n in plan["nodes"]:
        assert n["env"]["FLEET_NODE_IPS"] == {"shared": "env.FLEET_NODE_IPS"}
        assert n["env"]["NODE_RANK"] == str(n["node_rank"])  # short values stay in place
        assert n["env"]["MASTER_ADDR"] == _addr(0)
    if launcher == "paddle":
        assert out.count("--ips=") == 1
        i = plan["nodes"][0]["argv"].index({"shared": "argv.3"})
        assert plan["shared"][f"argv.{i}"] == f"--ips={ips}"
    if launcher == "deepspeed":
        hostfile = plan["shared"]["files.hostfile"]
        assert hostfile.splitlines()[199] == f"{_addr(199)} slots=8"
        assert out.count(json.dumps(hostfile)) == 1
        assert all(n["files"] == {"hostfile": {"shared": "files.hostfile"}} for n in plan["nodes"])


@pytest.mark.parametrize("launcher", LAUNCHER_NAMES)
def test_compact_and_full_dry_runs_are_the_same_plan(tmp_path: Path, launcher: str) -> None:
    compact = json.loads(_dry_run(tmp_path, 60, launcher))
    full_text = _dry_run(tmp_path, 60, launcher, "--full")
    assert "shared" in compact and '"shared"' not in full_text
    full = json.loads(full_text.replace(json.loads(full_text)["job_id"], compact["job_id"]))
    full["created"] = compact["created"]  # two invocations: two job ids, maybe two seconds
    assert expand_shared(compact) == full


@pytest.mark.parametrize("launcher", LAUNCHER_NAMES)
def test_plan_json_round_trips_in_both_forms(tmp_path: Path, launcher: str) -> None:
    plan = make_plan(_nodes(40), JobSpec(script="t.py", job_id=JOB, launcher=launcher))
    assert Plan.from_json(plan.to_json()) == plan
    assert Plan.from_json(plan.to_json(compact=True)) == plan
    assert json.loads(plan.to_json(compact=True)).get("shared")  # 40 IPs: long enough to share
    folder = RunFolder(tmp_path / JOB)
    folder.path.mkdir()
    folder.write_plan(plan.to_dict())  # plan.json stays the full form
    assert folder.load_plan().shared is None
    assert load_plan(folder) == plan


def test_plan_json_is_compact_past_256_nodes(tmp_path: Path) -> None:
    from fleetctl.job.run.prepare import FULL_PLAN_MAX_NODES, plan_document

    for n, compact in ((FULL_PLAN_MAX_NODES, False), (FULL_PLAN_MAX_NODES + 1, True)):
        plan = make_plan(_nodes(n), JobSpec(script="t.py", job_id=JOB, launcher="paddle"))
        folder = RunFolder(tmp_path / f"{JOB}-{n}")
        folder.path.mkdir()
        folder.write_plan(plan_document(plan))
        assert (folder.load_plan().shared is not None) is compact
        assert load_plan(folder) == plan


def test_a_small_fleet_prints_the_same_as_before() -> None:
    plan = make_plan(_nodes(4), JobSpec(script="t.py", job_id=JOB, launcher="paddle"))
    assert len(plan.nodes[0].env["FLEET_NODE_IPS"]) < SHARED_MIN_CHARS
    assert share_values(plan.to_dict()) == plan.to_dict()


def test_one_node_shares_nothing() -> None:
    nodes = [Node(name="solo", address="10.0.0.1", env={"BIG": "x" * 500})]
    plan = make_plan(nodes, JobSpec(script="t.py", job_id=JOB))
    assert share_values(plan.to_dict()) == plan.to_dict()


def test_only_values_equal_on_every_node_are_shared() -> None:
    nodes = _nodes(3)
    big = "y" * SHARED_MIN_CHARS
    nodes = [
        Node(name=n.name, address=n.address, env={"SAME": big, "ODD": big + n.name}) for n in nodes
    ]
    plan = make_plan(nodes, JobSpec(script="t.py", job_id=JOB, launcher="plain"))
    doc = share_values(plan.to_dict())
    assert doc["shared"] == {"env.SAME": big}
    assert [n["env"]["ODD"] for n in doc["nodes"]] == [big + n.name for n in nodes]
    assert Plan.from_dict(doc) == plan


def test_a_role_job_round_trips_compact() -> None:
    text = "roles:\n  server: {command: python3 s.py, instances: 1}\n  worker: {script: w.py}\n"
    nodes = _nodes(50)
    job = parse_job_file(text.replace("worker: {", "worker: {instances: 49, "), "job.yml")
    tasks = assign_tasks(job, nodes, {"all": tuple(n.name for n in nodes)})
    needs = port_needs(job, tasks)
    free = {n.name: [30000 + k for k in range(8)] for n in nodes}
    plan = make_role_plan(
        job, tasks, JobSpec(script="-", job_id=JOB), assign_ports(tasks, needs, free)
    )
    doc = json.loads(plan.to_json(compact=True))
    assert {"env.FLEET_NODE_IPS", "env.FLEET_HOSTS_worker"} <= doc["shared"].keys()
    # one variable per worker task, the same on every node: written once, as a family
    family = doc["shared"]["envs.FLEET_HOST_IP_worker_#"]
    assert family == {f"FLEET_HOST_IP_worker_{i}": _addr(i + 1) for i in range(49)}
    for n in doc["nodes"]:
        assert n["env"]["FLEET_HOST_IP_worker_#"] == {"shared": "envs.FLEET_HOST_IP_worker_#"}
        assert not any(k.startswith("FLEET_HOST_IP_worker_") and k[-1].isdigit() for k in n["env"])
        assert n["env"]["FLEET_HOST_IP_server_0"] == _addr(0)  # one server: no family
    assert Plan.from_dict(doc) == plan


def _role_dry_run(tmp_path: Path, workers: int) -> str:
    """An OpenPAI-style job (env_style pai) of one server and ``workers`` workers."""
    (tmp_path / "w.py").write_text("")
    (tmp_path / "job.yml").write_text(
        "env_style: pai\nroles:\n  server: {command: python3 s.py, instances: 1, ports: [http]}\n"
        "  worker: {script: w.py}\n"
    )
    inv = _inventory(tmp_path, workers + 1)
    r = run_cli("run", "-i", str(inv), "--job", "job.yml", "--dry-run", "--json", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_a_role_job_dry_run_json_grows_linearly(tmp_path: Path) -> None:
    """Every task's ``PAI_HOST_IP_<role>_<i>`` is in every node's env (OpenPAI's contract):
    printed per node that is nodes² (504 hosts: 26 MB before families were shared)."""
    small, large = _role_dry_run(tmp_path, 200), _role_dry_run(tmp_path, 400)
    assert len(large) / len(small) < 2.5, (len(small), len(large))
    doc = json.loads(large)
    assert len(doc["shared"]["envs.PAI_HOST_IP_worker_#"]) == 400
    full = expand_shared(doc)
    assert full["nodes"][3]["env"]["PAI_HOST_IP_worker_399"] == _addr(400)
    assert full["nodes"][3]["env"]["PAI_server_0_http_PORT"].isdigit()


def test_a_family_marker_must_name_a_family() -> None:
    plan = make_plan(_nodes(40), JobSpec(script="t.py", job_id=JOB))
    doc = json.loads(plan.to_json(compact=True))
    doc["shared"]["envs.X_#"] = {"X_1": 1}
    with pytest.raises(PlanError, match="shared is not an object of strings"):
        Plan.from_dict(doc)


@pytest.mark.parametrize(
    "marker",
    [{"shared": "env.NOPE"}, {"shared": 3}, {"shared": "env.FLEET_NODE_IPS", "x": 1}, {}],
)
def test_a_marker_naming_no_shared_value_is_a_plan_error(marker: dict[str, Any]) -> None:
    plan = make_plan(_nodes(40), JobSpec(script="t.py", job_id=JOB))
    doc = json.loads(plan.to_json(compact=True))
    doc["nodes"][5]["env"]["FLEET_HOST"] = marker
    with pytest.raises(PlanError, match=r"gpu5: .* names no shared value"):
        Plan.from_dict(doc)


def test_full_needs_dry_run_json(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    for args in (["--full"], ["--full", "--dry-run"], ["--full", "--json"]):
        r = run_cli("run", *args, "train.py", cwd=tmp_path)
        assert r.exit_code == 2 and "--full applies to --dry-run --json" in r.stderr, r.stderr
