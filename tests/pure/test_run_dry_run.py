"""``fleetctl run --dry-run``: the plan from the inventory, printed, nothing started, no network.

The ``--json`` output is a contract (``{"job_id", "nodes": [{"host", "address", "node_rank",
"nic", "argv", "env"}…]}``) other tools read, so its shape is pinned here for every launcher.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetctl.plan.launchers import LAUNCHER_NAMES
from fleetctl.testing.cli_runner import run_cli, run_cli_process

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_INVENTORY = ROOT / "inventories" / "example.yml"
SCRIPT = "examples/ddp_train.py"
JOB_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # SCRIPT is relative to the code dir, "." by default


def fleetctl(*args: str) -> tuple[int, str, str]:
    r = run_cli(*args)
    return r.exit_code, r.stdout, r.stderr


def dry_json(*args: str) -> dict[str, Any]:
    code, out, err = fleetctl("run", "--dry-run", "--json", *args)
    assert code == 0, err
    return json.loads(out)


@pytest.mark.parametrize("launcher", LAUNCHER_NAMES)
def test_example_inventory_same_ips_distinct_ranks(launcher: str) -> None:
    """Issue 2's done-when: same ips list and a distinct node_rank on every node, per launcher."""
    assert EXAMPLE_INVENTORY.is_file(), "inventories/example.yml is part of the foundation"
    plan = dry_json("-i", str(EXAMPLE_INVENTORY), "--launcher", launcher, SCRIPT)
    nodes = plan["nodes"]
    assert len(nodes) >= 2
    assert JOB_ID.match(plan["job_id"])
    assert plan["launcher"] == launcher
    assert [n["node_rank"] for n in nodes] == list(range(len(nodes)))
    assert len({n["host"] for n in nodes}) == len(nodes)
    ips = plan["ips"]
    assert len(ips) == len(nodes)
    for n in nodes:
        assert {"host", "address", "node_rank", "nic", "argv", "env"} <= n.keys()
        env = n["env"]
        assert env["FLEET_NODE_IPS"] == ",".join(ips)
        assert env["MASTER_ADDR"] == ips[0] == plan["master_addr"]
        assert env["FLEET_JOB_ID"] == plan["job_id"]
        assert env["NODE_RANK"] == env["FLEET_NODE_RANK"] == str(n["node_rank"])
        assert n["argv"][-1] == "ddp_train.py"  # relative to its own folder, the job's cwd
        assert n["cwd"].endswith("/examples") and plan["folder"] == "examples"
        if launcher == "paddle":
            assert f"--ips={','.join(ips)}" in n["argv"]
            assert f"--host={ips[n['node_rank']]}" in n["argv"]
        if launcher == "torchrun":
            assert f"--node-rank={n['node_rank']}" in n["argv"]
            assert f"--master-addr={ips[0]}" in n["argv"]
        if launcher == "deepspeed":
            assert f"--node_rank={n['node_rank']}" in n["argv"]
            assert n["files"]["hostfile"].split("\n")[: len(ips)] == [
                f"{ip} slots={plan['nproc_per_node']}" for ip in ips
            ]
        if launcher == "plain":
            assert env["RANK"] == str(n["node_rank"]) and env["WORLD_SIZE"] == str(len(nodes))


def test_default_fleet_is_this_machine() -> None:
    plan = dry_json(SCRIPT, "--epochs", "1")
    (node,) = plan["nodes"]
    assert node["node_rank"] == 0 and plan["master_addr"] == "127.0.0.1"
    assert node["argv"][0] == sys.executable
    assert node["argv"][-3] == "ddp_train.py"  # relative to its folder in the work folder
    assert node["cwd"] == node["work_dir"] + "/examples"
    assert node["work_dir"].startswith("~/.fleetctl/work/")
    assert node["argv"][-2:] == ["--epochs", "1"]


def test_everything_after_script_is_the_scripts() -> None:
    odd = ["--launcher", "plain", "--dry-run", "two words", 'it\'s "q"', "a;b", "$(id)", "--"]
    plan = dry_json("--launcher", "torchrun", SCRIPT, *odd)
    assert plan["launcher"] == "torchrun"
    assert plan["args"] == odd
    assert plan["nodes"][0]["argv"][-len(odd) :] == odd


def test_options_and_env() -> None:
    plan = dry_json(
        "--master-port",
        "29777",
        "--nproc-per-node",
        "2",
        "--env-var",
        "NCCL_DEBUG=INFO",
        "--env-var",
        "X=a=b c",
        SCRIPT,
    )
    env = plan["nodes"][0]["env"]
    assert plan["master_port"] == 29777 and env["MASTER_PORT"] == "29777"
    assert plan["nproc_per_node"] == 2 and "--nproc-per-node=2" in plan["nodes"][0]["argv"]
    assert env["NCCL_DEBUG"] == "INFO" and env["X"] == "a=b c"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bogus", SCRIPT], "unknown option '--bogus'"),
        (["no/such/script.py"], "script not found"),
        (["--env-var", "1BAD=x", SCRIPT], "--env-var"),
        (["--env-var", "FLEET_JOB_ID=x", SCRIPT], "FLEET_JOB_ID"),
        (["--launcher", "mpirun", SCRIPT], "mpirun"),
        (["--launcher", "plain", "--nproc-per-node", "4", SCRIPT], "one process per node"),
        (["--nproc-per-node", "zero", SCRIPT], "nproc-per-node"),
        (["--master-port", "70000", SCRIPT], "master-port"),
        (["--code-dir", "fleetctl", SCRIPT], "outside the code dir"),
    ],
)
def test_bad_input_exit_2(args: list[str], message: str) -> None:
    code, out, err = fleetctl("run", "--dry-run", "--json", *args)
    assert code == 2
    assert out == ""
    assert err.startswith("fleetctl: error: ") and message in err
    assert "Traceback" not in err


def test_human_output() -> None:
    code, out, err = fleetctl("run", "--dry-run", SCRIPT, "a b")
    assert code == 0, err
    assert "dry run: nothing was started" in out
    assert "torch.distributed.run" in out and "'a b'" in out


def test_console_entry_point() -> None:
    """The real ``python -m fleetctl`` process, JSON on stdout only."""
    r = run_cli_process("run", "--dry-run", "--json", SCRIPT, cwd=ROOT, timeout=60)
    assert r.exit_code == 0, r.stderr
    assert r.json["nodes"][0]["node_rank"] == 0


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--deadman", "nan"),
        ("--grace", "nan"),
        ("--lost-timeout", "inf"),
        ("--timeout", "nan"),
        ("--stall-timeout", "-inf"),
        ("--timeout", "0.5"),
        ("--connect-timeout", "inf"),
    ],
)
def test_a_duration_that_is_not_a_finite_number_in_range_is_refused(
    option: str, value: str
) -> None:
    r = run_cli("run", "--dry-run", option, value, SCRIPT)
    assert r.exit_code == 2, r.stderr
    assert r.stdout == ""
    assert option in r.stderr and "Traceback" not in r.stderr


def test_env_style_without_a_role_job_is_refused_not_ignored() -> None:
    r = run_cli("run", "--dry-run", "--env-style", "pai", SCRIPT)
    assert r.exit_code == 2 and "--env-style" in r.stderr and "--job" in r.stderr, r.stderr
