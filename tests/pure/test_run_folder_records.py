"""Every file a run folder holds (docs/run-folders.md) has a typed record or a stated reason, and
each record reads its golden file (``tests/pure/records/<file>``, written by the fleetctl before
the records: main at 267500a) and writes it back byte for byte: old run folders read as ever.

A malformed file is one line naming the file and the key; a newer fleetctl's keys survive an
update; a file of another schema is refused rather than misread.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from fleetctl.errors import RunFolderError
from fleetctl.job.records import attempts, files, jobrecord, plan
from fleetctl.job.records.files import FileRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.remote.kit.records import Record, RecordError, SupervisorState

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "records"

#: file name -> its record class, or why it has none (yet)
RECORDS: dict[str, type | str] = {
    "check.json": files.CheckRecord,
    "collective.json": files.CollectiveRecord,
    "connect.json": files.ConnectRecord,
    "controller.json": files.ControllerRecord,
    "ranks.json": files.RanksRecord,
    "roles.json": files.RolesRecord,
    "slurm.json": files.SlurmRecord,
    "job.json": jobrecord.JobRecord,
    "supervisor.json": "SupervisorState (remote/records.py): written on the node",
    "plan.json": plan.PlanRecord,
    "attempts.json": attempts.AttemptsRecord,
    "run-spec.json": "RunSpec.to_dict in a versioned envelope (slurm/specfile.py)",
    "rank_pids.json": "the node's raw record, in the node's run folder (remote/supervision.py)",
    "rank_exits.json": "the node's raw record, in the node's run folder (remote/supervision.py)",
    "backup_env.N.json": "paddle's, not fleetctl's (its env values redacted)",
    "events.log": "free-form: one timestamped line per event",
    "monitor.log": "free-form: the monitor's output",
    "hook-on-failure.log": "free-form: the hook's output",
    "hook-on-end.log": "free-form: the hook's output",
    "console.log": "free-form: the launcher's output",
    "before.log": "free-form: the --before task's output",
    "sbatch.sh": "the batch script as submitted",
    "slurm.out": "written by Slurm",
    ".err": "slurm.err, written by Slurm",
    "report.html": "made from the other files by fleetctl.report",
    "container.pid": "podman's --pidfile",
}


def documented_files() -> set[str]:
    """The controller folder's tree in docs/run-folders.md, and every JSON file it names."""
    text = (REPO / "docs" / "run-folders.md").read_text()
    tree = text.split("```")[1]
    names = set(re.findall(r"[\w.-]*\.(?:json|log|sh|html|txt|pid|out|err)\b", tree))
    return names | set(re.findall(r"`(?:[^`]*/)?([\w.-]+\.json)`", text))


def test_every_documented_file_has_a_record_or_a_reason() -> None:
    missing = documented_files() - RECORDS.keys()
    assert not missing, f"give these a record (or a reason) in RECORDS: {sorted(missing)}"
    stale = RECORDS.keys() - documented_files()
    assert not stale, f"no longer in docs/run-folders.md: {sorted(stale)}"


def test_every_record_class_is_in_the_table_with_a_golden_file() -> None:
    classes = {
        c
        for module in (files, attempts, jobrecord, plan)
        for c in vars(module).values()
        if isinstance(c, type) and c.__dict__.get("FILE")
    }
    assert classes == {c for c in RECORDS.values() if isinstance(c, type)}
    for cls in classes:
        assert cls.FILE in RECORDS and RECORDS[cls.FILE] is cls
        assert (GOLDEN / cls.FILE).is_file(), f"no golden {cls.FILE}"


def goldens() -> list[tuple[str, str]]:
    """(file, golden): ``<file>`` itself and its variants ``<stem>.<variant>.json``."""
    out = []
    for name, cls in sorted(RECORDS.items()):
        if isinstance(cls, type):
            stem = name.removesuffix(".json")
            out += [(name, p.name) for p in sorted(GOLDEN.glob(f"{stem}.*json"))]
    return out


@pytest.mark.parametrize(("name", "case"), goldens())
def test_a_record_reads_its_golden_file_and_writes_it_back_byte_for_byte(
    name: str, case: str, tmp_path: Path
) -> None:
    cls = RECORDS[name]
    assert isinstance(cls, type) and issubclass(cls, FileRecord)
    golden = (GOLDEN / case).read_bytes()
    folder = RunFolder(tmp_path)
    (tmp_path / name).write_bytes(golden)
    record = folder.read_record(cls)
    (tmp_path / name).unlink()
    folder.write_record(record)
    assert (tmp_path / name).read_bytes() == golden
    assert cls.from_dict(json.loads(golden)) == record


