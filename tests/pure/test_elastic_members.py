"""``fleetctl status`` of a ``run --elastic`` job: the members read from job.json as the running
controller writes it (its ``nodes`` and ``membership``), and their lines (golden)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fleetctl.cli.render_summary import member_lines
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.members import members

T0 = "2026-11-29T06:00:00.000+00:00"
T_LOST = "2026-11-29T06:00:41.500+00:00"
T_LEFT = "2026-11-29T06:00:38.250+00:00"
T_JOIN = "2026-11-29T06:00:47.125+00:00"


def node(rank: int, host: str, state: str = "running", **kw: Any) -> dict[str, Any]:
    return {"rank": rank, "host": host, "state": state, "start_time": T0} | kw


def change(rank: int, left: str, joined: str | None, joined_at: str | None) -> dict[str, Any]:
    return {
        "rank": rank,
        "left": left,
        "why": "no heartbeat for 3.0 s",
        "left_at": T_LEFT,
        "lost_at": T_LOST,
        "joined": joined,
        "joined_at": joined_at,
        "seconds": None,
    }


def record(nodes: list[dict[str, Any]], membership: list[dict[str, Any]] | None) -> JobRecord:
    data: dict[str, Any] = {"job_id": "j", "status": "running", "nodes": nodes}
    if membership is not None:
        data["membership"] = membership
    return JobRecord.from_dict(data)


CASES: list[tuple[str, JobRecord, list[str]]] = [
    (
        "no change yet: every slot its first host, running since the start",
        record([node(0, "node1"), node(1, "node2"), node(2, "node3")], []),
        [
            "  members (--elastic):",
            "    slot 0  node1  running  since 2026-11-29 06:00:00",
            "    slot 1  node2  running  since 2026-11-29 06:00:00",
            "    slot 2  node3  running  since 2026-11-29 06:00:00",
        ],
    ),
    (
        "the spare is being started: joining since the loss, the lost host lost",
        record(
            [node(0, "node1"), node(1, "node2"), node(2, "node4", "pending", start_time=None)],
            [change(2, "node3", "node4", None)],
        ),
        [
            "  members (--elastic):",
            "    slot 0  node1  running  since 2026-11-29 06:00:00",
            "    slot 1  node2  running  since 2026-11-29 06:00:00",
            "    slot 2  node4  joining  since 2026-11-29 06:00:41  (spare for node3)",
            "    slot 2  node3  lost     since 2026-11-29 06:00:41  (no heartbeat for 3.0 s)",
        ],
    ),
    (
        "the spare joined, then was lost too: the second spare holds the slot",
        record(
            [node(0, "node1"), node(1, "node2"), node(2, "node5", start_time=T_JOIN)],
            [change(2, "node3", "node4", T_JOIN), change(2, "node4", "node5", T_JOIN)],
        ),
        [
            "  members (--elastic):",
            "    slot 0  node1  running  since 2026-11-29 06:00:00",
            "    slot 1  node2  running  since 2026-11-29 06:00:00",
            "    slot 2  node5  running  since 2026-11-29 06:00:47  (spare for node4)",
            "    slot 2  node4  lost     since 2026-11-29 06:00:41  (no heartbeat for 3.0 s)",
            "    slot 2  node3  lost     since 2026-11-29 06:00:41  (no heartbeat for 3.0 s)",
        ],
    ),
    (
        "no spare left, --min-nodes: the slot left, the job ended",
        record(
            [
                node(0, "node1", "succeeded", end_time=T_JOIN),
                node(1, "node2", "succeeded", end_time=T_JOIN),
                node(2, "node3", "left", end_time=T_LEFT, reason="no heartbeat for 3.0 s"),
            ],
            [change(2, "node3", None, None) | {"world": 2}],
        ),
        [
            "  members (--elastic):",
            "    slot 0  node1  succeeded  since 2026-11-29 06:00:47",
            "    slot 1  node2  succeeded  since 2026-11-29 06:00:47",
            "    slot 2  node3  left       since 2026-11-29 06:00:38  (no heartbeat for 3.0 s)",
        ],
    ),
]


@pytest.mark.parametrize(("what", "job", "want"), CASES, ids=[c[0][:40] for c in CASES])
def test_the_members_of_an_elastic_job_as_status_shows_them(
    what: str, job: JobRecord, want: list[str]
) -> None:
    found = members(job)
    assert found is not None
    assert member_lines([m.to_dict() for m in found]) == want


def test_a_run_without_elastic_has_no_members() -> None:
    job = record([node(0, "node1")], None)
    assert members(job) is None
    assert member_lines([]) == []


def test_the_summary_says_why_node_0_was_not_replaced_and_which_spares_failed_their_check(
    tmp_path: Path,
) -> None:
    from fleetctl.cli.render_summary import run_summary_lines
    from fleetctl.job.records.result import JobResult, NodeOutcome
    from fleetctl.job.records.state import JobStatus, NodeState
    from fleetctl.job.run.elastic import NODE0_LOST

    r = JobResult("j", tmp_path, status=JobStatus.FAILED, started=0.0, ended=9.0)
    r.first_failure = 0
    r.nodes = [NodeOutcome(i, f"node{i + 1}", f"10.0.0.{i + 1}") for i in range(3)]
    for n, s in zip(r.nodes, ("lost", "stopped", "stopped"), strict=True):
        n.state = NodeState(s)
    r.membership = [
        change(2, "node3", "node5", T_JOIN) | {"skipped": {"node4": "ssh: connect timed out"}},
        change(0, "node1", None, None) | {"not_replaced": NODE0_LOST},
    ]
    lines = run_summary_lines(r)
    at = lines.index("  2 lost node(s) (--elastic):")
    assert lines[at + 1 : at + 4] == [
        "  node 2: node3 lost (no heartbeat for 3.0 s); spare node5 joined",
        "    spare node4 skipped: ssh: connect timed out",
        "  node 0: node1 lost (no heartbeat for 3.0 s); not replaced: node 0 hosts the job's "
        "rendezvous store (torchrun's c10d --rdzv-endpoint) and the other nodes' agents cannot "
        "go on without it: the job ends (with --max-retries the next attempt relaunches every "
        "node, a spare in its place)",
    ]
