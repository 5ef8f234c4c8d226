"""A launcher is one module: no code outside ``fleetctl/plan/launchers/`` branches on a
launcher's name (``== "paddle"``, ``in ("plain", …)``, a set of names). What a launcher does
differently is a field of its ``Launcher``, found by name through the registry.

``fleetctl/remote/`` is left out: the node supervisor still picks its rank-log file rules by
the ``layout`` string of its spec and treats ``plain``/``command`` as one process (a follow-up
moves those rules behind the spec)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fleetctl
from fleetctl.plan.launchers import LAUNCHER_NAMES, LAUNCHERS, launcher_for

ROOT = Path(fleetctl.__file__).parent
EXEMPT = (ROOT / "plan" / "launchers", ROOT / "remote")
NAMES = frozenset(LAUNCHER_NAMES)


def _names_in(node: ast.AST) -> list[str]:
    """Launcher names written as constants in ``node`` itself or in a literal collection."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return [n for e in node.elts for n in _names_in(e)]
    return []


def branches_on_names(source: str) -> list[tuple[int, str]]:
    """(line, name) of each comparison with a launcher name, and of each literal set, list or
    tuple of launcher names (the way ``x in NAMES`` hides one)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                found += [(node.lineno, n) for n in _names_in(side)]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            found += [(node.lineno, n) for n in _names_in(node)]
        elif isinstance(node, ast.MatchValue):
            found += [(node.lineno, n) for n in _names_in(node.value)]
    return sorted(set(found))


def _modules() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if not any(p.is_relative_to(e) for e in EXEMPT))


def test_no_branch_on_a_launcher_name_outside_plan_launchers() -> None:
    hits = [
        f"{p.relative_to(ROOT.parent)}:{line}: {name!r}"
        for p in _modules()
        for line, name in branches_on_names(p.read_text())
    ]
    assert hits == [], "ask the Launcher (plan/launchers/base.py), not its name:\n" + "\n".join(
        hits
    )


@pytest.mark.parametrize(
    "code",
    [
        'if spec.launcher == "paddle":\n    pass\n',
        'x = launcher != "plain"\n',
        'ok = name in ("torchrun", "deepspeed")\n',
        'MULTI = frozenset({"torchrun", "paddle"})\n',
        'match name:\n    case "deepspeed":\n        pass\n',
    ],
)
def test_the_guard_sees_a_branch(code: str) -> None:
    assert branches_on_names(code)


@pytest.mark.parametrize(
    "code",
    ['launcher: str = "torchrun"\n', 'run(launcher="plain")\n', 'x = {"paddle": 1}["paddle"]\n'],
)
def test_a_default_or_call_is_no_branch(code: str) -> None:
    assert branches_on_names(code) == []


def test_an_unknown_name_gets_the_neutral_launcher() -> None:
    """A role's ``command``, ``paddle-ps``, an older plan without a launcher: console logs,
    no named ranks, one rendezvous port."""
    for name in ("command", "paddle-ps", None, ""):
        la = launcher_for(name)
        assert la.rank_logs(1, 4) is None and la.named_failures(["rank: 3"]) == []
        assert not la.one_process_per_node and not la.port_per_local_rank and not la.env_dumps
    assert launcher_for("paddle") is LAUNCHERS["paddle"]


def test_every_launcher_with_rank_logs_names_a_folder_of_the_run_folder() -> None:
    for name, la in LAUNCHERS.items():
        spec = la.rank_logs(2, 4)
        if spec is not None:
            assert spec["dir"] and not spec["dir"].startswith(("/", "~", "..")), name
            assert isinstance(spec["base"], int), name
