"""One mode of a push program on a node (``phases/push/nodecall.py``), the one way push,
``push --image`` and the checkpoint relay run them: the config on stdin, never in argv; the
answer frame returned; no answer named by exit code and the last line the node printed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetctl.errors import NodePushError
from fleetctl.node import Node
from fleetctl.phases.push.nodecall import call_mode
from fleetctl.results import CommandResult


class FakeConn:
    def __init__(self, result: CommandResult) -> None:
        self.result = result
        self.calls: list[tuple[list[str], bytes]] = []

    def run(self, argv: list[str], *, timeout: float, stdin: bytes) -> CommandResult:
        assert timeout == 30
        self.calls.append((argv, stdin))
        return self.result


NODE = Node.localhost(name="n1", workdir="/w", python="python3")


def test_the_answer_frame_comes_back_and_the_config_goes_on_stdin_only() -> None:
    conn = FakeConn(CommandResult("x", 3, 'noise\nD {"error": "disk", "stage": "fetch"}\n'))
    cfg = {"token": "secret-token"}
    got = call_mode(NODE, conn, "push_helper.py", "relay-have", cfg, 30, failed="f")  # type: ignore[arg-type]
    assert got == {"error": "disk", "stage": "fetch"}  # the caller judges an error answer
    argv, stdin = conn.calls[0]
    assert argv[-1] == "relay-have" and not any("secret-token" in a for a in argv)
    assert json.loads(stdin) == cfg


@pytest.mark.parametrize(
    ("result", "said"),
    [
        (
            CommandResult("x", 127, "", "sh: python3: not found\n"),
            "python 'python3' not found on the node (set fleetctl_python)",
        ),
        (
            CommandResult("x", 1, "", "Traceback\nMemoryError\n"),
            "push probe failed (exit 1): MemoryError",
        ),
        (CommandResult("x", 0, "", ""), "push probe failed (exit 0)"),
    ],
)
def test_no_answer_names_the_exit_code_and_the_last_line(result: Any, said: str) -> None:
    conn = FakeConn(result)
    with pytest.raises(NodePushError) as e:
        call_mode(
            NODE,  # type: ignore[arg-type]
            conn,  # type: ignore[arg-type]
            "push_helper.py",
            "probe",
            {},
            30,
            failed="push probe failed",
            missing_python=" (set fleetctl_python)",
        )
    assert said in e.value.one_line() and e.value.stage == "probe"
