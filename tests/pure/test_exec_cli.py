"""``fleetctl exec`` without an inventory: this machine alone (LocalConnection, no network)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys


def fleetctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetctl", "exec", *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


HOST = socket.gethostname()


def test_prefixed_output_and_literal_argv() -> None:
    p = fleetctl("--", "echo", "a b;c", "$HOME")
    assert p.returncode == 0, p.stderr
    assert p.stdout == f"{HOST}: a b;c $HOME\n"


def test_failure_exit_codes_and_summary() -> None:
    p = fleetctl("--", "echo out; echo err >&2; exit 5")
    assert p.returncode == 3
    assert p.stdout == f"{HOST}: out\n"
    assert p.stderr.splitlines() == [
        f"{HOST}: err",
        f"fleetctl: {HOST}: exit 5",
        "fleetctl: error: exec failed on 1 of 1 nodes",
    ]
    assert fleetctl("-S", "--", "exit 5").returncode == 5


def test_gather_and_json() -> None:
    p = fleetctl("-b", "--", "printf 'x\\ny\\n'")
    assert p.returncode == 0
    assert p.stdout == f"{'-' * 15}\n{HOST}\n{'-' * 15}\nx\ny\n"
    p = fleetctl("--json", "--", "echo hi")
    data = json.loads(p.stdout)
    assert data["ok"] and data["exit_code"] == 0 and data["command"] == "echo hi"
    assert [(n["node"], n["stdout"], n["exit_code"]) for n in data["nodes"]] == [(HOST, "hi\n", 0)]


def test_limit_without_inventory_is_a_usage_error() -> None:
    p = fleetctl("--limit", "x", "--", "true")
    assert p.returncode == 2 and "fleetctl: error:" in p.stderr
