"""Launcher adapters: pure argv builders, one module per launcher, and their registry.

``build_argv(launcher, ctx, node)`` is what the plan calls for each node. Adding a launcher =
one module exposing ``LAUNCHER`` plus one line in ``LAUNCHERS``: everything else (the
supervisor's rank-log spec, the collected rank files, the failed-rank parsing, the env dumps
to redact, the check's import) is asked of the ``Launcher`` found by name, never by comparing
names outside this folder (``tests/pure/test_launcher_guard.py`` holds the code to that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetctl.errors import PlanError
from fleetctl.plan.launchers import accelerate, deepspeed, paddle, plain, torchrun
from fleetctl.plan.launchers.base import MODULE, SCRIPT_KINDS, SHELL, LaunchContext, Launcher

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan

LAUNCHERS: dict[str, Launcher] = {
    m.LAUNCHER.name: m.LAUNCHER for m in (torchrun, paddle, deepspeed, plain, accelerate)
}
LAUNCHER_NAMES: tuple[str, ...] = tuple(LAUNCHERS)
DEFAULT_LAUNCHER = "torchrun"


def get_launcher(name: str) -> Launcher:
    """The adapter called ``name``; PlanError (exit 2) naming the known ones otherwise."""
    try:
        return LAUNCHERS[name]
    except KeyError as e:
        known = ", ".join(LAUNCHER_NAMES)
        raise PlanError(f"unknown launcher {name!r} (known: {known})") from e


# What a name fleetctl has no module for stands for (a role's ``command``, ``paddle-ps``, a
# plan.json without a launcher): the launcher's console is every rank's log, no rank named.
OTHER = Launcher(name="", argv=lambda ctx, node: [])
# A role's ``command`` (argv from the job file, no --launcher) runs as the supervisor's only
# child, like plain, but is planned as any unknown name.
COMMAND = Launcher(name="command", argv=lambda ctx, node: [], one_process=True)
_NOT_CHOSEN = {COMMAND.name: COMMAND}  # not a --launcher choice: found by launcher_for only


def launcher_for(name: str | None) -> Launcher:
    """The adapter called ``name``, or ``OTHER`` for a name with none: for the hooks read
    after a run, where an unknown name is a fact of an older record, not a usage error."""
    return LAUNCHERS.get(name or "") or _NOT_CHOSEN.get(name or "", OTHER)


def check_program(name: str, kind: str, script: str) -> None:
    """PlanError (exit 2, one line) when launcher ``name`` cannot start ``script`` of ``kind``
    (a Python file, a module, a shell script): refused before any node is reached."""
    launcher = get_launcher(name)
    if kind not in SCRIPT_KINDS:
        raise PlanError(f"unknown script kind {kind!r} (known: {', '.join(SCRIPT_KINDS)})")
    if kind not in launcher.kinds:
        what = {MODULE: f"a module (-m {script})", SHELL: f"a shell script ({script})"}[kind]
        able = [n for n, la in LAUNCHERS.items() if kind in la.kinds]
        use = " or ".join([", ".join(able[:-1]), able[-1]] if len(able) > 1 else able)
        raise PlanError(f"the {name} launcher cannot run {what}; use --launcher {use}")
    launcher.check_script(kind, script)


def build_argv(launcher: str, ctx: LaunchContext, node: NodePlan) -> list[str]:
    """That node's full command line, argv[0] first; user args appended untouched."""
    return get_launcher(launcher).argv(ctx, node)


__all__ = [
    "DEFAULT_LAUNCHER",
    "LAUNCHERS",
    "LAUNCHER_NAMES",
    "LaunchContext",
    "Launcher",
    "build_argv",
    "check_program",
    "get_launcher",
    "launcher_for",
]