#: (file, the golden document changed by this, the error after "<path>: ")
BAD: list[tuple[str, dict[str, object], str]] = [
    (
        "check.json",
        {"hosts": [{"host": "n", "checks": []}]},
        "hosts[0].checks must be dict, not list",
    ),
    ("check.json", {"warnings": ["a", 1]}, "warnings must be list of str, not list"),
    ("collective.json", {"links": [{"src": "a", "dst": "b"}]}, "links[0].busbw is missing"),
    ("collective.json", {"hung": {"a": None}}, "hung must be dict of str, not dict"),
    ("connect.json", {"nodes": [{"name": "n"}]}, "nodes[0].address is missing"),
    (
        "connect.json",
        {"nodes": [{"name": "n", "address": "a", "port": "22"}]},
        "nodes[0].port must be int, not str",
    ),
    ("connect.json", {"collect": []}, "collect must be dict or null, not list"),
    ("controller.json", {"pid": "4242"}, "pid must be int, not str"),
    ("controller.json", {"pid": None}, "pid must be int, not NoneType"),
    ("controller.json", {"schema": 2}, "schema is 2, not 1 (a newer fleetctl's file?)"),
    (
        "job.json",
        {"nodes": [{"rank": 0, "host": "a", "signal": "9"}]},
        "nodes[0].signal must be int or null, not str",
    ),
    ("job.json", {"first_failure": {"host": "a"}}, "first_failure.rank is missing"),
    ("plan.json", {"master_port": "29500"}, "master_port must be int, not str"),
    (
        "plan.json",
        {"nodes": [{"host": "a", "address": "a", "node_rank": "0", "argv": [], "env": {}}]},
        "nodes[0].node_rank must be int, not str",
    ),
    (
        "plan.json",
        {"nodes": [{"host": "a", "address": "a", "node_rank": 0, "env": []}]},
        "nodes[0].env must be dict, not list",
    ),
    ("ranks.json", {"ranks": {"0": {}}}, "ranks must be list, not dict"),
    (
        "ranks.json",
        {"ranks": [{"rank": 0, "node": "n", "node_rank": 0}]},
        "ranks[0].local_rank is missing",
    ),
    (
        "ranks.json",
        {"ranks": [{"rank": 0, "node": "n", "node_rank": 0, "local_rank": 0, "pid": "7"}]},
        "ranks[0].pid must be int or null, not str",
    ),
    ("ranks.json", {"ranks": ["x"]}, "ranks[0]: not a JSON object"),
    ("roles.json", {"tasks": [{"rank": 0, "role": "r", "index": 0}]}, "tasks[0].host is missing"),
    ("attempts.json", {"attempts": [{"attempt": 1}]}, "attempts[0].job_id is missing"),
    ("slurm.json", {"job_id": 42}, "job_id must be str or null, not int"),
    ("slurm.json", {"detached": "yes"}, "detached must be bool, not str"),
]


@pytest.mark.parametrize(("name", "change", "error"), BAD)
def test_a_malformed_file_is_one_line_naming_the_file_and_the_key(
    name: str, change: dict[str, object], error: str, tmp_path: Path
) -> None:
    doc = {**json.loads((GOLDEN / name).read_text()), **change}
    (tmp_path / name).write_text(json.dumps(doc))
    cls = RECORDS[name]
    assert isinstance(cls, type) and issubclass(cls, FileRecord)
    with pytest.raises(RunFolderError) as e:
        RunFolder(tmp_path).read_record(cls)
    assert str(e.value) == f"{tmp_path / name}: {error}"


def test_a_newer_fleetctls_keys_survive_and_an_older_file_reads_with_defaults(
    tmp_path: Path,
) -> None:
    folder = RunFolder(tmp_path)
    doc = {"pid": 1, "host": "h", "cgroup": "/x"}  # no start_time, boot_id; a key of later
    (tmp_path / "controller.json").write_text(json.dumps(doc))
    record = folder.read_record(files.ControllerRecord)
    assert (record.start_time, record.boot_id, record.host) == (None, None, "h")
    folder.write_record(record)
    assert json.loads((tmp_path / "controller.json").read_text()) == {
        "pid": 1,
        "start_time": None,
        "boot_id": None,
        "host": "h",
        "cgroup": "/x",
    }
    entry = {"rank": 0, "node": "n", "node_rank": 0, "local_rank": 0, "gpu": 3}
    ranks = files.RanksRecord.from_dict({"ranks": [entry]})
    assert ranks.to_dict()["ranks"] == [{**entry, "pid": None, "logs": []} | {"gpu": 3}]
    assert folder.find_record(files.RanksRecord) is None  # not there: an older run


