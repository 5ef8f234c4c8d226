"""Judging raw probe outcomes into the check report: cells, mesh blame, fleet-wide rules, cache.

No network: ``build_report`` is fed the JSON a probe would print.
"""

from __future__ import annotations

import copy
import json
import os
import stat
import time

import pytest

from fleetctl.errors import ConnectError, HostKeyError
from fleetctl.node import Node
from fleetctl.phases.check.preflight import (
    CHECKS,
    CheckOptions,
    CheckReport,
    CheckResult,
    GiB,
    MeshFailure,
    PingResult,
    ProbeOutcome,
    build_report,
    cache_key,
    fleet_clock_spread,
    load_cached,
    probe_command,
    save_cached,
)
from fleetctl.plan.rankplan import NodeFacts
from fleetctl.transport.connection import SSHSettings

NOW = 1_800_000_000.0


def nodes(n: int = 3, **kw: object) -> list[Node]:
    return [Node(f"node{i}", f"10.0.0.{i}", **kw) for i in range(1, n + 1)]  # type: ignore[arg-type]


def facts(i: int, *, nic: str = "data0", mtu: int = 1500, gpus: int = 2, **over: object) -> dict:
    f = {
        "home": "/root",
        "hostname": f"node{i}",
        "python": {"version": "3.11.7", "executable": "/usr/bin/python3"},
        "workdir": "/root/.fleetctl",
        "nic": {
            "ok": True,
            "name": nic,
            "addr": f"10.1.0.{i}",
            "addrs": [f"10.1.0.{i}"],
            "mtu": mtu,
            "speed_mbps": 10000,
            "up": True,
            "loopback": False,
        },
        "gpu": {
            "present": True,
            "gpus": [
                {"index": k, "name": "NVIDIA H100", "memory": "81559 MiB", "driver": "535"}
                for k in range(gpus)
            ],
        },
        "rsync": {"present": True, "version": "3.2.7"},
        "disk": {"path": "/root/.fleetctl", "checked": "/root", "free": 50 * GiB, "writable": True},
        "ports": {},
        "env": None,
        "time": NOW,
    }
    f.update(over)
    return f


def outcome(
    i: int, f: dict | None = None, *, peers: dict | None = None, port: int = 29501, **over: object
) -> ProbeOutcome:
    f = f if f is not None else facts(i)
    o = ProbeOutcome(
        facts=f,
        received_at=NOW,
        exit_code=0,
        listener=(f["nic"]["addr"], port) if f["nic"].get("ok") else None,
        mesh={"src": f["nic"].get("addr"), "peers": peers or {}},
    )
    for k, v in over.items():
        setattr(o, k, v)
    return o


def full_mesh(names: list[str], bad: dict[tuple[str, str], dict] | None = None) -> dict:
    """peers results per source: everything ok except the (src, dst) pairs in ``bad``."""
    bad = bad or {}
    return {
        s: {
            d: {"ping": "ok", "tcp": "ok", "route_src": None, **bad.get((s, d), {})}
            for d in names
            if d != s
        }
        for s in names
    }


def judge(
    ns: list[Node],
    outs: dict,
    *,
    options: CheckOptions | None = None,
    connect_errors: dict | None = None,
    pings: dict | None = None,
    mesh: bool = True,
) -> CheckReport:
    pings = pings if pings is not None else {n.name: PingResult("ok", "0.1 ms") for n in ns}
    return build_report(
        ns,
        options or CheckOptions(),
        connect_errors=connect_errors or {},
        outcomes=outs,
        pings=pings,
        mesh_ran=mesh,
        controller_time=NOW,
    )


def good(ns: list[Node], bad: dict | None = None, **per: dict) -> dict:
    names = [n.name for n in ns]
    mesh = full_mesh(names, bad)
    return {
        n.name: outcome(i, per.get(n.name), peers=mesh[n.name]) for i, n in enumerate(ns, start=1)
    }


def failing(report: CheckReport) -> set[tuple[str, str]]:
    return {(h, c) for h, c, _ in report.failures}


