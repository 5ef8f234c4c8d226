"""The command modules speak to the library through its public API: ``fleetctl/cli/*_cmd.py``
import ``fleetctl`` / ``fleetctl.api``, ``fleetctl.errors`` and ``fleetctl.cli.*`` only.

``NOT_YET_MOVED`` lists the internal modules each command still reaches into, until the API
grows their counterparts. It only shrinks: a new internal import fails here, and so does an
entry no longer used (take it off the list when a command moves to the API).
"""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "fleetctl" / "cli"
ALLOWED = ("fleetctl.api", "fleetctl.cli")
ALLOWED_EXACT = frozenset({"fleetctl", "fleetctl.errors"})

# The lab's commands drive the test lab (``fleetctl.lab``), which is no part of the library.
LAB_COMMANDS = ("lab_cmd.py", "lab_containers_cmd.py")

NOT_YET_MOVED: dict[str, frozenset[str]] = {
    # exec stays on the SSH layer: importing the API would cost `fleetctl exec` its start
    # time (tests/pure/test_cli_startup.py)
    "exec_cmd.py": frozenset({"fleetctl.ssh.execute", "fleetctl.ssh.fleet"}),
    "push_cmd.py": frozenset(
        {"fleetctl.phases.codesync", "fleetctl.phases.push", "fleetctl.ssh.fleet"}
    ),
    "run_cmd.py": frozenset(
        {
            "fleetctl.job.retry",
            "fleetctl.job.rolejob",
            "fleetctl.job.run",
            "fleetctl.job.submit",
            "fleetctl.phases.checkpoints",
            "fleetctl.phases.collect",
            "fleetctl.plan.launchers",
            "fleetctl.plan.rankplan",
            "fleetctl.plan.runtimes",
            "fleetctl.plan.script_arg",
            "fleetctl.slurm",
            "fleetctl.slurm.batch",
            "fleetctl.ssh.connection",
        }
    ),
}


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


def test_command_modules_import_only_the_public_api() -> None:
    found = {
        p.name: frozenset(internal_imports(p))
        for p in sorted(CLI.glob("*_cmd.py"))
        if internal_imports(p)
    }
    assert found == NOT_YET_MOVED


def test_the_moved_commands_stay_moved() -> None:
    """check, inventory, provision, runs/status/logs/stop/collect/stacks/monitor: the API."""
    for name in ("check_cmd.py", "inventory_cmd.py", "jobs_cmd.py", "provision_cmd.py"):
        assert internal_imports(CLI / name) == set(), name
