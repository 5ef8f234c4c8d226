"""A launcher is one module: no code outside ``fleetctl/plan/launchers/`` branches on a
launcher's name (``== "paddle"``, ``in ("plain", …)``, a set of names). What a launcher does
differently is a field of its ``Launcher``, found by name through the registry; the node
programs (``fleetctl/remote/``) get it as keys of the supervisor's spec (``rank_logs``,
``one_process``), never as a name to compare."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fleetctl
from fleetctl.plan.launchers import LAUNCHER_NAMES, LAUNCHERS, launcher_for

ROOT = Path(fleetctl.__file__).parent
EXEMPT = (ROOT / "plan" / "launchers",)
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


#: Per launcher with rank files: (path in the node folder, global rank) of what it writes on
#: node rank 1 of 2 processes per node, and files that are no rank's (same folder, near names).
RANK_TREES = {
    "torchrun": (
        [
            ("torchrun/j/attempt_0/0/stdout.log", 2),
            ("torchrun/j/attempt_0/0/stderr.log", 2),
            ("torchrun/j/attempt_0/1/stdout.log", 3),
            ("torchrun/j/attempt_1/1/stderr.log", 3),
        ],
        ["torchrun/j/attempt_0/0/error.json", "torchrun/j/attempt_0/x/stdout.log"],
    ),
    # torch's agent under accelerate's --multi_gpu, its per-rank files by PET_REDIRECTS
    "accelerate": (
        [
            ("torchrun/j/attempt_0/0/stdout.log", 2),
            ("torchrun/j/attempt_0/0/stderr.log", 2),
            ("torchrun/j/attempt_0/1/stdout.log", 3),
        ],
        ["torchrun/j/attempt_0/0/error.json", "console.txt"],
    ),
    "paddle": (
        [("log/workerlog.0", 2), ("log/workerlog.1", 3)],
        ["log/endpoints.log", "log/workerlog.x", "log/sub/workerlog.0"],
    ),
    "deepspeed": (
        [("deepspeed/20260101_rank2.log", 2), ("deepspeed/20260101_rank3.log", 3)],
        [
            *["deepspeed/a_rank2.txt", "deepspeed/a_rankx.log", "deepspeed/sub/a_rank2.log"],
            *["deepspeed/_rank2.log", "deepspeed/_rank3.log"],  # no time stamp: not deepspeed's
        ],
    ),
}


def test_every_launchers_rank_files_are_known_to_the_test() -> None:
    with_logs = {n for n, la in LAUNCHERS.items() if la.rank_logs(1, 2) is not None}
    assert with_logs == set(RANK_TREES)


@pytest.mark.parametrize("name", sorted(RANK_TREES))
def test_the_supervisor_tails_what_the_launchers_rank_files_collect(
    name: str, tmp_path: Path
) -> None:
    """The spec's rules, read by the node's ``rank_log_files``, find each rank's files and
    no other; the same files ``rank_files`` reads back from the collected folder."""
    from fleetctl.remote.kit.ranks import rank_log_files

    la = LAUNCHERS[name]
    rules = la.rank_logs(1, 2)
    assert rules is not None and "layout" not in rules
    ranks, decoys = RANK_TREES[name]
    for rel in [r for r, _ in ranks] + decoys:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x\n")
    root = tmp_path / rules["dir"]
    found = sorted(
        (str(Path(p).relative_to(tmp_path)), rules["base"] + n)
        for p, n in rank_log_files(str(root), rules)
    )
    assert found == sorted(ranks)
    for local, rank in ((0, 2), (1, 3)):
        collected = [str(p.relative_to(tmp_path)) for p in la.rank_files(tmp_path, local, rank)]
        assert sorted(collected) == sorted(r for r, g in ranks if g == rank)


def test_a_spec_without_rules_tails_nothing(tmp_path: Path) -> None:
    """An older spec (``layout`` by name, or no rules): no file is guessed to be a rank's."""
    from fleetctl.remote.kit.ranks import rank_log_files

    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "stdout.log").write_text("x\n")
    (tmp_path / "workerlog.0").write_text("x\n")
    assert rank_log_files(str(tmp_path), {"dir": "", "base": 0, "layout": "paddle"}) == []
    assert rank_log_files(str(tmp_path), {"files": ["no group", "("]}) == []


def test_one_process_is_the_supervisors_only_child_plain_and_command() -> None:
    """No launcher process between the supervisor and the job: the spec's ``one_process``."""
    assert {n for n, la in LAUNCHERS.items() if la.one_process} == {"plain"}
    assert launcher_for("command").one_process
    assert not launcher_for("paddle-ps").one_process and not launcher_for(None).one_process


@pytest.mark.parametrize(
    ("launcher", "one_process", "rank_logs"),
    [("plain", True, False), ("command", True, False), ("torchrun", False, True)],
)
def test_the_node_spec_carries_the_launchers_rules(
    launcher: str, one_process: bool, rank_logs: bool
) -> None:
    from fleetctl.phases.launch import node_spec
    from fleetctl.plan.rankplan import NodePlan

    class Conn:
        def expand(self, path: str) -> str:
            return path.replace("~", "/home/u")

    np = NodePlan(
        host="n1",
        address="10.0.0.1",
        node_rank=1,
        train_addr="10.0.0.1",
        nic=None,
        python="python3",
        workdir="~/.fleetctl",
        code_dir="~/.fleetctl/code/c",
        run_dir="~/.fleetctl/runs/j/1-n1",
        cwd="~/.fleetctl/runs/j/1-n1",
        argv=("python3", "x.py"),
        env={"FLEET_LAUNCHER": launcher, "FLEET_NPROC_PER_NODE": "2"},
    )
    spec = node_spec(np, Conn(), job_id="j", deadman=10, grace=1)  # type: ignore[arg-type]
    assert spec.one_process is one_process
    assert (spec.rank_logs is not None) is rank_logs
    if spec.rank_logs is not None:
        assert spec.rank_logs["base"] == 2 and spec.rank_logs["files"]


def test_a_one_process_accelerate_jobs_rank_log_is_the_console(tmp_path: Path) -> None:
    """One process in all: accelerate's simple launcher, no torch agent, no per-rank files."""
    (tmp_path / "console.log").write_text("x\n")
    assert LAUNCHERS["accelerate"].rank_files(tmp_path, 0, 0) == [tmp_path / "console.log"]
