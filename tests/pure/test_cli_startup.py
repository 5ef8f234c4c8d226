"""What a ``fleetctl`` start imports: only its own command's code (``fleetctl.cli.lazy``).

Each case runs ``fleetctl.cli.main`` in a fresh interpreter and reads ``sys.modules`` when it
returns (``-X importtime`` would miss modules loaded through ``importlib``, as the lazy group's
are). No timing is asserted here: start-up speed is a bench row (bench/fanout.py, "startup");
these tests pin the imports that speed comes from.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.cli import COMMANDS, cli

# Runs the CLI like the console script does, then writes every imported module's name to argv[1].
PROBE = """
import json, sys
from fleetctl.cli import main
try:
    main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as f:
        json.dump(sorted(sys.modules), f)
"""

# Never needed to print the version or to run a command on this machine without an inventory.
HEAVY = (
    "fleetctl.lab",
    "fleetctl.phases",
    "fleetctl.job",
    "paramiko",
    "rich",
    "jinja2",
    "prometheus_client",
)
COMMAND_MODULES = {c.module for c in COMMANDS.values()}


def imported_by(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    modules = tmp_path / "modules.json"
    p = subprocess.run(
        [sys.executable, "-c", PROBE, str(modules), *args],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    names = set(json.loads(modules.read_text()))
    assert "fleetctl.cli.lazy" in names, p.stderr[-2000:]
    return p, names


def loaded(names: set[str], prefixes: tuple[str, ...] | set[str]) -> list[str]:
    return sorted(n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes))


def test_version_imports_no_command_and_no_ssh_or_plan_code(tmp_path: Path) -> None:
    p, names = imported_by(tmp_path, "--version")
    assert p.returncode == 0 and p.stdout == "fleetctl, version 0.1.0\n"
    assert (
        loaded(names, (*HEAVY, "fleetctl.ssh", "fleetctl.transport", "fleetctl.plan", "yaml")) == []
    )
    assert loaded(names, COMMAND_MODULES) == []


def test_exec_on_this_machine_imports_only_exec_and_its_ssh_layer(tmp_path: Path) -> None:
    p, names = imported_by(tmp_path, "exec", "--", "echo", "hi")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.endswith(": hi\n")
    assert loaded(names, HEAVY) == []
    assert loaded(names, COMMAND_MODULES) == ["fleetctl.cli.exec_cmd"]


def test_a_run_without_metrics_never_imports_prometheus_client(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text("print(1)\n")
    p, names = imported_by(tmp_path, "run", "--dry-run", str(tmp_path / "t.py"))
    assert p.returncode == 0, p.stderr[-2000:]
    assert loaded(names, ("prometheus_client",)) == []


def test_help_lists_every_visible_command_without_importing_one(tmp_path: Path) -> None:
    p, names = imported_by(tmp_path, "--help")
    assert p.returncode == 0, p.stderr[-2000:]
    listed = re.findall(r"^  (\S+)  ", p.stdout.split("Commands:\n", 1)[1], re.M)
    assert listed == sorted(n for n, c in COMMANDS.items() if c.summary is not None)
    assert loaded(names, COMMAND_MODULES) == []
    assert loaded(names, ("jinja2", "fleetctl.report")) == []


@pytest.mark.parametrize(
    ("typed", "hint"),
    [
        ("chek", " Did you mean 'check'?"),
        ("stat", " (Did you mean one of: 'stacks', 'status'?)"),
        ("frobnicate", ""),
    ],
)
def test_a_mistyped_command_gets_a_suggestion_as_a_mistyped_option_does(
    tmp_path: Path, typed: str, hint: str
) -> None:
    """The suggestion comes from the lazy table: no command's module is imported for it."""
    p, names = imported_by(tmp_path, typed)
    assert p.returncode == 2
    assert p.stderr == f"fleetctl: error: No such command {typed!r}.{hint}\n"
    assert loaded(names, COMMAND_MODULES) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_lazy_table_matches_the_command_its_module_registers(name: str) -> None:
    """The summary --help shows before import is the one the command's docstring gives."""
    entry = COMMANDS[name]
    importlib.import_module(entry.module)
    cmd = cli.commands.get(name)
    assert cmd is not None, f"{entry.module} does not register {name!r}"
    assert cmd.callback is not None and cmd.callback.__module__ == entry.module
    assert cmd.hidden == (entry.summary is None)
    if entry.summary is not None:
        assert cmd.get_short_help_str(limit=10_000) == entry.summary


def test_every_registered_command_is_in_the_lazy_table() -> None:
    for module in COMMAND_MODULES:
        importlib.import_module(module)
    assert sorted(cli.commands) == sorted(COMMANDS)


def test_a_command_that_dials_a_host_imports_paramiko_but_not_fabric(tmp_path: Path) -> None:
    """fleetctl dials with paramiko alone: fabric and invoke (unittest.mock, asyncio) cost every
    command ~50 ms of imports before its first connection."""
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on: refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"n1 ansible_host=127.0.0.1 ansible_port={port}\n")
    args = ("exec", "-i", str(inv), "--known-hosts=/dev/null", "--", "true")
    p, names = imported_by(tmp_path, *args)
    assert p.returncode != 0 and "connection refused by 127.0.0.1" in p.stdout + p.stderr
    assert "paramiko" in names
    assert loaded(names, ("fabric", "invoke", "unittest", "importlib.metadata")) == []
    assert "encodings.idna" not in names  # an ASCII host name is resolved as bytes