def test_all_good_fleet_passes_with_facts_for_the_plan() -> None:
    ns = nodes()
    r = judge(ns, good(ns))
    assert r.ok, r.failures
    assert r.failures == [] and r.mesh_failures == [] and r.warnings == []
    assert list(r.hosts) == ["node1", "node2", "node3"]
    assert all(list(h.checks) == list(CHECKS) for h in r.hosts.values())
    assert r.facts["node2"] == NodeFacts(
        train_addr="10.1.0.2", nic="data0", gpu_count=2, gpu_names=("NVIDIA H100", "NVIDIA H100")
    )
    assert r.hosts["node1"].checks["mesh"].detail == "2/2 peers"
    assert r.homes == {"node1": "/root", "node2": "/root", "node3": "/root"}


def test_host_cut_from_data_network_fails_its_row_and_column_only() -> None:
    ns = nodes()
    cut = {"ping": "timeout", "tcp": "timed out"}
    bad = {
        (s, d): cut
        for s in ("node1", "node2", "node3")
        for d in ("node1", "node2", "node3")
        if s != d and "node2" in (s, d)
    }
    r = judge(ns, good(ns, bad))
    pairs = {(f.src, f.dst) for f in r.mesh_failures}
    assert pairs == {("node1", "node2"), ("node2", "node1"), ("node3", "node2"), ("node2", "node3")}
    assert failing(r) == {("node2", "mesh")}
    assert r.hosts["node1"].checks["mesh"].status == "ok"
    assert "except node2" in r.hosts["node1"].checks["mesh"].detail
    f = next(f for f in r.mesh_failures if (f.src, f.dst) == ("node3", "node2"))
    assert str(f) == "node3 → node2: ping timeout, TCP 29501 timed out"
    assert not r.ok


def test_a_host_whose_nic_has_no_link_fails_every_pair_untried_and_is_blamed_alone() -> None:
    """Its pairs are not tried (the probes say which end has no link): the same blame as when
    they timed out, and no ping problem of a ping that was not sent."""
    from fleetctl.phases.check.mesh import peer_list

    ns = nodes()
    there = {"ping": "not tried", "tcp": "not tried: the destination's NIC has no link"}
    here = {"ping": "not tried", "tcp": "not tried: the source's NIC has no link"}
    bad = {(s, "node2"): there for s in ("node1", "node3")}
    bad |= {("node2", d): here for d in ("node1", "node3")}
    r = judge(ns, good(ns, bad))
    assert failing(r) == {("node2", "mesh")}
    f = next(f for f in r.mesh_failures if (f.src, f.dst) == ("node3", "node2"))
    assert str(f) == "node3 → node2: TCP 29501 not tried: the destination's NIC has no link"
    assert "except node2" in r.hosts["node1"].checks["mesh"].detail
    members = {"a": ("10.0.0.1", 1), "b": ("10.0.0.2", 2)}
    assert peer_list(["a", "b"], members, {"b"}) == [
        {"name": "a", "addr": "10.0.0.1", "port": 1},
        {"name": "b", "addr": "10.0.0.2", "port": 2, "link": False},
    ]


def test_one_way_firewall_blames_both_ends_of_the_pair() -> None:
    ns = nodes()
    r = judge(ns, good(ns, {("node1", "node3"): {"tcp": "refused"}}))
    assert [str(f) for f in r.mesh_failures] == ["node1 → node3: TCP 29501 refused"]
    assert failing(r) == {("node1", "mesh"), ("node3", "mesh")}
    assert r.hosts["node2"].checks["mesh"].status == "ok"


def test_a_pair_that_fails_once_and_passes_when_measured_again_is_fine() -> None:
    """128 lab hosts at load ~30: pairs timed out in the first round and got through in the
    second, after the whole mesh's load was over; no host is called sick for them."""
    ns = nodes()
    outs = good(ns, {("node1", "node3"): {"tcp": "timed out"}})
    outs["node1"].mesh["again"] = {"node3": {"ping": "ok", "tcp": "ok", "route_src": None}}
    r = judge(ns, outs)
    assert r.ok and r.mesh_failures == [], r.failures
    assert r.hosts["node1"].checks["mesh"].detail == "2/2 peers"
    assert r.warnings == [
        "1 pair(s) failed the mesh once and passed when measured again (loaded hosts?): "
        "node1 → node3"
    ]


