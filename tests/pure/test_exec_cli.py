"""``fleetctl exec`` without an inventory: this machine alone (LocalConnection, no network)."""

from __future__ import annotations

import json
import socket

from fleetctl.testing.cli_runner import CliResult, run_cli


def fleetctl(*args: str) -> CliResult:
    return run_cli("exec", *args)


HOST = socket.gethostname()


def test_prefixed_output_and_literal_argv() -> None:
    p = fleetctl("--", "echo", "a b;c", "$HOME")
    assert p.exit_code == 0, p.stderr
    assert p.stdout == f"{HOST}: a b;c $HOME\n"


def test_failure_exit_codes_and_summary() -> None:
    p = fleetctl("--", "echo out; echo err >&2; exit 5")
    assert p.exit_code == 3
    assert p.stdout == f"{HOST}: out\n"
    assert p.stderr.splitlines() == [
        f"{HOST}: err",
        f"fleetctl: {HOST}: exit 5",
        "fleetctl: error: exec failed on 1 of 1 nodes",
    ]
    assert fleetctl("-S", "--", "exit 5").exit_code == 5


def test_gather_and_json() -> None:
    p = fleetctl("-b", "--", "printf 'x\\ny\\n'")
    assert p.exit_code == 0
    assert p.stdout == f"{'-' * 15}\n{HOST}\n{'-' * 15}\nx\ny\n"
    p = fleetctl("--json", "--", "echo hi")
    data = json.loads(p.stdout)
    assert data["ok"] and data["exit_code"] == 0 and data["command"] == "echo hi"
    assert [(n["node"], n["stdout"], n["exit_code"]) for n in data["nodes"]] == [(HOST, "hi\n", 0)]


def test_limit_without_inventory_is_a_usage_error() -> None:
    p = fleetctl("--limit", "x", "--", "true")
    assert p.exit_code == 2 and "fleetctl: error:" in p.stderr
