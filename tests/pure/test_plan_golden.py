"""Golden table for the rank plan: one JSON file per case in plan_cases/.

Each case holds the input (inline Node fields, JobSpec fields, optional check-phase facts,
code dir/digest) and either the full expected plan (``expected``) or a PlanError substring
(``error``). ``FLEETCTL_REGEN_GOLDEN=1 pytest tests/pure/test_plan_golden.py`` rewrites
``expected`` from the current code; review the diff before keeping it. Without it the test
only compares. Invariants that must hold for every case are checked separately below, so a
wrongly regenerated golden still fails on them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from fleetctl.errors import PlanError
from fleetctl.node import Node
from fleetctl.plan.rankplan import JobSpec, NodeFacts, Plan, make_plan

CASES_DIR = Path(__file__).parent / "plan_cases"
CASES = sorted(CASES_DIR.glob("*.json"))
REGEN = os.environ.get("FLEETCTL_REGEN_GOLDEN") == "1"


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _node(fields: dict[str, Any]) -> Node:
    fields = dict(fields)
    for key in ("groups", "gpu_ids"):
        if key in fields:
            fields[key] = tuple(fields[key])
    return Node(**fields)


def _plan(case: dict[str, Any]) -> Plan:
    facts = {h: NodeFacts.from_dict(f) for h, f in (case.get("facts") or {}).items()}
    spec = dict(case["spec"])
    spec["args"] = tuple(spec.get("args", ()))
    spec["launcher_args"] = tuple(spec.get("launcher_args", ()))
    return make_plan(
        [_node(n) for n in case["nodes"]],
        JobSpec(**spec),
        facts=facts or None,
        code_dir=case.get("code_dir"),
        code_digest=case.get("code_digest"),
    )


def test_case_files_exist() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path: Path) -> None:
    case = _load(path)
    if "error" in case:
        with pytest.raises(PlanError) as exc:
            _plan(case)
        assert case["error"] in str(exc.value)
        assert exc.value.exit_code == 2
        assert "\n" not in str(exc.value)
        return
    got = _plan(case).to_dict()
    if REGEN:
        case["expected"] = got
        path.write_text(json.dumps(case, indent=2, ensure_ascii=False) + "\n")
    assert case["expected"] is not None, f"{path.name}: no golden yet (FLEETCTL_REGEN_GOLDEN=1)"
    assert got == case["expected"]


OK_CASES = [p for p in CASES if "error" not in _load(p)]


@pytest.mark.parametrize("path", OK_CASES, ids=[p.stem for p in OK_CASES])
def test_invariants(path: Path) -> None:
    """What every plan must satisfy, whatever the golden says."""
    case = _load(path)
    plan = _plan(case)
    spec = case["spec"]
    n = len(case["nodes"])
    assert [p.node_rank for p in plan.nodes] == list(range(n))
    assert [p.host for p in plan.nodes] == [c["name"] for c in case["nodes"]]
    assert plan.nnodes == n and plan.world_size == n * plan.procs
    assert plan.master_addr == plan.ips[0] == plan.nodes[0].train_addr
    assert list(plan.ips) == [p.train_addr for p in plan.nodes]
    user_args = list(spec.get("args", []))
    for p in plan.nodes:
        env = p.env
        assert env["FLEET_JOB_ID"] == spec["job_id"]
        assert env["FLEET_NODE_RANK"] == env["NODE_RANK"] == str(p.node_rank)
        assert env["FLEET_NODE_IPS"] == ",".join(plan.ips)
        assert env["NNODES"] == env["FLEET_NUM_NODES"] == str(n)
        for k, v in spec.get("env", {}).items():
            assert env[k] == v  # the user's --env-var always wins
        # user args: appended untouched, last in argv
        assert list(p.argv[len(p.argv) - len(user_args) :]) == user_args
        assert all(isinstance(a, str) for a in p.argv)
        assert not any("~" in a for a in p.argv)
        assert p.run_dir.endswith(f"/runs/{spec['job_id']}/{p.node_rank}-{p.host}")
    # every node runs the same command except its rank / own address (and interpreter path)
    first = plan.nodes[0].argv
    for p in plan.nodes[1:]:
        assert len(p.argv) == len(first)
        diffs = {i for i, (a, b) in enumerate(zip(first, p.argv, strict=True)) if a != b}
        allowed = {
            i
            for i, a in enumerate(p.argv)
            if "rank" in a
            or a.startswith("--host=")
            or (p.gpus and a.startswith("--devices="))  # a node's own GPU list (paddle labels)
            or f"/{p.node_rank}-{p.host}/" in a  # a file of its own run folder (launcher logs)
        }
        assert diffs <= allowed | {0}


@pytest.mark.parametrize("path", OK_CASES, ids=[p.stem for p in OK_CASES])
def test_roundtrip(path: Path) -> None:
    plan = _plan(_load(path))
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert again.to_dict() == plan.to_dict()
    assert again.spec == JobSpec(**{**plan.spec.__dict__})


def test_contract_shape() -> None:
    """The --dry-run --json contract other tools read."""
    plan = _plan(_load(CASES_DIR / "torchrun_per_host_nics.json"))
    d = json.loads(plan.to_json())
    assert isinstance(d["job_id"], str)
    for node in d["nodes"]:
        assert {"host", "address", "node_rank", "nic", "argv", "env"} <= node.keys()
        assert all(isinstance(a, str) for a in node["argv"])
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in node["env"].items())


def test_from_dict_rejects_garbage() -> None:
    with pytest.raises(PlanError):
        Plan.from_dict({"nodes": []})
    with pytest.raises(PlanError):
        Plan.from_dict({"job_id": "x", "nodes": [{"host": "a"}]})
    with pytest.raises(PlanError):
        Plan.from_json("{not json")