def test_a_pair_that_fails_both_rounds_is_blamed_by_its_second_result() -> None:
    ns = nodes()
    outs = good(ns, {("node1", "node3"): {"tcp": "timed out"}})
    outs["node1"].mesh["again"] = {"node3": {"ping": "ok", "tcp": "refused", "route_src": None}}
    r = judge(ns, outs)
    assert [str(f) for f in r.mesh_failures] == ["node1 → node3: TCP 29501 refused, measured twice"]
    assert failing(r) == {("node1", "mesh"), ("node3", "mesh")}
    assert r.hosts["node2"].checks["mesh"].status == "ok"


def test_only_the_pairs_whose_tcp_failed_are_measured_again() -> None:
    from fleetctl.phases.check.mesh import failed_pairs

    mesh = full_mesh(["a", "b", "c", "d"], {("a", "b"): {"tcp": "timed out"}})["a"]
    mesh["c"]["ping"] = "timeout"  # ping alone: a warning, TCP got through
    mesh["d"] = None
    assert failed_pairs({"peers": mesh}) == ["b", "d"]
    assert failed_pairs({"error": "no peer list"}) == []


def test_no_pair_with_an_end_whose_own_nic_is_down_is_measured_again() -> None:
    """A host whose training NIC reads as down (its own facts: no carrier) can neither send
    nor be reached: its pairs are judged by the first round (the second only waited out the
    TCP timeout again: 2 s of a cut-link check), while a pair that merely timed out between
    hosts with link is still measured again (a loaded host answers late)."""
    from fleetctl.phases.check.mesh import Rendezvous, again_pairs

    names = ["a", "b", "c", "d"]
    timed_out = {"tcp": "timed out", "ping": "timeout"}
    mesh = full_mesh(names, {("a", "b"): timed_out, ("a", "c"): timed_out})
    rv = Rendezvous(names, ready_by=0.0, mesh_wait=1.0)
    for n in names:
        rv.arrive(n, ("10.0.0.1", 29501), link_up=n != "c")
    members = rv.peers()
    assert rv.no_link == {"c"}
    assert again_pairs("a", {"peers": mesh["a"]}, members, rv.no_link) == ["b"]
    cut = {"peers": {n: timed_out for n in names if n != "c"}}
    assert again_pairs("c", cut, members, rv.no_link) == []  # its own link is down
    assert again_pairs("a", {"peers": mesh["a"]}, members, set()) == ["b", "c"]


def test_two_hosts_that_cannot_talk_both_fail() -> None:
    ns = nodes(2)
    r = judge(ns, good(ns, {("node1", "node2"): {"tcp": "timed out", "ping": "timeout"}}))
    assert failing(r) == {("node1", "mesh"), ("node2", "mesh")}


def test_ping_only_loss_is_a_warning_not_a_failure() -> None:
    ns = nodes()
    r = judge(ns, good(ns, {("node1", "node2"): {"ping": "timeout"}}))
    assert r.ok and r.mesh_failures == []
    assert r.warnings == ["node1 → node2: ping timeout (TCP 29501 ok)"]


def test_icmp_not_permitted_on_nodes_means_tcp_only() -> None:
    ns = nodes(2)
    na = {"ping": "n/a: ICMP not permitted"}
    r = judge(ns, good(ns, {("node1", "node2"): na, ("node2", "node1"): na}))
    assert r.ok
    assert "TCP only" in r.hosts["node1"].checks["mesh"].detail


def test_unreachable_host_fails_ssh_only_and_is_left_out_of_the_mesh() -> None:
    ns = nodes()
    outs = {
        "node1": outcome(1, peers=full_mesh(["node1", "node3"])["node1"]),
        "node3": outcome(3, peers=full_mesh(["node1", "node3"])["node3"]),
    }
    err = ConnectError("node2 (10.0.0.2)", "connection refused by 10.0.0.2:22")
    r = judge(ns, outs, connect_errors={"node2": err})
    assert r.failures == [("node2", "ssh", "connection refused by 10.0.0.2:22")]
    assert r.mesh_skipped == ["node2: no SSH"]
    assert r.hosts["node2"].checks["ping"].status == "ok"
    assert r.hosts["node2"].checks["gpu"].status == "skip"
    assert "node2" not in r.facts


