"""Nodes whose login shell is csh/tcsh or fish: every command line reaches /bin/sh intact.

The wrapped line is run by the real shells (sh, and tcsh and fish, which CI installs) on this
machine, against the same line run by sh directly: the shells, not a model of them, decide
whether quoting survives.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl import remote
from fleetctl.phases.launch import start_command
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.transport.loginshell import for_login_shell

# Lines fleetctl really sends, and the characters that break csh/fish: newlines in quotes, \\,
# !, $, backquotes, both quote kinds, non-ASCII.
PROGRAM = "import sys\nprint(repr(sys.argv[1:]))\nprint('\\\\n is two chars', \"!$`\")\n"
LINES = [
    shlex.join(["printf", "%s|", "a b", "it's", '"q"', "$HOME", "`x`", "!1", "back\\slash", "é"]),
    shlex.join(["python3", "-S", "-c", PROGRAM, "x y", "!!", "a\\nb"]),
    'echo one; echo two && if [ -n "$HOME" ]; then echo three; fi',
    "cd /tmp && exec sh -c 'echo \"$0\" \"$1\"' 'zero' 'o'\"'\"'ne'",
]


def _run(shell: list[str], line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*shell, line], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )


@pytest.mark.parametrize("line", LINES, ids=["printf", "python-c", "sh-syntax", "nested"])
@pytest.mark.parametrize("shell", ["tcsh", "fish", "sh"])
def test_a_wrapped_line_runs_as_sh_would_run_it_under_any_login_shell(
    shell: str, line: str
) -> None:
    exe = shutil.which(shell)
    if exe is None:
        skip_or_fail(f"{shell} is not installed (.ci/run installs it)")
    want = _run(["/bin/sh", "-c"], line)
    assert want.returncode == 0, want.stderr
    got = _run([exe, "-c"], for_login_shell(line, "fish" if shell == "fish" else "csh"))
    assert (got.returncode, got.stdout, got.stderr) == (0, want.stdout, want.stderr)


def test_tcsh_cannot_read_the_lines_fleetctl_sends_unwrapped() -> None:
    """Why the wrapper exists: the supervisor's start line, as tcsh gets it without."""
    exe = shutil.which("tcsh")
    if exe is None:
        skip_or_fail("tcsh is not installed (.ci/run installs it)")
    line = start_command("python3", "/nonexistent/w/bin/supervisor_0.py", "status")
    assert "\n" in remote.RUN_FILE  # a multi-line program inside single quotes
    raw = _run([exe, "-c"], line)
    assert raw.returncode != 0 and "Unmatched" in raw.stderr


def test_posix_login_shells_get_the_line_as_it_is() -> None:
    for shell_type in (None, "sh", "bash", "zsh"):
        assert for_login_shell(LINES[0], shell_type) == LINES[0]
    wrapped = for_login_shell(LINES[1], "csh")
    assert "\n" not in wrapped and "\\" not in wrapped and "!" not in wrapped


def test_the_inventory_names_the_login_shell(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n"
        "    a: {ansible_host: 10.0.0.1, ansible_shell_type: csh}\n"
        "    b: {ansible_host: 10.0.0.2, ansible_shell_type: bash}\n"
        "    c: {ansible_host: 10.0.0.3, ansible_shell_type: fish}\n"
        "    d: {ansible_host: 10.0.0.4}\n"
    )
    nodes = {n.name: n.shell_type for n in load_inventory(inv).nodes}
    assert nodes == {"a": "csh", "b": None, "c": "fish", "d": None}


def test_the_login_shell_sshd_reports_names_the_shell_type_to_declare() -> None:
    from fleetctl.transport.loginshell import declared_type

    got = {s: declared_type(s) for s in ("/usr/bin/tcsh", "/bin/csh", "/usr/bin/fish")}
    assert got == {"/usr/bin/tcsh": "csh", "/bin/csh": "csh", "/usr/bin/fish": "fish"}
    assert [declared_type(s) for s in ("/bin/bash", "/usr/bin/zsh", "/bin/sh", "")] == [None] * 4
