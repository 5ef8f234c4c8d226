"""Which global rank failed first: by the node supervisors' times (``rank_exits.json``) when
they have them, else from what each launcher says (golden lines from the real launchers:
torchrun 2.13's error summary, paddle 3.3.1's ABORT line; deepspeed 0.19.8 says nothing usable)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleetctl.job.diagnose.ranks import failed_ranks

DS_LINE = (
    "[2026-11-25 18:00:14,372] [ERROR] [launch.py:259:sigkill_handler] ['/venv/bin/python', "
    "'-u', 'dsjob.py', '--local_rank=1', '--fail-rank', '3'] exits with return code = 3"
)
TORCHRUN = [
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2026-11-24_08:44:16",
    "  host      : node3",
    "  rank      : 5 (local_rank: 1)",
    "  exitcode  : -6 (pid: 80)  (SIGABRT)",
]
TORCHRUN_BOTH = [
    "Failures:",
    "[1]:",
    "  time      : 2026-11-25_19:40:02",
    "  host      : node2",
    "  rank      : 3 (local_rank: 1)",
    "  exitcode  : 1 (pid: 81)",
    "Root Cause (first observed failure):",
    "[0]:",
    "  time      : 2026-11-25_19:40:02",
    "  host      : node2",
    "  rank      : 2 (local_rank: 0)",
    "  exitcode  : -15 (pid: 80)",
]
PADDLE = [
    "ABORT!!! Out of all 4 trainers, the trainer process with rank=[2, 3] was aborted. "
    "Please check its log."
]


def result(launcher: str, tail: list[str], folder: Path, *, rank: int = 1) -> Any:
    node = SimpleNamespace(rank=rank, host="node2", folder=str(folder), exit_code=1, tail=tail)
    return SimpleNamespace(
        failed_node=node, nodes=[node], plan=SimpleNamespace(launcher=launcher, procs=2)
    )


@pytest.mark.parametrize(
    ("launcher", "tail", "exits", "want"),
    [
        ("torchrun", TORCHRUN, None, [(5, -6)]),
        ("paddle", PADDLE, None, [(2, None), (3, None)]),
        # deepspeed: the first failing rank process the node supervisor saw end. Its
        # launcher's line is no witness: it always shows the last spawned rank's argv, with
        # the code of whichever failed process it met first (seen in CI: "--local_rank=1 …
        # return code = 1" while local rank 1 had exited 3 and local rank 0 then exited 1).
        (
            "deepspeed",
            [DS_LINE.replace("= 3", "= 1")],
            [{"local": 1, "code": 3, "at": 1.0}, {"local": 0, "code": 1, "at": 2.0}],
            [(3, 3)],
        ),
        (
            "deepspeed",
            ["nothing useful"],
            [{"local": 1, "code": 0, "at": 1.0}, {"local": 0, "code": 7, "at": 2.0}],
            [(2, 7)],
        ),
        ("deepspeed", [DS_LINE], None, []),
        ("plain", ["Traceback …"], None, [(1, 1)]),
        # torchrun's summary lists the peer it stopped (seen in CI: rank 2 -15 beside rank 3's
        # exit 1), and its "first observed failure" is the lowest rank within one second: the
        # supervisor's times decide.
        (
            "torchrun",
            TORCHRUN_BOTH,
            [{"local": 1, "code": 1, "at": 5.0}, {"local": 0, "code": -15, "at": 5.1}],
            [(3, 1)],
        ),
        # ended before its launcher reaped it, but the status went unread: the launcher's code
        (
            "torchrun",
            TORCHRUN_BOTH,
            [{"local": 1, "code": None, "at": 5.0}, {"local": 0, "code": -15, "at": 5.1}],
            [(3, 1)],
        ),
        # the culprit's end went unseen: a SIGTERM is what launchers and teardown stop peers
        # with, so a stopped peer is named only when nothing else failed
        ("torchrun", TORCHRUN_BOTH, [{"local": 0, "code": -15, "at": 4.0}], [(2, -15)]),
        (
            "deepspeed",
            [],
            [{"local": 0, "code": -15, "at": 4.0}, {"local": 1, "code": -9, "at": 4.5}],
            [(3, -9)],
        ),
        # a rank that succeeded before the failure is no culprit
        (
            "paddle",
            PADDLE,
            [{"local": 0, "code": 0, "at": 1.0}, {"local": 1, "code": 6, "at": 2.0}],
            [(3, 6)],
        ),
    ],
)
def test_the_failed_rank_is_named_from_the_launchers_own_words(
    tmp_path: Path,
    launcher: str,
    tail: list[str],
    exits: list[dict[str, Any]] | None,
    want: list[tuple[int, int | None]],
) -> None:
    if exits is not None:
        (tmp_path / "rank_exits.json").write_text(json.dumps({"exits": exits}))
    got = failed_ranks(result(launcher, tail, tmp_path), [])
    assert [(f["rank"], f["exit_code"]) for f in got] == want
    assert all(f["node"] == "node2" for f in got)


def test_deepspeed_names_the_first_failing_rank_of_any_node_not_of_the_first_node_to_end(
    tmp_path: Path,
) -> None:
    """deepspeed's launcher looks at its ranks once a second, so a peer whose rank died of the
    culprit's error can end first (seen in CI): the supervisors' times decide."""
    folders = []
    for name, exits in (
        ("n1", [{"local": 1, "code": 3, "at": 10.5}, {"local": 0, "code": 1, "at": 11.2}]),
        ("n2", [{"local": 0, "code": 1, "at": 11.1}]),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank_exits.json").write_text(json.dumps({"exits": exits}))
        folders.append(str(tmp_path / name))
    first_to_end = SimpleNamespace(rank=2, host="node3", folder=folders[1], exit_code=1, tail=[])
    other = SimpleNamespace(rank=1, host="node2", folder=folders[0], exit_code=1, tail=[])
    res = SimpleNamespace(
        failed_node=first_to_end,
        nodes=[SimpleNamespace(rank=0, host="node1", folder=None), other, first_to_end],
        plan=SimpleNamespace(launcher="deepspeed", procs=2),
    )
    [got] = failed_ranks(res, [])
    assert (got["rank"], got["node"], got["exit_code"]) == (3, "node2", 3)


def test_the_node_whose_rank_failed_first_becomes_the_first_failure() -> None:
    """A peer's launcher may end first (its rank died of the culprit's error); the culprit's
    node, failed or reached by our stop before its launcher ended, takes the blame."""
    from fleetctl.job.records.state import JobState, NodeState

    for culprit_end in (NodeState.FAILED, NodeState.STOPPED):
        st = JobState(3)
        st.launch()
        for r in range(3):
            st.start(r)
        assert st.end(2, NodeState.FAILED, 10.0).first_failure
        st.end(1, culprit_end, 10.2)
        st.end(0, NodeState.STOPPED, 10.3)
        assert st.blame(1) and (st.first_failure, st.states[1]) == (1, NodeState.FAILED)
        assert st.failure_time == 10.0  # when the failure was first seen: the controller's clock
    st = JobState(2)
    st.launch()
    st.end(0, NodeState.SUCCEEDED, 1.0)
    st.end(1, NodeState.FAILED, 2.0)
    assert not st.blame(0) and st.first_failure == 1  # a node that succeeded is never blamed
    assert not st.blame(1)


GLOO_PEER_LOSS = (
    "[rank2]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "pair.cc:553] Connection closed by peer [10.213.5.12]:20908. This is typically caused by a "
    "remote worker crashing. Check\nterminate called without an active exception\n"
    "Fatal Python error: Aborted\n"
)


def test_a_rank_that_lost_its_peer_is_its_victim_even_when_it_ended_first(tmp_path: Path) -> None:
    """Seen in CI: rank 1 raised; its interpreter's teardown closed the process group, rank 2
    aborted on it ("Connection closed by peer") 0.22 s before rank 1's process exited."""
    nodes = []
    for rank, host, exits, err in (
        (1, "node2", [{"local": 0, "code": 1, "at": 9.755}], "RuntimeError: intentional\n"),
        (2, "node3", [{"local": 0, "code": -6, "at": 9.534}], GLOO_PEER_LOSS),
    ):
        d = tmp_path / f"{rank}-{host}"
        (d / "t" / "0").mkdir(parents=True)
        (d / "t" / "0" / "stderr.log").write_text("x" * 20000 + "\n" + err)
        (d / "rank_exits.json").write_text(json.dumps({"exits": exits}))
        nodes.append(SimpleNamespace(rank=rank, host=host, folder=str(d), exit_code=1, tail=[]))
    ranks = [
        {
            "rank": r,
            "node": n.host,
            "node_rank": r,
            "local_rank": 0,
            "logs": [f"{r}-{n.host}/t/0/stderr.log"],
        }
        for r, n in ((1, nodes[0]), (2, nodes[1]))
    ]
    res = SimpleNamespace(
        failed_node=nodes[1],  # its launcher ended first
        nodes=[SimpleNamespace(rank=0, host="node1", folder=None), *nodes],
        plan=SimpleNamespace(launcher="torchrun", procs=1),
        folder=str(tmp_path),
    )
    [got] = failed_ranks(res, ranks)
    assert (got["rank"], got["node"], got["exit_code"]) == (1, "node2", 1)
    # a lost peer on every failed rank (a network partition, say): the earliest end again
    (tmp_path / "1-node2" / "t" / "0" / "stderr.log").write_text(GLOO_PEER_LOSS)
    [got] = failed_ranks(res, ranks)
    assert (got["rank"], got["exit_code"]) == (2, -6)


