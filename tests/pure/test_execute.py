"""fleetctl.ssh.execute without SSH: local nodes (LocalConnection), exit codes, grouping."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from fleetctl.errors import UsageError
from fleetctl.node import Node
from fleetctl.ssh.execute import (
    TIMEOUT_BIN,
    ExecResult,
    NodeRun,
    command_line,
    execute,
    group_identical,
)
from fleetctl.ssh.fanout import FanOut


def local_fleet(*names: str) -> FanOut:
    return FanOut([Node(name=n, address="127.0.0.1", local=True) for n in names])


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
    assert result.ok and result.exit_code == 0 and result.max_rc == 0


def test_failures_exit_3_or_the_largest_remote_code() -> None:
    with local_fleet("n1", "n2") as fleet:
        result = execute(fleet, "echo oops >&2; exit 7", timeout=10)
    assert not result.ok
    assert [r.status for r in result.runs] == ["exit 7", "exit 7"]
    assert all(r.stderr == "oops\n" for r in result.runs)
    assert result.exit_code == 3
    assert result.max_rc == 7


def _sleeping(seconds: str) -> list[int]:
    """Pids of ``sleep SECONDS`` processes (a value no other test uses)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if argv == [b"sleep", seconds.encode()]:
            pids.append(int(name))
    return pids


def test_timeout_stops_the_command_and_its_children_and_exits_124() -> None:
    secs = f"{300 + os.getpid() % 1000 / 1000:.3f}"  # unique to this test process
    cmd = f"echo started; sleep {secs} & setsid sleep {secs} & sleep {secs}; wait"
    with local_fleet("n1") as fleet:
        result = execute(fleet, cmd, timeout=0.5)
    (run,) = result.runs
    assert run.timed_out and run.exit_code is None and run.stdout == "started\n"
    assert run.error is not None and run.error.startswith("timed out after 0.5s: ")
    assert "process(es) stopped with SIGTERM" in run.error and "still running" not in run.error
    assert run.stderr == ""  # the node's time-out line became the error, not output
    assert result.exit_code == 124 and result.max_rc == 124
    assert result.to_dict()["nodes"][0]["timed_out"] is True
    assert _sleeping(secs) == []  # the shell, its child and the setsid escapee are all gone


def test_a_command_that_ends_in_time_keeps_its_own_status_and_stderr() -> None:
    with local_fleet("n1") as fleet:
        result = execute(fleet, "echo err >&2; kill -TERM $$", timeout=30)
    (run,) = result.runs
    assert not run.timed_out and run.exit_code == 143 and run.stderr == "err\n"
    assert result.exit_code == 3


def test_exit_code_with_an_unreachable_node() -> None:
    runs = (
        NodeRun("a", "a", 0, "x\n"),
        NodeRun("b", "b", None, error="b: connection refused by 10.0.0.2:22"),
        NodeRun("c", "c", 4),
    )
    res = ExecResult("hostname", runs, 0.1)
    assert res.exit_code == 3
    assert res.max_rc == 255
    assert res.failed == {"b": "b: connection refused by 10.0.0.2:22", "c": "exit 4"}
    assert [r.node for r in res.failed_runs] == ["b", "c"]
    d = res.to_dict()
    assert d["exit_code"] == 3 and d["nodes"][1]["error"].endswith("refused by 10.0.0.2:22")
    assert d["failed"] == res.failed


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


def test_a_node_without_its_python_still_runs_the_command_under_coreutils_timeout() -> None:
    node = Node(name="n1", address="127.0.0.1", local=True, python="/nonexistent/python3")
    with FanOut([node]) as fleet:
        ok = execute(fleet, "echo fine", timeout=10)
        late = execute(fleet, "echo started; sleep 30.129", timeout=0.5)
    assert ok.ok and ok.runs[0].stdout == "fine\n"
    (run,) = late.runs
    assert run.timed_out and run.stdout == "started\n" and late.exit_code == 124
    assert run.error is not None and "coreutils timeout" in run.error
    assert _sleeping("30.129") == []


def _logging_python(tmp_path: Path) -> tuple[str, Path]:
    """A node python that notes each start (its argv after ``-c CODE``), then runs as it is."""
    log = tmp_path / "starts.log"
    shim = tmp_path / "python3"
    shim.write_text(
        "#!/bin/sh\n"
        f'shift 3; echo "$*" >> {log}\n'  # -S -c CODE ARGS...
        f'exec {sys.executable} -S -c "$(cat {tmp_path / "code"})" "$@"\n'
    )
    shim.chmod(0o755)
    return str(shim), log


@pytest.mark.skipif(
    not os.path.isfile(TIMEOUT_BIN) or os.path.islink(TIMEOUT_BIN), reason="no coreutils timeout"
)
def test_a_command_that_ends_in_time_starts_no_python_on_the_node(tmp_path: Path) -> None:
    """Where coreutils timeout is, Python starts on the node only when the limit was reached
    (its start and the program's compile were most of a node's CPU for ``exec -- hostname``),
    and a command's own exit 124 before it stays the command's."""
    from fleetctl.remote import inline

    (tmp_path / "code").write_text(inline("exec_timeout.py"))
    python, log = _logging_python(tmp_path)
    secs = f"{310 + os.getpid() % 1000 / 1000:.3f}"
    node = Node(name="n1", address="127.0.0.1", local=True, python=python)
    with FanOut([node]) as fleet:
        ok = execute(fleet, "echo fine; exit 7", timeout=10)
        assert not log.exists()
        own = execute(fleet, "exit 124", timeout=10)  # timeout's own code: asked, not taken
        late = execute(fleet, f"echo started; setsid sleep {secs} & sleep {secs}", timeout=0.5)
    assert ok.runs[0].exit_code == 7 and ok.runs[0].stdout == "fine\n"
    assert own.runs[0].exit_code == 124 and not own.runs[0].timed_out and own.exit_code == 3
    (run,) = late.runs
    assert run.timed_out and run.stdout == "started\n" and late.exit_code == 124
    assert [x.split()[0] for x in log.read_text().splitlines()] == ["--sweep", "--sweep"]
    assert run.error is not None and "1 more process(es) stopped with SIGTERM" in run.error
    assert _sleeping(secs) == []
