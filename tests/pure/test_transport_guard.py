"""Where a job runs is one abstraction: what differs between SSH, the local node and srun is
asked of the connection (``fleetctl.transport.connection.Connection``: ``can_rsync``,
``ping_target``, ``remember_home``, ``upload``, ``watch_health``, ``reach_fields``, …), never
tested by kind outside ``fleetctl/transport/``. A kind test is an
``isinstance``/``issubclass``/``type()`` against a connection class, ``is_srun``, the
``fleetctl_connection`` var compared to a literal, or ``hasattr``/``getattr`` probing a
connection. And one class is called ``Fleet`` (the public one; the engine is ``FanOut``).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "fleetctl"
TRANSPORT_ROOMS = ("transport",)  # where the kinds live
CONN_VAR_NAMES = frozenset({"fleetctl_connection", "CONNECTION_VAR"})
CONN_LIKE = re.compile(r"conn", re.IGNORECASE)  # conn, connection, fleet.connection(n), …


def connection_classes(root: Path = PKG) -> frozenset[str]:
    """The concrete transports: every class of transport/ below the ``Connection`` ABC."""
    bases: dict[str, set[str]] = {}
    for room in TRANSPORT_ROOMS:
        for path in (root / room).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef):
                    bases[node.name] = {_name(b) for b in node.bases}
    found: set[str] = set()
    while True:
        more = {c for c, bs in bases.items() if bs & (found | {"Connection"})} - found
        if not more:
            return frozenset(found)
        found |= more


def _name(node: ast.AST) -> str:
    """``SSHConnection`` for ``SSHConnection`` and ``connection.SSHConnection``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _names_in(node: ast.AST) -> set[str]:
    return {_name(n) for n in ast.walk(node)} - {""}