def test_the_records_share_the_nodes_record_base() -> None:
    """One base: the supervisor's record and the run folder's files check types the same way."""
    assert issubclass(FileRecord, Record) and issubclass(SupervisorState, Record)
    with pytest.raises(RecordError, match=r"^controller.json: pid must be int, not bool$"):
        files.ControllerRecord.from_dict({"pid": True})


def test_the_commands_read_a_folder_of_the_golden_files_and_refuse_a_bad_one_in_one_line(
    tmp_path: Path,
) -> None:
    """A folder as the fleetctl before the records wrote it: ``status`` reads it; ``logs`` of
    one whose connect.json has a port as a string says so in one line naming file and key."""
    from fleetctl.testing.cli_runner import run_cli

    job = "20261122-010201-eca1bc"
    folder = tmp_path / job
    folder.mkdir()
    for name in ("controller.json", "connect.json", "ranks.json"):
        (folder / name).write_bytes((GOLDEN / name).read_bytes())
    node = {"rank": 0, "host": "gpu01", "state": "failed", "exit_code": 1}
    (folder / "job.json").write_text(
        json.dumps({"job_id": job, "status": "failed", "nodes": [node]})
    )
    res = run_cli("status", job, "--runs-dir", str(tmp_path))
    assert (res.exit_code, res.stdout) == (0, f"job {job}: failed\n  [0 gpu01] failed exit 1\n")
    connect = json.loads((folder / "connect.json").read_text())
    connect["nodes"][1]["port"] = "22"
    (folder / "connect.json").write_text(json.dumps(connect))
    res = run_cli("logs", job, "--runs-dir", str(tmp_path))
    assert res.exit_code == RunFolderError.exit_code
    assert res.stderr == (
        f"fleetctl: error: {folder / 'connect.json'}: nodes[1].port must be int, not str\n"
    )


@pytest.mark.parametrize("case", sorted(p.name for p in GOLDEN.glob("plan*.json")))
def test_the_plan_read_through_its_record_is_the_plan_as_written(case: str) -> None:
    """Full and compact (past 256 nodes; ``--dry-run --json``'s) plan.json: the record hands
    ``Plan.from_dict`` the document it always read, and an older plan (only the keys the
    first plan.json had) reads with defaults."""
    from fleetctl.plan.rankplan import Plan

    doc = json.loads((GOLDEN / case).read_text())
    assert Plan.from_dict(plan.PlanRecord.from_dict(doc).to_dict()) == Plan.from_dict(doc)
    node = {k: doc["nodes"][0][k] for k in ("host", "address", "node_rank", "argv", "env")}
    old = plan.PlanRecord.from_dict({"job_id": doc["job_id"], "nodes": [node]})
    assert Plan.from_dict(old.to_dict()).nodes[0].host == node["host"]


def test_the_plan_json_record_has_the_keys_the_plan_writes_in_their_order() -> None:
    """One list of plan.json's plan-wide keys (plan/planfile.PLAN_KEYS) makes the record's
    fields and is what the Plan writes: a plan with every optional key set writes exactly
    them, then ``nodes``; a key the Plan wrote past the list would fail here."""
    from dataclasses import replace

    from fleetctl.plan.planfile import PLAN_KEYS
    from fleetctl.plan.rankplan import Plan

    names = [f[0] for f in plan.PlanRecord.fields()]
    assert names == [*PLAN_KEYS, "nodes", "shared"]
    doc = json.loads((GOLDEN / "plan.json").read_text())
    full = replace(Plan.from_dict(doc), kind="module", folder="sub")
    assert list(full.to_dict()) == [*PLAN_KEYS, "nodes"]
    assert plan.PlanRecord.from_dict(full.to_dict()).to_dict() == full.to_dict()


