"""Teardown's bookkeeping: nodes whose supervisor reported its sweep with the exit are not asked
again; the others get the stop command; lost nodes are skipped. (The lab and e2e tiers run the
real thing and check every host with testinfra.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleetctl.api.runspec import Container
from fleetctl.node import Node
from fleetctl.phases.teardown import teardown
from fleetctl.plan.rankplan import JobSpec, make_plan


class AskedFleet:
    """Only what teardown touches: the nodes and a fan-out that records who was asked."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.asked: list[str] = []

    def map(self, fn: Any, *, timeout: float, nodes: list[Node], width: int) -> dict[str, Any]:
        self.asked = [n.name for n in nodes]
        return {n.name: RuntimeError("node unreachable: connection refused") for n in nodes}


def test_reported_nodes_are_not_asked_again_and_lost_ones_are_skipped() -> None:
    nodes = [Node(f"n{i}", f"10.0.0.{i}") for i in range(1, 5)]
    plan = make_plan(nodes, JobSpec(script="t.py", job_id="j1"))
    fleet = AskedFleet(nodes)
    report = teardown(
        fleet,  # type: ignore[arg-type]
        plan,
        grace=1.0,
        pythons={n.name: "python3" for n in nodes},
        lost=["n4"],
        reported={
            "n1": {"found": [11], "killed": [], "remaining": []},
            "n2": {"found": [21, 22], "killed": [22], "remaining": [{"pid": 22, "cmd": "x"}]},
        },
    )
    assert fleet.asked == ["n3"]  # only the node that did not report (n4 is lost)
    by_host = {n.host: n for n in report.nodes}
    assert [n.host for n in report.nodes] == ["n1", "n2", "n3", "n4"]  # rank order
    assert by_host["n1"].clean and by_host["n1"].checked_by == "supervisor"
    assert by_host["n2"].remaining == [{"pid": 22, "cmd": "x"}] and not by_host["n2"].clean
    assert by_host["n3"].error == "node unreachable: connection refused"
    assert by_host["n3"].checked_by == "stop command"
    assert by_host["n4"].skipped and by_host["n4"].skipped.startswith("lost")
    assert not report.verified and report.leftovers == {"n2": [{"pid": 22, "cmd": "x"}]}


def test_when_every_node_reported_clean_nothing_is_asked_and_it_is_verified() -> None:
    nodes = [Node(f"n{i}", f"10.0.0.{i}") for i in range(1, 3)]
    plan = make_plan(nodes, JobSpec(script="t.py", job_id="j2"))
    fleet = AskedFleet(nodes)
    clean = {"found": [], "killed": [], "remaining": []}
    report = teardown(
        fleet,  # type: ignore[arg-type]
        plan,
        grace=1.0,
        pythons={n.name: "python3" for n in nodes},
        reported={"n1": clean, "n2": clean},
    )
    assert fleet.asked == [] and report.verified


def test_a_container_a_hung_runtime_left_is_an_unverified_node_named_with_its_container() -> None:
    """--image: the supervisor's exit report says its runtime did not answer (a cut call):
    the node is not verified, and its one line names the call and the container to remove;
    a succeeded job with such a node does not exit 0."""
    from fleetctl.job.records.result import JobResult
    from fleetctl.job.records.state import JobStatus
    from fleetctl.phases.teardown import containers_wait

    nodes = [Node(f"n{i}", f"10.0.0.{i}") for i in range(1, 3)]
    spec = JobSpec(
        script="t.py", job_id="j3", container=Container(image="img:1", runtime_timeout=4.0)
    )
    plan = make_plan(nodes, spec)
    assert [np.container and np.container["timeout"] for np in plan.nodes] == [4.0, 4.0]
    assert containers_wait(plan, 2.0) == 2.0 + 4 * 4.0 + 1.0  # the node's end_bound
    assert containers_wait(make_plan(nodes, JobSpec(script="t.py", job_id="j4")), 2.0) == 0.0
    hung = "podman stop: no answer within 6s"
    clean = {"found": [], "killed": [], "remaining": []}
    report = teardown(
        AskedFleet(nodes),  # type: ignore[arg-type]
        plan,
        grace=2.0,
        pythons={n.name: "python3" for n in nodes},
        reported={
            "n1": clean,
            "n2": {**clean, "containers": {"problem": hung, "hung": hung, "remaining": ["c2"]}},
        },
    )
    assert not report.verified and report.leftovers == {}
    assert report.unchecked == {
        "n2": "container not verified gone: podman stop: no answer within 6s (the container "
        "runtime hangs); fleet-j3-1 (label fleetctl.job=j3) may be left: remove it with "
        "`podman rm -f fleet-j3-1`"
    }
    result = JobResult("j3", Path("runs/j3"), JobStatus.SUCCEEDED, teardown=report)
    assert result.exit_code == 3