def test_host_key_errors_carry_the_fix_in_the_reason() -> None:
    ns = nodes(1)
    err = HostKeyError("node1", "host key for 10.0.0.1:22 CHANGED", hint="ssh-keygen -R x")
    r = judge(ns, {}, connect_errors={"node1": err})
    assert r.failures == [("node1", "ssh", "host key for 10.0.0.1:22 CHANGED (ssh-keygen -R x)")]


def test_silent_controller_ping_is_a_warning_when_ssh_works_and_a_failure_when_not() -> None:
    ns = nodes(2)
    pings = {
        "node1": PingResult("noreply", "no reply to ping 10.0.0.1"),
        "node2": PingResult("noreply", "no reply to ping 10.0.0.2"),
    }
    err = ConnectError("node2", "timed out after 10s connecting to 10.0.0.2:22")
    outs = {"node1": outcome(1)}
    r = judge(ns, outs, connect_errors={"node2": err}, pings=pings)
    assert r.hosts["node1"].checks["ping"].status == "warn"
    assert failing(r) == {("node2", "ssh"), ("node2", "ping")}


def test_unresolvable_name_is_one_ssh_failure() -> None:
    ns = [Node("ghost", "no-such-host.invalid")]
    err = ConnectError("ghost", "cannot resolve host name 'no-such-host.invalid'")
    pings = {"ghost": PingResult("unresolved", "cannot resolve no-such-host.invalid")}
    r = judge(ns, {}, connect_errors={"ghost": err}, pings=pings)
    assert failing(r) == {("ghost", "ssh")}


def test_declared_gpus_must_match_nvidia_smi() -> None:
    ns = [Node("node1", "10.0.0.1", gpus=4), Node("node2", "10.0.0.2", gpus=2)]
    r = judge(ns, good(ns))
    assert r.failures == [
        ("node1", "gpu", "fleetctl_gpus=4 but nvidia-smi shows 2 (2× NVIDIA H100)")
    ]


def test_missing_nvidia_smi_is_a_cpu_node_unless_nccl() -> None:
    ns = nodes(2)
    cpu = facts(2, gpu={"present": False})
    assert judge(ns, good(ns, node2=cpu)).ok
    r = judge(ns, good(ns, node2=cpu), options=CheckOptions(backend="nccl"))
    assert failing(r) == {("node2", "gpu")}


def test_uniform_launchers_need_equal_gpu_counts() -> None:
    ns = nodes(3)
    outs = good(ns, node3=facts(3, gpus=1))
    assert judge(ns, outs).ok
    r = judge(ns, outs, options=CheckOptions(uniform_gpus=True))
    assert failing(r) == {("node3", "gpu")}
    assert "while the others have 2" in r.hosts["node3"].checks["gpu"].detail


def test_busy_master_port_fails_node0_only() -> None:
    ns = nodes(2)
    outs = good(ns, node1=facts(1, ports={"29500": "in use"}))
    r = judge(ns, outs)
    assert r.failures == [("node1", "port", "master port 29500 in use")]


def test_disk_threshold_and_env_archive_size() -> None:
    ns = nodes(1)
    low = facts(
        1,
        disk={
            "path": "/root/.fleetctl",
            "checked": "/root/.fleetctl",
            "free": 512 << 10,
            "writable": True,
        },
    )
    r = judge(ns, good(ns, node1=low), mesh=False)
    assert r.failures == [("node1", "disk", "512.0 KiB free in /root/.fleetctl, need 1.0 GiB")]
    r = judge(
        ns,
        good(ns),
        mesh=False,
        options=CheckOptions(env_archive_bytes=30 * GiB, env_dir="envs/abc"),
    )
    assert r.failures == [("node1", "disk", "50.0 GiB free in /root/.fleetctl, need 60.0 GiB")]


