"""The post-mortem names the sick host, not the rank that noticed first."""

from __future__ import annotations

from fleetctl.job.diagnose.culprit import culprits
from fleetctl.phases.check.report import CheckReport, CheckResult, HostReport, MeshFailure


def report(names: list[str], cut: str | None = None, cells=None) -> CheckReport:
    hosts = {n: HostReport(n, n, {"ssh": CheckResult("ok", "ok")}) for n in names}
    for host, check, why in cells or []:
        hosts[host].checks[check] = CheckResult("fail", why)
    mesh = []
    if cut:
        for other in names:
            if other != cut:
                mesh += [
                    MeshFailure(other, cut, ("tcp timeout",)),
                    MeshFailure(cut, other, ("tcp timeout",)),
                ]
    return CheckReport(hosts=hosts, mesh_failures=mesh)


def test_the_host_in_every_failed_pair_is_the_one_whose_link_is_down() -> None:
    assert culprits(report(["node1", "node2", "node3", "node4"], cut="node3")) == [
        "node3: data link down (no peer reaches it on the training network)"
    ]


def test_host_level_failures_are_named_with_their_check_and_ports_are_not() -> None:
    cells = [("node2", "ssh", "connection refused"), ("node1", "port", "29500 in use")]
    assert culprits(report(["node1", "node2", "node3"], cells=cells)) == [
        "node2: ssh: connection refused"
    ]


def test_a_healthy_fleet_has_no_culprit() -> None:
    assert culprits(report(["node1", "node2"])) == []
