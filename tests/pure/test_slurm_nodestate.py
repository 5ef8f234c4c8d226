"""Slurm's node states (``scontrol show node -o``, captured from slurm-wlm 22.05.8 on the lab
after node2 stopped answering and node3 was marked DOWN) → which nodes are lost, in Slurm's
words; the poller reports each once, and only once the job has taken the word."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from fleetctl.transport.nodestate import NodeStateWatch, NodeStatus, lost_nodes, parse_show_node

CASES = Path(__file__).parent / "slurm_cases"


def test_show_node_captured_from_slurm() -> None:
    got = parse_show_node((CASES / "show_node_down.txt").read_text())
    assert got == {
        "node1": NodeStatus("node1", "ALLOCATED"),
        "node2": NodeStatus("node2", "ALLOCATED+NOT_RESPONDING"),
        "node3": NodeStatus("node3", "DOWN+NOT_RESPONDING", "Not responding"),
    }
    assert lost_nodes(got, ["node1", "node2", "node3", "node9"]) == {
        "node2": "Slurm marked node2 ALLOCATED+NOT_RESPONDING",
        "node3": "Slurm marked node3 DOWN+NOT_RESPONDING: Not responding",
    }


@pytest.mark.parametrize(
    ("state", "reason", "lost"),
    [
        ("ALLOCATED", None, False),
        ("MIXED", None, False),
        ("IDLE+COMPLETING", None, False),
        ("DOWN", "admin", True),
        ("ALLOCATED+FAIL", "bad dimm", True),
        ("down*", None, True),  # sinfo's style: * = not responding
        ("allocated*", None, True),
        ("MIXED+DRAIN", "maintenance tomorrow", False),  # an admin's drain: running jobs go on
        ("ALLOCATED+DRAIN", "Kill task failed", True),  # Slurm's drain after a failure
        ("MIXED+DRAIN", "Prolog error", True),
    ],
)
def test_which_states_lose_the_node(state: str, reason: str | None, lost: bool) -> None:
    assert (NodeStatus("n1", state, reason).lost_reason() is not None) is lost


def test_reason_with_spaces_before_another_field_and_its_stamp_dropped() -> None:
    line = (
        "NodeName=gpu07 State=MIXED+DRAIN Reason=Kill task failed [slurm@2026-01-02T03:04:05] "
        "Comment=x"
    )
    assert parse_show_node(line)["gpu07"].reason == "Kill task failed"


def test_poller_reports_each_lost_node_once_after_the_job_took_it() -> None:
    answers = [None, "NodeName=a State=ALLOCATED\nNodeName=b State=DOWN Reason=gone"]
    told: list[tuple[str, str]] = []
    taken = iter([False, True])  # b not yet started at the first word: told again

    def asker(names: Sequence[str]) -> str | None:
        assert list(names) == ["a", "b"]  # one ask for every node
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def on_lost(name: str, why: str) -> bool:
        told.append((name, why))
        return next(taken)

    w = NodeStateWatch(["a", "b", "a"], on_lost, asker=asker)
    assert w.poll() == {}  # Slurm did not answer: no verdict
    assert w.poll() == {}
    assert w.poll() == {"b": "Slurm marked b DOWN: gone"}
    assert w.poll() == {}
    assert told == [("b", "Slurm marked b DOWN: gone")] * 2