def test_the_embedded_local_node_needs_no_rsync() -> None:
    ns = [Node.localhost()]
    r = judge(ns, good(ns, vm=facts(1, rsync={"present": False})))
    assert r.ok, r.failures
    assert r.hosts["vm"].checks["rsync"].detail.startswith("not needed")


def test_missing_rsync_fails_that_host() -> None:
    ns = nodes(2)
    r = judge(ns, good(ns, node2=facts(2, rsync={"present": False})))
    assert r.failures == [("node2", "rsync", "rsync not found on PATH (push needs it)")]


def test_bad_nic_fails_nic_and_skips_what_depends_on_it() -> None:
    ns = nodes(2)
    down = facts(2)
    down["nic"] = {"ok": False, "name": "data0", "error": "data0 is down (no carrier)"}
    o2 = outcome(2, down, noready="data0 is down (no carrier)")
    o1 = outcome(1, peers={})
    r = judge(ns, {"node1": o1, "node2": o2})
    assert failing(r) == {("node2", "nic")}
    assert r.hosts["node2"].checks["addr"].status == "skip"
    assert r.mesh_skipped == ["node2: data0 is down (no carrier)"]
    assert r.facts["node2"].train_addr is None
    assert r.hosts["node1"].checks["mesh"] == CheckResult("skip", "no peer to test")


def test_probe_that_cannot_start_names_the_python() -> None:
    ns = [Node("node1", "10.0.0.1", python="python9")]
    o = ProbeOutcome(exit_code=127, tail="bash: line 1: python9: command not found")
    r = judge(ns, {"node1": o}, mesh=False)
    assert r.failures == [
        (
            "node1",
            "python",
            "python9 not found on the host: bash: line 1: python9: command not found",
        )
    ]
    old = ProbeOutcome(old_python="3.6.9", exit_code=9)
    assert judge(ns, {"node1": old}, mesh=False).failures[0][2] == (
        "python9 is Python 3.6.9; need ≥ 3.7"
    )


def test_clock_skew_and_mtu_mismatch_are_warnings() -> None:
    ns = nodes(3)
    outs = good(ns, node3=facts(3, nic="ib0", mtu=9000, time=NOW + 5))
    r = judge(ns, outs)
    assert r.ok
    assert r.hosts["node3"].checks["clock"].status == "warn"
    assert r.hosts["node3"].checks["nic"].status == "warn"
    assert "training NIC MTUs differ (node1 1500, node2 1500, node3 9000)" in r.warnings
    assert any(w.startswith("node3: clock: 5.0 s ahead") for w in r.warnings)


def test_nodes_each_close_to_this_machine_can_still_be_too_far_from_each_other() -> None:
    ns = nodes(3)
    outs = good(ns, node1=facts(1, time=NOW - 1.5), node3=facts(3, time=NOW + 1.5))
    r = judge(ns, outs)
    assert r.ok
    assert [r.hosts[n.name].checks["clock"].status for n in ns] == ["ok"] * 3  # each ±1.5 s
    assert (
        "node clocks differ by 3.0 s: node3 (+1.5 s) vs node1 (-1.5 s) against this machine; "
        "timestamps in merged logs will lie"
    ) in r.warnings


@pytest.mark.parametrize(
    ("offsets", "spread"),
    [
        ({}, None),
        ({"a": 9.0}, None),  # one node: nothing to compare (its own check covers it)
        ({"a": 0.5, "b": -1.4}, None),  # 1.9 s apart, limit 2
        ({"a": 0.0, "b": 2.0}, None),  # exactly the limit
        ({"a": 0.1, "b": 2.2, "c": -0.3}, "node clocks differ by 2.5 s: b (+2.2 s) vs c (-0.3 s)"),
    ],
)
def test_fleet_clock_spread(offsets: dict, spread: str | None) -> None:
    got = fleet_clock_spread(offsets, 2.0)
    assert (got is None) if spread is None else (got is not None and got.startswith(spread))