def test_logs_of_a_folder_whose_plan_json_is_malformed_is_one_line_naming_it(
    tmp_path: Path,
) -> None:
    """No connect.json (an older run): ``logs`` and ``status`` find the nodes in plan.json,
    through its record: a malformed one is one line naming it, main's reads as ever."""
    from fleetctl.testing.cli_runner import run_cli

    golden = json.loads((GOLDEN / "job.json").read_text())
    folder = tmp_path / golden["job_id"]
    folder.mkdir()
    (folder / "job.json").write_bytes((GOLDEN / "job.json").read_bytes())
    doc = json.loads((GOLDEN / "plan.json").read_text())
    doc["nodes"][1]["address"] = None
    (folder / "plan.json").write_text(json.dumps(doc))
    error = f"fleetctl: error: {folder / 'plan.json'}: nodes[1].address must be str, not NoneType\n"
    res = run_cli("logs", golden["job_id"], "--runs-dir", str(tmp_path))
    assert (res.exit_code, res.stderr) == (RunFolderError.exit_code, error)
    res = run_cli("status", golden["job_id"], "--runs-dir", str(tmp_path))
    assert (res.exit_code, res.stderr) == (RunFolderError.exit_code, error)
    (folder / "plan.json").write_bytes((GOLDEN / "plan.json").read_bytes())  # as main wrote it
    res = run_cli("status", golden["job_id"], "--runs-dir", str(tmp_path))
    assert res.exit_code == 0 and res.stdout.startswith(f"job {golden['job_id']}: failed")


#: where a record's file may still be read or written as it is, and why
RAW_ALLOWED = {
    "job/records/": "the records themselves: the folder's one reader and writer",
    "remote/": "the node's side, its own folder's files (not these records)",
    "lab/": "the lab's own state files (lab/slurm.py's slurm.json is the lab cluster's)",
    "testing/": "what a test asserts is on disk, as it is",
}
_RAW_CALLS = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "load", "loads"}


def raw_accesses(path: Path, names: set[str], constants: set[str]) -> list[str]:
    """``line: call`` for each ``open``/``read_text``/``write_text``/… or ``json.load(s)`` of
    an expression naming a record's file: a string constant in ``names``, a constant of
    ``constants`` (``JOB_FILE``), a record's ``FILE``, or a name the module assigned one of
    these (``path = folder / "job.json"``, then ``path.read_text()``)."""
    tree = ast.parse(path.read_text())

    def names_a_file(node: ast.AST, tainted: set[str]) -> bool:
        for n in ast.walk(node):
            if isinstance(n, ast.Constant) and n.value in names:
                return True
            if isinstance(n, ast.Name) and (n.id in constants or n.id in tainted):
                return True
            if isinstance(n, ast.Attribute) and (n.attr == "FILE" or n.attr in constants):
                return True
        return False

    tainted: set[str] = set()
    for _ in range(3):  # a name assigned from a tainted name, and so on
        for n in ast.walk(tree):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                if names_a_file(n.value, tainted):
                    tainted |= {t.id for t in targets if isinstance(t, ast.Name)}
    out: list[str] = []
    lines: set[int] = set()
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
        if name in _RAW_CALLS and names_a_file(n, tainted) and n.lineno not in lines:
            lines.add(n.lineno)  # the outermost call of the line (ast.walk: breadth first)
            out.append(f"{n.lineno}: {ast.unparse(n)[:70]}")
    return sorted(out, key=lambda s: int(s.split(":")[0]))


def test_no_module_outside_the_records_reads_or_writes_a_records_file_raw() -> None:
    """job.json, slurm.json, … are read and written through their records (``RunFolder``:
    ``load_job``, ``read_record``, ``write_record``), so a wrong type is one line naming the
    file and the key wherever it is read, and unknown keys survive every writer."""
    from fleetctl.job.records import runfolder

    names = {n for n, cls in RECORDS.items() if isinstance(cls, type)}
    constants = {k for k, v in vars(runfolder).items() if k.isupper() and v in names}
    assert "JOB_FILE" in constants
    package = REPO / "fleetctl"
    found = [
        f"{p.relative_to(package)}:{hit}"
        for p in sorted(package.rglob("*.py"))
        if not p.relative_to(package).as_posix().startswith(tuple(RAW_ALLOWED))
        for hit in raw_accesses(p, names, constants)
    ]
    assert found == []


def test_the_raw_access_check_finds_each_shape(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text(
        "import json\n"
        "a = json.loads((folder / 'job.json').read_text())\n"
        "path = folder / JOB_FILE\n"
        "tmp = path.with_name('x')\n"
        "tmp.write_text('{}')\n"
        "b = open(folder / SlurmRecord.FILE).read()\n"
        "c = (folder / 'events.log').read_text()\n"
    )
    assert raw_accesses(planted, {"job.json"}, {"JOB_FILE"}) == [
        "2: json.loads((folder / 'job.json').read_text())",
        "5: tmp.write_text('{}')",
        "6: open(folder / SlurmRecord.FILE)",
    ]
