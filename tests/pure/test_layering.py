"""The rooms of ``fleetctl/`` import downwards only: every ``import fleetctl.X`` and ``from
fleetctl.X import …`` (module level, inside functions, under ``TYPE_CHECKING``, relative ones
resolved) is checked against ``LAYERS``; an import of a room above the importer's fails unless
it is in ``UPWARD``, each with its reason, and docs/architecture.md ("Upward imports") lists
exactly the same pairs. Outside ``remote/``, only the node kit the controller shares
(``REMOTE_KIT``) may be imported of ``remote/``: the programs are read as files and shipped.

A new top-level module or folder fails here until it is given its place in ``LAYERS`` (and in
the doc's layer list). The CLI's own stricter rule is ``test_cli_layering.py``.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "fleetctl"
DOC = REPO / "docs" / "architecture.md"

# Top to bottom: a room imports its own modules and the rooms below it. ``fleetctl`` is the
# package root (its lazy public names); a room is a top-level folder or module of fleetctl/.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("testing",),
    ("__main__", "tasks"),
    ("cli",),
    ("lab",),
    ("fleetctl",),
    ("api",),
    ("report",),
    ("job",),
    ("phases",),
    ("provision",),
    ("slurm",),
    ("ssh",),
    ("transport",),
    ("plan",),
    ("health",),
    ("errors",),
    ("results",),
    ("node",),
    ("remote",),
)

# What the controller may import of remote/: the installer, the wire format, the supervisor's
# records, the /proc reader, the private-key scan (the code push applies it here too) and the
# container end's bounds (``containers.end_bound``: how long the teardown waits for a node) and
# the probe's ICMP echo (``icmp.icmp_echo``: the check's controller ping) and the progress
# markers' parser (``progress``: one parser for an attached run's lines and a detached
# supervisor's tally).
REMOTE_KIT = frozenset(
    {
        "fleetctl.remote",
        "fleetctl.remote.kit.wire",
        "fleetctl.remote.kit.records",
        "fleetctl.remote.kit.procfs",
        "fleetctl.remote.kit.keyscan",
        "fleetctl.remote.kit.containers",
        "fleetctl.remote.kit.icmp",
        "fleetctl.remote.kit.progress",
    }
)

# The run's one record crosses the layers downwards (issue 35): ``job/`` carries RunSpec's
# groups as they are (``RunOptions.supervision``, ``JobRequest.observe``/``.monitor``) instead
# of re-listing their fields. Any room may import it, and the one definition of its record-valued
# options (``runspec_collective``: a role job file's ``collective:`` knobs are its flags');
# importing them runs only their checks and rooms at or below ``job`` (test below), so neither
# pulls the API into the job core.
RECORDS = frozenset({"fleetctl.api.runspec", "fleetctl.api.runspec_collective"})
RECORD_MAY_IMPORT = frozenset(
    {"fleetctl.api.checks", "fleetctl.api.runspec_collective", "fleetctl.api.runspec_fields"}
)

# (importer, imported) -> why it is allowed. Only shrinks: each is a seam still to cut.
UPWARD: dict[tuple[str, str], str] = {}


def module_name(path: Path, root: Path) -> str:
    """``root/a/b.py`` -> ``fleetctl.a.b`` (a package is its ``__init__``)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str, root: Path) -> bool:
    """Whether dotted ``name`` is a module or package under ``root`` (``fleetctl``)."""
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    base = root / rel
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@functools.cache
def imports(path: Path, root: Path) -> tuple[str, ...]:
    """Every fleetctl module ``path`` imports, wherever the statement is; ``from X import y``
    names ``X.y`` where that is a module, else ``X`` (read once per test session)."""
    return tuple(_imports(path, root))


def _imports(path: Path, root: Path) -> Iterator[str]:
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.split(".")[0] == root.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod.split(".")[0] != root.name:
                continue
            subs = [f"{mod}.{a.name}" for a in node.names if is_module(f"{mod}.{a.name}", root)]
            yield from subs or [mod]