def test_a_blamed_node_stopped_by_the_teardown_fails_with_its_ranks_exit_code(
    tmp_path: Path,
) -> None:
    """Its launcher ended by our SIGTERM, but what the summary says of it is its rank's end."""
    from fleetctl.job.records.state import NodeState
    from fleetctl.job.run.context import JobContext
    from fleetctl.job.run.finish import _blame_first_rank
    from fleetctl.job.run.job import RunOptions
    from fleetctl.node import Node
    from fleetctl.plan.rankplan import JobSpec

    nodes = [Node(name=f"node{i}", address=f"10.0.0.{i}") for i in (1, 2, 3)]
    events: list[Any] = []
    job = JobContext(
        JobSpec(script="t.py", job_id="j1"), nodes, RunOptions(runs_dir=tmp_path), events.append
    )
    st = job.state
    st.launch()
    for r in range(3):
        st.start(r)
    st.end(2, NodeState.FAILED, 10.0)
    st.end(1, NodeState.STOPPED, 10.1)
    st.end(0, NodeState.STOPPED, 10.1)
    job.sync()
    job.result.nodes[1].signal, job.result.nodes[2].exit_code = 15, 1
    job.result.failed_ranks = [{"rank": 1, "node": "node2", "node_rank": 1, "exit_code": 1}]
    _blame_first_rank(job)
    assert job.result.first_failure == 1
    assert (job.result.nodes[1].state, job.result.nodes[1].how()) == (
        NodeState.FAILED,
        "exit code 1",
    )
    assert any("node 1 is the first failure" in str(e) for e in events)
