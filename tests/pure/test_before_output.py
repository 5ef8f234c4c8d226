"""``run --before``'s task output: every line handed on with the node it came from (fabric's
streams and the task's own prints), never raw to the terminal (issue 40)."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from fleetctl.api import before
from fleetctl.job.run.beforelog import BEFORE_OUTPUT
from fleetctl.node import Node


class FakeConn:
    """What a task sees of a Connection here: its host and ``config.run`` streams."""

    def __init__(self, node: Node) -> None:
        self.host = node.name
        self.config = SimpleNamespace(run={"out_stream": None, "err_stream": None})

    def run(self, text: str) -> None:  # as invoke writes a command's output: in pieces
        out, err = self.config.run["out_stream"], self.config.run["err_stream"]
        (out or sys.stdout).write(text[:3])
        (out or sys.stdout).write(text[3:] + "\n")
        (err or sys.stderr).write(f"warn from {self.host}\r\nno newline at the end")

    def close(self) -> None:
        pass


def _task(c: Any) -> None:
    print("starting on", c.host)
    c.run(f"fetched by {c.host}")


@pytest.fixture
def nodes(monkeypatch: pytest.MonkeyPatch) -> list[Node]:
    monkeypatch.setattr("fleetctl.api.group.group", lambda ns, settings: [FakeConn(n) for n in ns])
    return [Node(name=f"node{i}", address=f"10.0.0.{i}") for i in (1, 2)]


def test_each_line_of_a_task_goes_to_the_sink_with_its_node(
    nodes: list[Node], capsys: pytest.CaptureFixture[str]
) -> None:
    got: list[tuple[int, str]] = []
    token = BEFORE_OUTPUT.set(lambda i, line: got.append((i, line)))
    try:
        before.run_task(before.BeforeTask("fabfile.py:prepare", _task), nodes, None)
    finally:
        BEFORE_OUTPUT.reset(token)
    for i, n in enumerate(nodes):
        assert [line for j, line in got if j == i] == [
            f"starting on {n.name}",
            f"fetched by {n.name}",
            f"warn from {n.name}",
            "no newline at the end",
        ]
    out = capsys.readouterr()
    assert out.out == out.err == ""  # nothing raw
    assert not isinstance(sys.stdout, before._ThreadRouted)  # and stdout is given back


def test_without_a_sink_a_task_writes_where_fabric_does(
    nodes: list[Node], capsys: pytest.CaptureFixture[str]
) -> None:
    before.run_task(before.BeforeTask("fabfile.py:prepare", _task), nodes, None)
    out = capsys.readouterr().out
    assert "starting on node1" in out and "fetched by node2" in out