def room(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def violations(
    root: Path,
    layers: Sequence[Sequence[str]] = LAYERS,
    upward: Mapping[tuple[str, str], str] = UPWARD,
    remote_kit: frozenset[str] = REMOTE_KIT,
) -> list[str]:
    """One line per import the rule refuses, and per room with no place in ``layers``."""
    rank = {r: i for i, rooms in enumerate(layers) for r in rooms}
    out = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        mine = room(me)
        if mine not in rank:
            out.append(f"{me}: room {mine!r} has no place in LAYERS")
            continue
        for target in sorted(set(imports(path, root))):
            theirs = room(target)
            if theirs == mine or (me, target) in upward or target in RECORDS:
                continue
            if theirs not in rank:
                out.append(f"{me} -> {target}: room {theirs!r} has no place in LAYERS")
            elif rank[theirs] <= rank[mine]:
                out.append(f"{me} -> {target}: upward ({theirs} is not below {mine})")
            elif theirs == "remote" and target not in remote_kit:
                out.append(f"{me} -> {target}: a node program, not the kit the controller shares")
    return out


def test_fleetctl_imports_downwards_only() -> None:
    assert violations(PACKAGE) == []


def test_the_controller_shares_only_the_node_kit_and_the_kit_imports_no_program() -> None:
    """remote/ is two rooms: ``programs/`` (shipped to nodes by file name, never imported by the
    controller) and ``kit/`` (what the programs import; the controller shares some of it)."""
    assert sorted(m for m in REMOTE_KIT if not m.startswith("fleetctl.remote.kit.")) == [
        "fleetctl.remote"
    ]
    kit = PACKAGE / "remote" / "kit"
    assert [
        f"{module_name(p, PACKAGE)} -> {t}"
        for p in sorted(kit.rglob("*.py"))
        for t in imports(p, PACKAGE)
        if t.startswith("fleetctl.remote.programs")
    ] == []


def eager_imports(path: Path) -> list[str]:
    """The fleetctl modules importing ``path`` runs: module-level statements, not those in
    functions (run when called) or under ``TYPE_CHECKING`` (never run)."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names]
            mods = [m for m in subs if is_module(m, PACKAGE)]
            out += mods or [node.module]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return [m for m in out if m == "fleetctl" or m.startswith("fleetctl.")]


def test_the_run_record_imports_nothing_above_the_job_core() -> None:
    """What crosses downwards stays light: importing ``api/runspec.py`` runs only its checks
    (``api/checks.py``, the collective sub-options of ``api/runspec_collective.py``, the
    field machinery of ``api/runspec_fields.py``) and
    rooms at or below ``job`` (constants of ``job/diagnose/pace.py``, ``plan/``, ``errors``),
    so a ``job/`` module importing the record loads no API."""
    rank = {r: i for i, rooms in enumerate(LAYERS) for r in rooms}
    for name in (*RECORDS, *RECORD_MAY_IMPORT):
        path = PACKAGE.parent / (name.replace(".", "/") + ".py")
        above = [
            t
            for t in eager_imports(path)
            if t not in RECORD_MAY_IMPORT | RECORDS and rank[room(t)] < rank["job"]
        ]
        assert above == [], f"{name} imports {above} when it is imported"


def test_every_upward_import_listed_is_still_made() -> None:
    """The list only shrinks: an entry whose import is gone is removed, not kept."""
    made = {
        (module_name(p, PACKAGE), t) for p in PACKAGE.rglob("*.py") for t in imports(p, PACKAGE)
    }
    assert sorted(set(UPWARD) - made) == []


def doc_section(title: str) -> str:
    text = DOC.read_text()
    m = re.search(rf"^### {re.escape(title)}\n(.*?)(?=^#)", text, re.S | re.M)
    assert m, f"docs/architecture.md has no '### {title}' section"
    return m.group(1)


def test_the_architecture_doc_lists_exactly_the_upward_imports() -> None:
    pairs = re.findall(
        r"^- `(fleetctl[\w.]*)` → `(fleetctl[\w.]*)`", doc_section("Upward imports"), re.M
    )
    assert sorted(pairs) == sorted(UPWARD)


def test_the_architecture_doc_gives_the_same_layer_order() -> None:
    block = re.search(r"```\n(.*?)```", doc_section("The layer rule"), re.S)
    assert block
    rows = [tuple(line.split("#")[0].split()) for line in block.group(1).splitlines()]
    assert tuple(r for r in rows if r) == LAYERS


def plant(tmp: Path, files: Mapping[str, str]) -> Path:
    root = tmp / "fleetctl"
    for rel, text in {"__init__.py": "", **files}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for parent in p.relative_to(root).parents:
            (root / parent / "__init__.py").touch()
        p.write_text(text)
    return root


PLANTED_LAYERS = (("fleetctl",), ("api",), ("job",), ("phases",), ("remote",))


def test_the_checker_finds_upward_imports_wherever_they_are(tmp_path: Path) -> None:
    """Module level, inside a function, under TYPE_CHECKING, ``from P import mod``, relative."""
    root = plant(
        tmp_path,
        {
            "api/fleet.py": "import fleetctl.job.run\n",
            "job/run.py": "from fleetctl.phases import launch\n",
            "job/other.py": "def f():\n    import fleetctl.api.fleet\n",
            "phases/launch.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from fleetctl.job.run import X\n"
                "from ..api import fleet\n"
                "from .. import remote\n"
            ),
            "remote/__init__.py": "",
            "remote/programs/supervisor.py": "",
            "remote/kit/wire.py": "",
        },
    )
    found = violations(root, PLANTED_LAYERS, {}, frozenset({"fleetctl.remote"}))
    assert found == [
        "fleetctl.job.other -> fleetctl.api.fleet: upward (api is not below job)",
        "fleetctl.phases.launch -> fleetctl.api.fleet: upward (api is not below phases)",
        "fleetctl.phases.launch -> fleetctl.job.run: upward (job is not below phases)",
    ]


def test_the_checker_takes_the_listed_exceptions_and_the_kit_only(tmp_path: Path) -> None:
    root = plant(
        tmp_path,
        {
            "job/run.py": (
                "import fleetctl.api.checks\nfrom fleetctl.remote.programs import supervisor\n"
            ),
            "api/checks.py": "from fleetctl.remote.kit.wire import X\n",
            "remote/programs/supervisor.py": "",
            "remote/kit/wire.py": "",
            "stray.py": "",
        },
    )
    upward = {("fleetctl.job.run", "fleetctl.api.checks"): "a reason"}
    assert violations(root, PLANTED_LAYERS, upward, frozenset({"fleetctl.remote.kit.wire"})) == [
        "fleetctl.job.run -> fleetctl.remote.programs.supervisor: a node program, not the kit the "
        "controller shares",
        "fleetctl.stray: room 'stray' has no place in LAYERS",
    ]
