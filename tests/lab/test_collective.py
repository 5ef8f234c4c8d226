"""``check --collective`` on the lab: real gloo traffic over the data network names a host
whose data link is throttled (tc tbf, 50 Mbit/s into it) and passes a healthy lab; no rank
process is left on any host."""

from __future__ import annotations

import json

import pytest

from fleetctl.lab import Lab
from fleetctl.phases.collective import run_collective
from fleetctl.phases.collective_judge import CollectiveOptions, CollectiveReport, MiB
from fleetctl.plan.inventory import load_inventory
from fleetctl.plan.rankplan import NodeFacts
from fleetctl.ssh.connection import SSHSettings
from fleetctl.ssh.fleet import Fleet
from fleetctl.testing.cli_runner import run_cli

pytestmark = pytest.mark.lab


# The lab's links are CPU-bound (gloo on a 2-core box, every host sending at once): healthy
# links spread about 2x there, so the default 0.5 of the median would flake; the throttled
# host is ~100x below the median, named at any sane fraction.
OPTS = CollectiveOptions(size=2 * MiB, timeout=60.0, min_fraction=0.2)


def _bench(lab: Lab) -> CollectiveReport:
    """The benchmark alone over the lab's data network (the check's facts as the lab knows
    them), so this test holds the collective, not the probe."""
    nodes = load_inventory(lab.inventory_path).nodes
    facts = {h.name: NodeFacts(train_addr=h.data_addr, nic=h.data_nic) for h in lab.hosts}
    with Fleet(nodes, SSHSettings(connect_timeout=5)) as fleet:
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


def test_check_cli_collective_json(make_lab) -> None:
    lab = make_lab(3, networks=2)
    res = run_cli(
        *["check", "-i", str(lab.inventory_path), "--json", "--collective"],
        *["--collective-size", "1", "--collective-min", "0.2"],
        env={"FLEETCTL_SSH_CONFIG": "/dev/null"},
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["collective"]["ok"] and len(data["collective"]["links"]) == 3 * 2
    assert data["collective"]["allreduce"]["ranks"] == 3
