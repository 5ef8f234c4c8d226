"""``check --collective`` on the lab: real gloo traffic over the data network names a host
whose data link is throttled (tc tbf, 50 Mbit/s into it) and passes a healthy lab; no rank
process is left on any host."""

from __future__ import annotations

import json
import threading
import time

import pytest

from fleetctl.lab import Lab
from fleetctl.phases.check.collective import run_collective
from fleetctl.phases.check.collective_judge import CollectiveReport
from fleetctl.plan.collective import CollectiveOptions, MiB
from fleetctl.plan.inventory import load_inventory
from fleetctl.plan.rankplan import NodeFacts
from fleetctl.ssh.fanout import FanOut
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.transport.connection import SSHSettings

pytestmark = pytest.mark.lab


# The verdict's default fraction (0.5): the healthy lab's CPU-bound links spread ~1.5x, the
# throttled host is ~100x below the median.
OPTS = CollectiveOptions(size=2 * MiB, timeout=60.0)


def _bench(lab: Lab) -> CollectiveReport:
    """The benchmark alone over the lab's data network (the check's facts as the lab knows
    them), so this test holds the collective, not the probe."""
    nodes = load_inventory(lab.inventory_path).nodes
    facts = {h.name: NodeFacts(train_addr=h.data_addr, nic=h.data_nic) for h in lab.hosts}
    with FanOut(nodes, SSHSettings(connect_timeout=5)) as fleet:
        return run_collective(fleet, nodes, facts, OPTS)


def _no_rank_left(lab: Lab) -> None:
    for h in lab.hosts:
        cmd = "grep -l '[f]leetctl-collective' /proc/[0-9]*/cmdline 2>/dev/null || true"
        out = lab.exec(h.name, ["sh", "-c", cmd]).stdout
        assert out.strip() == "", (h.name, out)


def test_collective_names_the_throttled_host(make_lab) -> None:
    lab = make_lab(4, networks=2)
    coll = _bench(lab)
    assert coll.ok, coll.failures
    assert set(coll.nodes) == {h.name for h in lab.hosts}
    assert coll.allreduce["busbw"] > 0 and len(coll.links) == 4 * 3
    slow = lab.hosts[2].name
    lab.slow_link(slow, "data", "50mbit")
    try:
        report = _bench(lab)
    finally:
        lab.clear_slow(slow, "data")
    assert report.failed_hosts == [slow], report.failures
    ((host, why),) = report.failures
    assert host == slow and "slow node (recv side)" in why
    assert report.nodes[slow]["recv"] < 0.01  # GB/s: 50 Mbit/s is 0.00625
    _no_rank_left(lab)


def _collective_pid(lab: Lab, host: str, within: float) -> int:
    """The pid of the collective program on ``host`` once it is loading torch (it said its
    pid before: the controller knows whom to SIGABRT)."""
    cmd = (
        "for f in $(grep -l '[f]leetctl-collective' /proc/[0-9]*/cmdline 2>/dev/null); do "
        'd=${f%/cmdline}; grep -q libtorch "$d/maps" 2>/dev/null && echo "${d#/proc/}"; '
        "done; true"
    )
    until = time.monotonic() + within
    while time.monotonic() < until:
        found = lab.exec(host, ["sh", "-c", cmd]).stdout.split()
        if found:
            return int(found[0])
    raise AssertionError(f"no collective program loading torch on {host} within {within} s")


def test_a_hung_node_is_named_alone_with_its_stacks(make_lab) -> None:
    """Item 2 of issue 29: node3's program stopped (SIGSTOP: not even its own watchdog can
    speak) is named hung — alone, though its peers' collectives stall on it and time out too —
    with every thread's stack (SIGABRT to its faulthandler); nothing is left behind."""
    lab = make_lab(3, networks=2)
    stuck = lab.hosts[2].name
    nodes = load_inventory(lab.inventory_path).nodes
    facts = {h.name: NodeFacts(train_addr=h.data_addr, nic=h.data_nic) for h in lab.hosts}
    opts = CollectiveOptions(size=2 * MiB, timeout=8.0)
    got: list[CollectiveReport] = []
    with FanOut(nodes, SSHSettings(connect_timeout=5)) as fleet:
        bench = threading.Thread(
            target=lambda: got.append(run_collective(fleet, nodes, facts, opts)), daemon=True
        )
        bench.start()
        pid = _collective_pid(lab, stuck, within=30.0)
        lab.exec(stuck, ["kill", "-STOP", str(pid)])
        bench.join(90.0)
    assert got, "the benchmark did not return in time"
    (report,) = got
    assert list(report.hung) == [stuck], report.failures
    assert report.failed_hosts == [stuck], report.failures
    stacks = report.hung[stuck]
    assert "Fatal Python error: Aborted" in stacks and "Thread 0x" in stacks, stacks
    assert "most recent call first" in stacks, stacks
    _no_rank_left(lab)