def _strings_in(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def kind_tests(source: str | ast.Module, classes: frozenset[str]) -> list[str]:
    """Each place in ``source`` that tests a transport's kind, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(source) if isinstance(source, str) else source):
        what = None
        if isinstance(node, ast.Call):
            fn = _name(node.func)
            if fn in ("isinstance", "issubclass") and len(node.args) == 2:
                hit = sorted(_names_in(node.args[1]) & classes)
                if hit:
                    what = f"{fn} against {', '.join(hit)}"
            elif fn == "is_srun":
                what = "is_srun"
            elif fn in ("hasattr", "getattr") and node.args:
                what = (
                    f"{fn} on a connection" if CONN_LIKE.search(ast.unparse(node.args[0])) else None
                )
        elif isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            names = set().union(*(_names_in(p) for p in parts))
            strings = set().union(*(_strings_in(p) for p in parts))
            if (names | strings) & CONN_VAR_NAMES and strings - CONN_VAR_NAMES:
                what = "fleetctl_connection compared to a literal"
            elif "type" in names and names & classes:
                what = f"type() compared to {', '.join(sorted(names & classes))}"
        if what is not None:
            found.append(f"{node.lineno}: {what}")
    return found


def could_test_a_kind(text: str, classes: frozenset[str]) -> bool:
    """A cheap look before parsing: every kind test names one of these (an alias aside)."""
    words = [*classes, "is_srun", *CONN_VAR_NAMES]
    return bool(re.search("|".join(words), text) or re.search(r"(has|get)attr\(\s*[^,]*conn", text))


def modules_outside_the_transports(root: Path = PKG) -> list[Path]:
    return [
        p for p in sorted(root.rglob("*.py")) if p.relative_to(root).parts[0] not in TRANSPORT_ROOMS
    ]


def classes_named(name: str, paths: list[Path]) -> list[Path]:
    """The modules among ``paths`` that define a class ``name`` (once per definition)."""
    out = []
    for path in paths:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef) and node.name == name:
                out.append(path)
    return out


# -------------------------------------------------------------------------------- the tree


def test_the_transports_are_found_below_the_connection_abc() -> None:
    assert {"SSHConnection", "LocalConnection", "SrunConnection", "ExecConnection"} <= (
        connection_classes()
    )


def test_no_module_outside_transport_tests_a_transport_kind() -> None:
    classes = connection_classes()
    found = {
        str(p.relative_to(PKG)): hits
        for p in modules_outside_the_transports()
        if could_test_a_kind(p.read_text(), classes) and (hits := kind_tests(_tree(p), classes))
    }
    assert found == {}, "ask the connection (a Connection capability) instead"


def test_one_class_is_called_fleet() -> None:
    """The public ``fleetctl.api.Fleet``; the fan-out engine under it is ``FanOut``."""
    maybe = [p for p in sorted(PKG.rglob("*.py")) if re.search(r"class\s+Fleet\b", p.read_text())]
    assert classes_named("Fleet", maybe) == [PKG / "api" / "fleet.py"]


# ------------------------------------------------------------- the detector, on planted code

CLASSES = frozenset({"SSHConnection", "LocalConnection", "SrunConnection"})


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("isinstance(conn, SSHConnection)", ["1: isinstance against SSHConnection"]),
        (
            "if isinstance(c, (connection.LocalConnection, int)):\n    pass",
            ["1: isinstance against LocalConnection"],
        ),
        ("issubclass(cls, SrunConnection)", ["1: issubclass against SrunConnection"]),
        ("x = allocation.is_srun(n)", ["1: is_srun"]),
        ("srun = {n for n in nodes if is_srun(n)}", ["1: is_srun"]),
        (
            "use = n.vars.get('fleetctl_connection') == 'srun'",
            ["1: fleetctl_connection compared to a literal"],
        ),
        (
            "use = node.vars[CONNECTION_VAR] in ('srun', 'ssh')",
            ["1: fleetctl_connection compared to a literal"],
        ),
        ("\nif hasattr(conn, 'set_home'):\n    pass", ["2: hasattr on a connection"]),
        ("getattr(fleet.connection(n), 'client', None)", ["1: getattr on a connection"]),
        ("type(conn) is SrunConnection", ["1: type() compared to SrunConnection"]),
        # asking, or testing something else, is fine
        ("conn.remember_home(home)", []),
        ("transport(n).ping_target(n, settings)", []),
        ("isinstance(e, FleetctlError)", []),
        ("hasattr(e, 'one_line')", []),
        ("n.vars.get('fleetctl_nic') == 'ib0'", []),
        ("n.local and conn.can_rsync", []),
    ],
)
def test_the_detector_flags_a_kind_test_and_nothing_else(source: str, expected: list[str]) -> None:
    assert kind_tests(source, CLASSES) == expected
    if expected:  # the look before parsing lets it through
        assert could_test_a_kind(source, CLASSES)


def test_the_detector_finds_a_planted_kind_test_in_a_module_tree(tmp_path: Path) -> None:
    """A tree shaped like fleetctl's: kinds inside transport/ are theirs; a kind test in
    phases/ is found, and a second ``Fleet`` class is seen."""
    (tmp_path / "transport").mkdir()
    (tmp_path / "phases").mkdir()
    (tmp_path / "transport" / "connection.py").write_text(
        "class Connection: ...\nclass SSHConnection(Connection): ...\n"
        "def connect(n):\n    return isinstance(n, SSHConnection)\n"
    )
    (tmp_path / "transport" / "srun.py").write_text(
        "from x import ExecBase\nclass ExecBase(Connection): ...\nclass Srun(ExecBase): ...\n"
    )
    planted = tmp_path / "phases" / "push.py"
    planted.write_text("class Fleet: ...\ndef f(conn):\n    return isinstance(conn, Srun)\n")
    classes = connection_classes(tmp_path)
    assert classes == {"SSHConnection", "ExecBase", "Srun"}
    assert modules_outside_the_transports(tmp_path) == [planted]
    assert could_test_a_kind(planted.read_text(), classes)
    assert kind_tests(planted.read_text(), classes) == ["3: isinstance against Srun"]
    public = PKG / "api" / "fleet.py"
    assert classes_named("Fleet", [planted, public]) == [planted, public]
