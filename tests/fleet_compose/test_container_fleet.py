"""The multi-host e2e path against a container fleet (``FLEETCTL_TEST_FLEET``, see conftest):
check, push, a plain 3-node run, a failing rank's teardown, a torchrun DDP (gloo) job — with
nothing but the fleet's inventory, as a developer with Docker/podman and no root network
namespaces runs them. With the default podman fleet: the network is internal (no route off
the machine) and ``down`` leaves no container or network of it (by label).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import run_cli, run_cli_process
from fleetctl.testing.infra import node_host, node_leftovers

pytestmark = [pytest.mark.lab, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

HELLO = """\
import os, socket
print("hello rank", os.environ["FLEET_NODE_RANK"], "of", os.environ["FLEET_NUM_NODES"],
      "on", socket.gethostname(), flush=True)
"""
# Rank 1 fails after 1 s; the others ignore SIGTERM and leave a child outside their session.
FAIL_ON_1 = """\
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen(["sleep", "600"], start_new_session=True)
print("up rank", os.environ["FLEET_NODE_RANK"], flush=True)
if os.environ["FLEET_NODE_RANK"] == "1":
    time.sleep(1.0)
    sys.exit(3)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("code")
    (d / "hello.py").write_text(HELLO)
    (d / "fail_on_1.py").write_text(FAIL_ON_1)
    return d


def nodes(inventory: Path) -> list[Any]:
    return list(load_inventory(str(inventory)).nodes)


def on_node(node: Any, command: str) -> Any:
    """One shell command on a node over SSH (testinfra, host key verified)."""
    return node_host(node).run(command)


def fleetctl_run(inventory: Path, runs: Path, code: Path, *args: str, launcher: str = "plain"):
    return run_cli_process(
        "run", "--inventory", str(inventory), "--launcher", launcher, "--nproc-per-node", "1",
        "--runs-dir", str(runs), "--code-dir", str(code), "--grace", "2", *args,
        cwd=ROOT, timeout=240,
    )  # fmt: skip


def only_job(runs: Path) -> dict:
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return json.loads((folder / "job.json").read_text())


def left_over(inventory: Path, job_id: str) -> dict[str, list]:
    out = {}
    for node in nodes(inventory):
        left = node_leftovers(node_host(node), job_id, workdir=node.workdir, python=node.python)
        if left.processes:
            out[node.name] = left.processes
    return out


def test_check_passes_on_every_host(fleet3) -> None:
    r = run_cli("check", "-i", str(fleet3.inventory_path))
    assert r.exit_code == 0, r.stdout + r.stderr
    assert "all 3 host(s) ready" in r.stdout + r.stderr


def test_push_ships_the_code_to_every_host(fleet3, code: Path) -> None:
    r = run_cli("push", "-i", str(fleet3.inventory_path), "--code", str(code), "--json")
    assert r.exit_code == 0, r.stdout + r.stderr
    report = r.json
    text = json.dumps(report)
    for node in nodes(fleet3.inventory_path):
        assert node.name in text
    # the snapshot the push reports is on every host, byte for byte
    digest = subprocess.run(
        ["sha256sum", str(code / "hello.py")], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    for node in nodes(fleet3.inventory_path):
        wd = node.workdir
        workdir = '"$HOME"' + shlex.quote(wd[1:]) if wd.startswith("~/") else shlex.quote(wd)
        found = on_node(node, f"find {workdir} -name hello.py -exec sha256sum {{}} +")
        assert digest in found.stdout, (node.name, found.stdout, found.stderr)


def test_a_plain_run_starts_one_rank_on_every_host(fleet3, code: Path, tmp_path: Path) -> None:
    r = fleetctl_run(fleet3.inventory_path, tmp_path, code, "--no-check", str(code / "hello.py"))
    assert r.exit_code == 0, r.stdout + r.stderr
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert f"hello rank {rank} of 3 on {host}" in r.stdout, r.stdout
    job = only_job(tmp_path)
    assert job["status"] == "succeeded"
    assert [n["exit_code"] for n in job["nodes"]] == [0, 0, 0]


def test_a_failing_rank_ends_every_process_of_the_job_on_every_host(
    fleet3, code: Path, tmp_path: Path
) -> None:
    r = fleetctl_run(
        fleet3.inventory_path, tmp_path, code, "--no-check", str(code / "fail_on_1.py")
    )
    assert r.exit_code == 3, r.stdout + r.stderr
    job = only_job(tmp_path)
    assert job["status"] == "failed"
    ff = job["first_failure"]
    assert (ff["host"], ff["rank"], ff["exit_code"]) == ("node2", 1, 3), ff
    assert re.search(r"teardown: verified: no process of job \S+ left", r.stderr), r.stderr
    assert left_over(fleet3.inventory_path, job["job_id"]) == {}


def test_a_torchrun_ddp_job_over_gloo_trains_on_every_host(fleet3, tmp_path: Path) -> None:
    r = fleetctl_run(
        fleet3.inventory_path, tmp_path, EXAMPLES,
        str(EXAMPLES / "ddp_train.py"), "--epochs", "1", "--steps", "3", launcher="torchrun",
    )  # fmt: skip
    assert r.exit_code == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in range(3):
        assert f"done rank={rank} world=3" in r.stdout, r.stdout
    assert "backend=gloo" in r.stdout
    job = only_job(tmp_path)
    assert job["status"] == "succeeded"
    assert left_over(fleet3.inventory_path, job["job_id"]) == {}


# ------------------------------------------------------------------ the podman fleet itself


def _podman_fleet(fleet3) -> Any:
    if fleet3.kind != "containers":
        pytest.skip("about the podman container fleet itself")
    return fleet3.handle


def test_the_hosts_have_no_route_off_their_network(fleet3) -> None:
    fleet = _podman_fleet(fleet3)
    for node in nodes(fleet3.inventory_path):
        routes = on_node(node, "ip -4 route show").stdout
        assert "default" not in routes, (node.name, routes)
        off = on_node(node, "ip -4 route get 192.0.2.1")  # TEST-NET-1: never sent anywhere
        assert off.rc != 0 and "unreachable" in off.stderr.lower(), (node.name, off.stderr)
    labels = subprocess.run(
        ["podman", "network", "inspect", fleet.network], capture_output=True, text=True, check=True
    )
    (info,) = json.loads(labels.stdout)
    assert info["internal"] is True and info["labels"]["fleetctl.lab"] == fleet.name


def test_down_removes_every_container_and_network_of_the_fleet_by_label(fleet3) -> None:
    _podman_fleet(fleet3)
    from fleetctl.lab.container_fleet import ContainerFleet

    other = ContainerFleet.up(1, owner="pytest")
    try:
        assert len(other.hosts) == 1
        assert on_node(nodes(other.inventory_path)[0], "hostname").stdout.strip() == "node1"
    finally:
        removed = other.down()
    assert any(x.startswith("container ") for x in removed), removed
    assert any(x.startswith("network ") for x in removed), removed
    flt = f"label=fleetctl.lab={other.name}"
    ps = subprocess.run(["podman", "ps", "-aq", "--filter", flt], capture_output=True, text=True)
    nets = subprocess.run(
        ["podman", "network", "ls", "-q", "--filter", flt], capture_output=True, text=True
    )
    assert ps.stdout.strip() == "" and nets.stdout.strip() == ""
    assert not other.dir.exists()
    # the session's fleet is untouched
    assert run_cli("check", "-i", str(fleet3.inventory_path)).exit_code == 0