def test_check_cli_collective_json(make_lab) -> None:
    lab = make_lab(3, networks=2)
    res = run_cli(
        *["check", "-i", str(lab.inventory_path), "--json", "--collective"],
        *["--collective-size", "1"],
        env={"FLEETCTL_SSH_CONFIG": "/dev/null"},
    )
    assert res.exit_code == 0, res.stdout + res.stderr
    data = json.loads(res.stdout)
    assert data["collective"]["ok"] and len(data["collective"]["links"]) == 3 * 2
    assert data["collective"]["allreduce"]["ranks"] == 3


HELLO = "import os\nprint('hello rank', os.environ['FLEET_NODE_RANK'], flush=True)\n"


def test_run_nodes_3_collective_leaves_the_slow_host_out(make_lab, tmp_path) -> None:
    """``run --nodes 3 --collective`` on 4 hosts, one throttled (`lab fault slow`): the slow
    host is left out, the spare takes its place, the job runs on the 3 healthy hosts with
    their figures in collective.json, and nothing is left on any host."""
    lab = make_lab(4, networks=2)
    slow = lab.hosts[1].name
    where = ["lab", "fault", "--dir", str(lab.dir)]
    res = run_cli(*where, "slow", slow, "--rate", "50mbit")
    assert res.exit_code == 0 and "throttled to 50mbit" in (res.stdout + res.stderr), (
        res.stdout + res.stderr
    )
    code, runs = tmp_path / "code", tmp_path / "runs"
    code.mkdir()
    (code / "hello.py").write_text(HELLO)
    try:
        res = run_cli(
            *["run", "-i", str(lab.inventory_path), "--launcher", "plain"],
            *["--nproc-per-node", "1", "--nodes", "3", "--runs-dir", str(runs)],
            *["--code-dir", str(code), "--collective", "--collective-size", "1"],
            str(code / "hello.py"),
            env={"FLEETCTL_SSH_CONFIG": "/dev/null"},
        )
    finally:
        cleared = run_cli(*where, "clear", slow)
    assert cleared.exit_code == 0, cleared.stdout + cleared.stderr
    assert res.exit_code == 0, res.stdout + res.stderr
    assert f"{slow}: left out: collective: slow node (recv side)" in res.stderr, res.stderr
    healthy = [h.name for h in lab.hosts if h.name != slow]
    (folder,) = [p for p in runs.iterdir() if (p / "job.json").exists()]
    job = json.loads((folder / "job.json").read_text())
    assert job["status"] == "succeeded" and list(job["left_out"]) == [slow]
    assert [n["host"] for n in job["nodes"]] == healthy
    plan = json.loads((folder / "plan.json").read_text())
    assert [n["host"] for n in plan["nodes"]] == healthy
    coll = json.loads((folder / "collective.json").read_text())
    assert coll["ok"] and sorted(coll["nodes"]) == sorted(healthy)
    assert coll["allreduce"]["ranks"] == 3
    # remembered: the health ledger holds the slow host, with the collective's evidence
    listed = run_cli("health", "--json")
    assert listed.exit_code == 0, listed.stderr
    [entry] = json.loads(listed.stdout)["hosts"]
    assert entry["host"] == slow and entry["why"].startswith("collective: slow node"), entry
    _no_rank_left(lab)
    for node in load_inventory(str(lab.inventory_path)).nodes:
        left = node_leftovers(
            node_host(node), folder.name, workdir=node.workdir, python=node.python
        )
        assert not left.processes, (node.name, left.processes)