def test_env_nccl_versions_must_agree() -> None:
    ns = nodes(3)
    env = {"present": True, "python": "3.11.7", "nccl": "2.18.3", "imports": {}}
    outs = good(
        ns,
        node1=facts(1, env=env),
        node2=facts(2, env=env),
        node3=facts(3, env={**env, "nccl": "2.19.3"}),
    )
    r = judge(ns, outs, options=CheckOptions(env_dir="envs/abc"))
    assert r.failures == [("node3", "env", "NCCL 2.19.3 while the others have 2.18.3")]
    assert r.env_present == {"node1": True, "node2": True, "node3": True}


def test_report_round_trips_through_json() -> None:
    ns = nodes()
    r = judge(ns, good(ns, {("node1", "node3"): {"tcp": "refused"}}))
    data = json.loads(json.dumps(r.to_dict()))
    back = CheckReport.from_dict(data)
    assert back.to_dict() == r.to_dict()
    assert back.mesh_failures == [MeshFailure("node1", "node3", ("TCP 29501 refused",))]
    assert data["mesh_failures"][0]["text"] == "node1 → node3: TCP 29501 refused"
    assert [(f["host"], f["check"]) for f in data["failures"]] == [
        ("node1", "mesh"),
        ("node3", "mesh"),
    ]


def test_cache_keeps_only_passing_reports_privately(tmp_path, monkeypatch) -> None:
    ns = nodes()
    opts = CheckOptions(cache_dir=str(tmp_path / "c"))
    key = cache_key(ns, SSHSettings(), opts)
    ok = judge(ns, good(ns))
    ok.checked_at = time.time()
    save_cached(key, ok, opts)
    path = tmp_path / "c" / f"{key}.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700
    hit = load_cached(key, opts)
    assert hit is not None and hit.cached and hit.facts == ok.facts
    assert load_cached(key, CheckOptions(cache_dir=str(tmp_path / "c"), recheck=True)) is None
    # Different options or nodes are a different key; a stale entry is ignored.
    assert cache_key(ns, SSHSettings(), CheckOptions(rdzv_port=1234)) != key
    assert cache_key(nodes(2), SSHSettings(), opts) != key
    stale = copy.deepcopy(ok)
    stale.checked_at = time.time() - 600
    save_cached(key, stale, opts)
    assert load_cached(key, opts) is None
    bad = judge(ns, good(ns, node2=facts(2, rsync={"present": False})))
    bad.checked_at = time.time()
    save_cached("k2", bad, opts)
    assert not (tmp_path / "c" / "k2.json").exists()


def test_a_failed_check_drops_every_kept_pass_of_its_hosts(tmp_path) -> None:
    """``run`` passed (kept 120 s), then another job took a GPU of node2: ``check`` fails, and
    the next ``run`` must check again, not take the pass (seen on a real H100)."""
    ns, few = nodes(), nodes(1)
    opts = CheckOptions(cache_dir=str(tmp_path / "c"))
    run_opts = CheckOptions(cache_dir=str(tmp_path / "c"), rdzv_port=29501)
    for group, o in ((ns, run_opts), (few, opts)):
        passed = judge(group, good(group))
        passed.checked_at = time.time()
        save_cached(cache_key(group, SSHSettings(), o), passed, o)
    assert load_cached(cache_key(ns, SSHSettings(), run_opts), run_opts) is not None
    busy = judge(ns, good(ns, node2=facts(2, rsync={"present": False})))
    save_cached(cache_key(ns, SSHSettings(), opts), busy, opts)
    assert load_cached(cache_key(ns, SSHSettings(), run_opts), run_opts) is None
    assert load_cached(cache_key(few, SSHSettings(), opts), opts) is not None  # node1 alone


@pytest.mark.parametrize("python", ["python3", "/opt/conda env/bin/python"])
def test_probe_command_is_one_quoted_line(python: str) -> None:
    import shlex

    from fleetctl import remote
    from fleetctl.phases.check.preflight import BOOTSTRAP

    quoted = shlex.quote(python) if " " in python else python
    args = {"address": "10.0.0.1; rm -rf /", "nic": "$(reboot)", "workdir": "~/w $(x)"}
    argv = shlex.split(probe_command(quoted, args))
    assert argv[:4] == [python, "-S", "-c", BOOTSTRAP]  # stdlib only: no site start-up
    assert argv[4] == remote.installed_path("~/w $(x)", "probe.py")  # python expands the ~
    assert json.loads(argv[6]) == args


