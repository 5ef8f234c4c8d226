"""fleetctl.ssh.execute without SSH: local nodes (LocalConnection), exit codes, grouping."""

from __future__ import annotations

import threading

import pytest

from fleetctl.errors import UsageError
from fleetctl.node import Node
from fleetctl.ssh.execute import ExecResult, NodeRun, command_line, execute, group_identical
from fleetctl.ssh.fleet import Fleet


def local_fleet(*names: str) -> Fleet:
    return Fleet([Node(name=n, address="127.0.0.1", local=True) for n in names])


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["hostname"], "hostname"),
        (["echo $HOME | wc -c"], "echo $HOME | wc -c"),
        (["echo", "a b;c"], "echo 'a b;c'"),
        (["printf", "%s", "$HOME", "*"], "printf %s '$HOME' '*'"),
    ],
)
def test_command_line(argv: list[str], line: str) -> None:
    assert command_line(argv) == line


@pytest.mark.parametrize("argv", [[], [""], ["  "]])
def test_command_line_rejects_empty(argv: list[str]) -> None:
    with pytest.raises(UsageError):
        command_line(argv)


def test_execute_keeps_every_node_in_rank_order_and_reports_each_once() -> None:
    seen: list[str] = []
    active = 0
    overlap = False
    guard = threading.Lock()

    def on_result(run: NodeRun) -> None:
        nonlocal active, overlap
        with guard:
            active += 1
            overlap = overlap or active > 1
        seen.append(run.node)
        with guard:
            active -= 1

    with local_fleet("c", "a", "b") as fleet:
        result = execute(fleet, command_line(["echo", "a b;c"]), timeout=10, on_result=on_result)
    assert [r.node for r in result.runs] == ["c", "a", "b"]
    assert sorted(seen) == ["a", "b", "c"] and not overlap
    assert all(r.ok and r.stdout == "a b;c\n" and r.exit_code == 0 for r in result.runs)
    assert result.ok and result.exit_code() == 0 and result.exit_code(max_rc=True) == 0


def test_failures_exit_3_or_the_largest_remote_code() -> None:
    with local_fleet("n1", "n2") as fleet:
        result = execute(fleet, "echo oops >&2; exit 7", timeout=10)
    assert not result.ok
    assert [r.status for r in result.runs] == ["exit 7", "exit 7"]
    assert all(r.stderr == "oops\n" for r in result.runs)
    assert result.exit_code() == 3
    assert result.exit_code(max_rc=True) == 7


def test_timeout_is_a_per_node_error() -> None:
    with local_fleet("n1") as fleet:
        result = execute(fleet, "sleep 5", timeout=0.3)
    (run,) = result.runs
    assert run.exit_code is None and run.error is not None and "timed out" in run.error
    assert result.exit_code() == 3 and result.exit_code(max_rc=True) == 255


def test_exit_code_with_an_unreachable_node() -> None:
    runs = (
        NodeRun("a", "a", 0, "x\n"),
        NodeRun("b", "b", None, error="b: connection refused by 10.0.0.2:22"),
        NodeRun("c", "c", 4),
    )
    res = ExecResult("hostname", runs, 0.1)
    assert res.exit_code() == 3
    assert res.exit_code(max_rc=True) == 255
    assert [r.node for r in res.failed] == ["b", "c"]
    d = res.to_dict()
    assert d["exit_code"] == 3 and d["nodes"][1]["error"].endswith("refused by 10.0.0.2:22")


def test_group_identical_folds_same_output_and_status() -> None:
    runs = [
        NodeRun("n1", "n1", 0, "same\n"),
        NodeRun("n2", "n2", 0, "other\n"),
        NodeRun("n3", "n3", 0, "same\n"),
        NodeRun("n4", "n4", 1, "same\n"),
    ]
    groups = group_identical(runs)
    assert [(names, r.stdout, r.status) for names, r in groups] == [
        (["n1", "n3"], "same\n", "ok"),
        (["n2"], "other\n", "ok"),
        (["n4"], "same\n", "exit 1"),
    ]
