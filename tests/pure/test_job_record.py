"""job.json as one type (``fleetctl.job.records.jobrecord``): files of every age read back and
written again unchanged, a value of the wrong type refused in one line naming the file and the
key, and the attached run's writer and every reader agreeing on the shape."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fleetctl.errors import RunFolderError
from fleetctl.job.records.jobrecord import FailureRecord, JobRecord, NodeRecord
from fleetctl.job.records.result import JobResult, NodeOutcome
from fleetctl.job.records.runfolder import RunFolder, list_runs

SAMPLES = Path(__file__).parent / "job_records"
FILES = sorted(SAMPLES.glob("*.json"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_sample_round_trips(path: Path, tmp_path: Path) -> None:
    data = json.loads(path.read_text())
    record = JobRecord.from_dict(data, str(path))
    out = record.to_dict()
    # every key of the file comes back with its value (unknown ones too); what the record
    # adds is only the defaults of keys the file predates
    assert _same_or_defaults(out, data), json.dumps(out, indent=1)
    assert JobRecord.from_dict(out) == record
    folder = RunFolder.create(tmp_path, record.job_id)
    folder.write_job(record)
    assert folder.load_job() == record


def _same_or_defaults(out: object, data: object) -> bool:
    if isinstance(data, dict) and isinstance(out, dict):
        return (
            data.keys() <= out.keys()
            and all(_same_or_defaults(out[k], v) for k, v in data.items())
            and all(out[k] in (None, [], False) for k in out.keys() - data.keys())
        )
    if isinstance(data, list) and isinstance(out, list):
        return len(out) == len(data) and all(map(_same_or_defaults, out, data))
    return out == data and type(out) is type(data)


def test_an_old_file_reads_with_defaults() -> None:
    record = JobRecord.from_dict(json.loads((SAMPLES / "v0_failed.json").read_text()))
    assert record.phases == [] and record.nccl_traces == [] and record.monitor is None
    assert [n.problem for n in record.nodes] == [None, None]
    assert record.first_failure == FailureRecord(
        rank=1,
        host="gpu02",
        address="10.0.0.2",
        state="failed",
        exit_code=1,
        reason=None,
        time="2025-11-01T12:00:05.320Z",
        after=2.2,
    )
    assert not record.live and record.node(1) is record.nodes[1]
    minimal = JobRecord.from_dict({"job_id": "j", "status": "running"})
    assert minimal.live and minimal.nodes == [] and minimal.attempt == 1


def test_unknown_keys_are_kept_at_every_level() -> None:
    record = JobRecord.from_dict(json.loads((SAMPLES / "detached_monitored.json").read_text()))
    assert record.extra == {"queued_by": "a newer fleetctl"}
    assert record.first_failure is not None
    assert record.first_failure.extra == {"found_by": "monitor"}
    node = NodeRecord.from_dict({"rank": 0, "host": "a", "gpu_temp": 71})
    assert node.extra == {"gpu_temp": 71} and node.to_dict()["gpu_temp"] == 71


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"status": 3}, "{f}: status must be str, not int"),
        ({"attempt": "2"}, "{f}: attempt must be int, not str"),
        ({"attempt": True}, "{f}: attempt must be int, not bool"),
        ({"detached": 1}, "{f}: detached must be bool, not int"),
        ({"duration": "6.4"}, "{f}: duration must be float or null, not str"),
        ({"nodes": {"0": {}}}, "{f}: nodes must be list, not dict"),
        (
            {"nodes": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b", "exit_code": "1"}]},
            "{f}: nodes[1].exit_code must be int or null, not str",
        ),
        ({"nodes": [{"rank": "0", "host": "a"}]}, "{f}: nodes[0].rank must be int, not str"),
        ({"nodes": [{"host": "a"}]}, "{f}: nodes[0].rank is missing"),
        ({"nodes": ["a"]}, "{f}: nodes[0]: not a JSON object"),
        (
            {"first_failure": {"rank": 1, "after": "2 s"}},
            "{f}: first_failure.after must be float or null, not str",
        ),
        ({"first_failure": [1]}, "{f}: first_failure must be dict or null, not list"),
        ({"errors": ["x", 2]}, "{f}: errors must be list of str, not list"),
        ({"collected": ["0-a"]}, "{f}: collected must be list of dict, not list"),
        ({"left_out": {"n2": 7}}, "{f}: left_out must be dict of str or null, not dict"),
        ({"monitor": 4242}, "{f}: monitor must be dict or null, not int"),
        (
            {"attempts": [{"attempt": 1, "job_id": "j", "folder": "/r/j"}]},
            "{f}: attempts[0].status is missing",
        ),
        ({"schema": 2}, "{f}: schema is 2, not 1 (a newer fleetctl's file?)"),
    ],
)
def test_a_wrong_type_is_refused_in_one_line(tmp_path: Path, change: dict, message: str) -> None:
    folder = RunFolder.create(tmp_path, "j")
    path = folder.path / "job.json"
    path.write_text(json.dumps({"job_id": "j", "status": "failed", **change}))
    with pytest.raises(RunFolderError) as e:
        folder.load_job()
    assert str(e.value) == message.format(f=path)
    assert "\n" not in str(e.value)
    assert list_runs(tmp_path) == []  # one bad job.json never hides the others (none here)


def test_a_record_without_its_identity_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match=r"^x.json: status is missing$"):
        JobRecord.from_dict({"job_id": "j"}, source="x.json")
    with pytest.raises(RunFolderError, match=r"^x.json: not a JSON object$"):
        JobRecord.from_dict(["j"], source="x.json")


def test_the_attached_runs_result_is_written_and_read_as_the_same_record(tmp_path: Path) -> None:
    folder = RunFolder.create(tmp_path, "j")
    result = JobResult("j", folder.path, status="failed", launcher="plain", started=100.0)
    result.nodes = [
        NodeOutcome(0, "a", "10.0.0.1", state="stopped", signal=15, start_time=100.5),
        NodeOutcome(1, "b", "10.0.0.2", state="failed", exit_code=1, end_time=102.0),
    ]
    result.first_failure, result.failure_time, result.ended = 1, 102.0, 103.0
    record = result.to_record()
    assert record.to_dict() == json.loads(json.dumps(result.to_dict()))  # what --json prints
    folder.write_job(record)
    back = folder.load_job()
    assert back == record and back.status == "failed" and back.duration == 3.0
    assert back.first_failure is not None and back.first_failure.after == 2.0
    assert [(n.rank, n.state) for n in back.nodes] == [(0, "stopped"), (1, "failed")]


def test_runs_lists_every_readable_record_and_leaves_out_a_mistyped_one(tmp_path: Path) -> None:
    import fleetctl

    for path in FILES:
        data = json.loads(path.read_text())
        RunFolder.create(tmp_path, data["job_id"]).write_job(JobRecord.from_dict(data))
    bad = RunFolder.create(tmp_path, "20260401-000000-bad000")
    (bad.path / "job.json").write_text('{"job_id": "20260401-000000-bad000", "status": 0}')
    rows = fleetctl.runs(tmp_path)
    assert [(r.job_id, r.status, r.nodes) for r in rows] == [
        ("20251101-120000-a1b2c3", "failed", 2),
        ("20260301-080000-ffee00", "failed", 2),
        ("20261126-114601-77068d", "succeeded", 1),
    ]
    assert rows[0].first_failure == "node 1 (gpu02): exit code 1 after 2.2 s"
    assert rows[1].first_failure == "node 0 (n0): lost (unreachable for 61s) after 656.0 s"
    assert rows[1].left_out == {"n2": "check failed: GPU count 7, not 8"}


READERS = ["job/monitor/handle.py", "job/records/runs.py", "job/monitor/watch.py"]
READERS += ["job/monitor/process.py", "api/job.py", "api/result.py", "cli/jobs_cmd.py"]


@pytest.mark.parametrize("module", READERS)
def test_no_reader_takes_job_json_as_a_raw_dict(module: str) -> None:
    """``.get``/``[...]`` on a loaded job.json is gone: readers go through JobRecord."""
    root = Path(__file__).resolve().parents[2] / "fleetctl"
    tree = ast.parse((root / module).read_text())
    bad = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "get":
                target = node.func.value
        elif isinstance(node, ast.Subscript):
            target = node.value
        if target is None:
            continue
        text = ast.unparse(target)
        if text.endswith(("load_job()", ".job")) or text in ("job", "doc"):
            bad.append(f"{module}:{node.lineno}: {ast.unparse(node)[:60]}")
    assert bad == []