def test_controller_falls_back_to_tcp_when_icmp_is_not_permitted(monkeypatch) -> None:
    import socket
    import subprocess

    from fleetctl.phases.check.preflight import ping_host
    from fleetctl.remote.kit import icmp

    def no_icmp(argv, **kw):  # what ping prints without CAP_NET_RAW / ping_group_range
        return subprocess.CompletedProcess(argv, 2, b"", b"ping: socket: Operation not permitted\n")

    monkeypatch.setattr(subprocess, "run", no_icmp)
    monkeypatch.setattr(icmp, "icmp_echo", lambda *a: None)  # no ICMP socket here either
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        port = srv.getsockname()[1]
        up = ping_host(Node("n1", "127.0.0.1", port=port), SSHSettings(ssh_config="/dev/null"))
    assert up == PingResult("ok", f"TCP {port} ok (ICMP not permitted here)")


def test_controller_pings_in_process_without_a_ping_process(monkeypatch) -> None:
    """ICMP from this process (a datagram ICMP socket, or raw as root): no ``ping`` run."""
    import subprocess

    from fleetctl.phases.check.preflight import ping_host
    from fleetctl.remote.kit import icmp

    if icmp.icmp_echo("", "127.0.0.1", 2.0) is None:
        pytest.skip("this process may not send ICMP (not root, ping_group_range closed)")

    def no_ping(argv, **kw):
        raise AssertionError(f"ran {argv}")

    monkeypatch.setattr(subprocess, "run", no_ping)
    got = ping_host(Node("n1", "127.0.0.1"), SSHSettings(ssh_config="/dev/null"))
    assert got.state == "ok" and got.detail.endswith(" ms"), got
    assert icmp.icmp_echo("", "127.0.0.1", 0.0) == "timeout"  # no time left: not a reply
    assert icmp._checksum(bytes.fromhex("0800000012340001")) == 0xE5CA


def test_check_table_printed_to_a_pipe_is_not_cut_at_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.cli.render import print_check_report

    monkeypatch.delenv("COLUMNS", raising=False)
    ns = [Node(f"gpu-node-with-a-long-name-{i:02d}.example.org", f"10.0.0.{i}") for i in (1, 2)]
    outs = good(ns)
    outs[ns[1].name] = outcome(2, facts(2, gpu={"present": False, "gpus": []}))
    r = judge(ns, outs, options=CheckOptions(backend="nccl"))
    print_check_report(r)  # no console given: the one for stdout, here a pipe (capsys)
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("host"))
    assert max(len(line) for line in lines) > 80
    assert all(name in header for name in CHECKS)  # every column, none folded away
    for n in ns:  # each host on one row, its name whole, with the reasons (not symbols only)
        row = next(line for line in lines if line.startswith(n.name))
        assert "✓" in row
    assert "…" not in header


def test_the_node_torch_version_from_the_launcher_import_is_a_plan_fact() -> None:
    """The check imports the launcher's module with each node's python; torch's version then
    picks the flight recorder's variable name in the plan (torch >= 2.11: the new one)."""
    ns = nodes()
    r = judge(
        ns,
        good(
            ns,
            node1=facts(1, launcher={"module": "torch.distributed.run", "version": "2.11.0+cu130"}),
            node2=facts(2, launcher={"module": "deepspeed.launcher.runner", "version": "0.19.8"}),
            node3=facts(3, launcher={"module": "torch.distributed.run", "error": "no torch"}),
        ),
    )
    assert [r.facts[n.name].torch for n in ns] == ["2.11.0+cu130", None, None]
    back = CheckReport.from_dict(json.loads(json.dumps(r.to_dict())))
    assert back.facts["node1"].torch == "2.11.0+cu130"  # kept in the check cache too
