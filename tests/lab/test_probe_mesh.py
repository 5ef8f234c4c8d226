"""The probe's mesh test (``fleetctl.remote.programs.probe.mesh``) run on a lab host against real
kernels.

A peer whose address resolution ran out while it was unreachable leaves a stale neighbour
entry behind: the kernel fails the next packets queued on it with "No route to host" although
the peer answers again. The mesh must see through that, and still fail a link that is down.
Traffic goes only between the hosts of a private 2-host lab, over its data network.
"""

from __future__ import annotations

import json

import pytest

from fleetctl import remote
from fleetctl.lab import Lab

pytestmark = pytest.mark.lab

# The probe and the node modules it imports come on stdin ([stem, source] pairs, each after
# what it imports), as `fleetctl check` bundles them: the lab host cannot import fleetctl (a
# checkout under /tmp is hidden by the host's private /tmp).
MESH = (
    "import json, sys, types\n"
    "for k, v in json.loads(sys.stdin.read()):\n"
    "    m = sys.modules[k] = types.ModuleType(k)\n"
    "    if v is None:\n"
    "        m.__path__, m.__package__ = [], k\n"
    "    else:\n"
    "        m.__package__ = k.rpartition('.')[0]\n"
    "        exec(compile(v, k + '.py', 'exec'), m.__dict__)\n"
    f"probe = sys.modules[{remote.module_name('probe.py')!r}]\n"
    "src, dst = sys.argv[1:3]\n"
    "out = probe.mesh(src, [{'name': 'peer', 'addr': dst, 'port': 22}], float(sys.argv[3]))\n"
    "print(json.dumps(out['peers']['peer']))\n"
)


def run_mesh(lab: Lab, timeout: float) -> dict:
    a, b = lab.hosts
    argv = [lab.state["python"], "-c", MESH, a.data_addr or "", b.data_addr or "", str(timeout)]
    mods = remote.modules("probe.py")
    source = json.dumps([[p, None] for p in remote.packages(mods)] + list(mods.items()))
    r = lab.exec(a.name, argv, input=source, timeout=30, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_mesh_gets_through_a_stale_neighbour_entry_but_not_a_cut_link(make_lab) -> None:  # type: ignore[no-untyped-def]
    lab = make_lab(2, networks=2)
    a, b = lab.hosts
    assert a.data_nic and b.data_nic and b.data_addr
    # node1 sends one ARP probe and gives up after 2.5 s, so the entry stays stale a while.
    knobs = [f"net.ipv4.neigh.{a.data_nic}.{k}" for k in ("mcast_solicit", "retrans_time_ms")]
    lab.exec(a.name, ["sysctl", "-qw", f"{knobs[0]}=1", f"{knobs[1]}=2500"], check=True)
    lab.exec(b.name, ["ip", "link", "set", "dev", b.data_nic, "arp", "off"], check=True)
    ping = lab.exec(a.name, ["ping", "-n", "-c1", "-W1", b.data_addr], timeout=10)
    assert ping.returncode != 0  # node2 ignored the ARP request
    lab.exec(b.name, ["ip", "link", "set", "dev", b.data_nic, "arp", "on"], check=True)
    states = lab.exec(a.name, ["ip", "-j", "neigh", "show", "to", b.data_addr], check=True).stdout
    assert [s for e in json.loads(states) for s in e["state"]] == ["INCOMPLETE"]
    # node2 answers again; the first packets die with the stale entry, later ones get through.
    res = run_mesh(lab, 6.0)
    assert (res["ping"], res["tcp"]) == ("ok", "ok"), res

    lab.cut_link(b.name, "data")  # honest: a link that is down still fails both tests
    res = run_mesh(lab, 2.0)
    assert res["tcp"] in ("timed out", "unreachable"), res
    assert res["ping"] == "timeout", res


def test_a_sparse_mesh_on_eight_hosts_tests_fewer_pairs_and_still_names_a_cut_host(
    make_lab,  # type: ignore[no-untyped-def]
) -> None:
    """``check --mesh sparse`` (what ``auto`` does past 32 hosts) on real hosts: each tests 5
    of its 7 peers, the healthy lab passes, and when node5 can no longer send to any peer on
    the data network (its NIC still up: a blackhole route per peer) node5 alone fails the
    mesh, every failing pair being one of its own."""
    from fleetctl.phases.check.mesh_plan import mesh_peers
    from fleetctl.testing.cli_runner import run_cli

    lab = make_lab(8, networks=2)
    args = ["check", "-i", str(lab.inventory_path), "--mesh", "sparse", "--json", "--recheck"]
    ok = run_cli(*args)
    report = json.loads(ok.stdout)
    assert ok.exit_code == 0, ok.stdout + ok.stderr
    assert all(h["checks"]["mesh"]["detail"].endswith("peers") for h in report["hosts"])
    plan = mesh_peers([h.name for h in lab.hosts], "sparse")
    assert all(len(p) == 5 for p in plan.values())
    for h in lab.hosts:
        if h.name != "node5":
            lab.exec("node5", ["ip", "route", "add", "blackhole", f"{h.data_addr}/32"], check=True)
    bad = run_cli(*args)
    report = json.loads(bad.stdout)
    assert bad.exit_code == 3
    assert {(f["host"], f["check"]) for f in report["failures"]} == {("node5", "mesh")}, report
    pairs = {(f["src"], f["dst"]) for f in report["mesh_failures"]}
    assert pairs and all("node5" in p for p in pairs)
    assert pairs <= {(s, d) for s, ps in plan.items() for d in ps}  # only the planned pairs
