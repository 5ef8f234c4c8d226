"""The CLI speaks to the library through its public API: every module of ``fleetctl/cli/``
(commands, option parsers, renderers) imports ``fleetctl`` / ``fleetctl.api`` (result types
through ``fleetctl.api.types``, shared helpers through ``fleetctl.api.helpers``),
``fleetctl.errors`` and ``fleetctl.cli.*`` only. The lab's commands may import ``fleetctl.lab``
too: the test lab is no part of the library.

``NOT_YET_MOVED`` lists the internal modules a CLI module still reaches into. It only
shrinks, and is empty now: a new internal import fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "fleetctl" / "cli"
ALLOWED = ("fleetctl.api", "fleetctl.cli")
ALLOWED_EXACT = frozenset({"fleetctl", "fleetctl.errors"})

# The lab's commands drive the test lab (``fleetctl.lab``), which is no part of the library.
LAB_COMMANDS = ("lab_cmd.py", "lab_containers_cmd.py")

NOT_YET_MOVED: dict[str, frozenset[str]] = {}


def internal_imports(path: Path) -> set[str]:
    """The fleetctl modules ``path`` imports (module level or inside functions) beyond the API."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if not name.startswith("fleetctl") or name in ALLOWED_EXACT:
                continue
            allowed = (*ALLOWED, "fleetctl.lab") if path.name in LAB_COMMANDS else ALLOWED
            if any(name == a or name.startswith(a + ".") for a in allowed):
                continue
            out.add(name)
    return out


def test_cli_modules_import_only_the_public_api() -> None:
    found = {
        p.name: frozenset(internal_imports(p))
        for p in sorted(CLI.glob("*.py"))
        if internal_imports(p)
    }
    assert found == NOT_YET_MOVED


def test_the_guard_sees_imports_inside_functions_and_type_checking_blocks(tmp_path: Path) -> None:
    """An internal import hidden in a function or under ``TYPE_CHECKING`` counts too."""
    sample = tmp_path / "sample_cmd.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from fleetctl.job.records.result import JobResult\n"
        "def f():\n    import fleetctl.ssh.fanout\n    from fleetctl.api.types import Plan\n"
    )
    assert internal_imports(sample) == {"fleetctl.job.records.result", "fleetctl.ssh.fanout"}


def test_the_moved_commands_stay_moved() -> None:
    """Every command, helper and renderer of cli/ (the lab's aside): the API only."""
    for path in sorted(CLI.glob("*.py")):
        if path.name not in LAB_COMMANDS:
            assert internal_imports(path) == set(), path.name
