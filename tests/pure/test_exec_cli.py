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


def test_options_after_a_shell_line_warn_that_they_became_words_of_the_command() -> None:
    """pdsh's habit, `exec 'uname -r' --limit node1`: --limit is a word of the command, which
    now names a program 'uname -r'; said before it runs, on stderr."""
    p = fleetctl("echo hi", "--limit", "x")
    assert p.exit_code == 3
    assert p.stderr.splitlines()[:2] == [
        "fleetctl: warning: 'echo hi' is run as one program name, not as a shell line: only a "
        "lone argument is a shell line, and 2 more follow it",
        "fleetctl: warning: --limit after the command is passed to it, not to exec: exec's "
        "options go before the command (fleetctl exec --limit PATTERN -- COMMAND)",
    ]
    p = fleetctl("echo", "--json", "--timeout=5")
    assert p.exit_code == 0 and p.stdout == f"{HOST}: --json --timeout=5\n"
    assert p.stderr == (
        "fleetctl: warning: --json --timeout=5 after the command are passed to it, not to "
        "exec: exec's options go before the command (fleetctl exec --limit PATTERN -- COMMAND)\n"
    )


def test_after_an_explicit_double_dash_only_a_shell_line_with_more_words_warns() -> None:
    p = fleetctl("--", "echo", "--json", "-b")
    assert p.exit_code == 0 and p.stderr == "" and p.stdout == f"{HOST}: --json -b\n"
    assert fleetctl("echo", "-f", "-i", "-b", "-S").stderr == ""  # short ones are the program's
    p = fleetctl("--", "echo hi", "x")
    assert p.stderr.startswith("fleetctl: warning: 'echo hi' is run as one program name")
