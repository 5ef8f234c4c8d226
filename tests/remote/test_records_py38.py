"""The supervisor's typed records (``fleetctl/remote/kit/records.py``): golden cases read the same
by the controller's python and by Python 3.8 (the node's oldest), and a supervisor that refuses a
spec of the wrong shape with the record's own message.

Tolerant of older documents (missing keys take their defaults, unknown keys are ignored),
strict about types (a wrong type names the record and the key).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import node_tree

from fleetctl import remote
from fleetctl.phases.frames import FrameReader
from fleetctl.remote.kit.records import RecordError, SupervisorSpec, SupervisorState, read_state

MIN_SPEC = {"job_id": "j", "argv": ["python3", "x.py"], "run_dir": "/r/0-n1"}
FULL_SPEC = {
    **MIN_SPEC,
    "node_rank": 1,
    "env": {"A": "1"},
    "cwd": "/w/j",
    "work": "/w/j",
    "work_seed": "/c/abc",
    "files": {"job.py": "print(1)"},
    "path_prepend": ["/e/bin"],
    "deadman": 3.0,
    "grace": 2.0,
    "heartbeat": 0.5,
    "detach": False,
    "reattach": True,
    "rank_logs": {"dir": "log", "base": 2, "files": ["x"]},
    "one_process": False,
    "container": {"list": ["podman", "ps"], "stop": [], "remove": []},
    "collect": {"cap": 10},
    "pace": {"report": 2.0},
}
SPEC_DEFAULTS = {
    "node_rank": 0,
    "env": {},
    "cwd": None,
    "work": None,
    "work_seed": None,
    "files": {},
    "path_prepend": [],
    "deadman": 10.0,
    "grace": 5.0,
    "heartbeat": 1.0,
    "detach": False,
    "reattach": False,
    "rank_logs": None,
    "one_process": False,
    "container": None,
    "collect": None,
    "pace": None,
}
#: (record, document) -> what from_dict(...).to_dict() gives, or the RecordError's message
CASES: list[tuple[str, object, object]] = [
    ("spec", FULL_SPEC, FULL_SPEC),
    ("spec", MIN_SPEC, {**MIN_SPEC, **SPEC_DEFAULTS}),  # an older spec: defaults
    ("spec", {**MIN_SPEC, "newer_key": 1}, {**MIN_SPEC, **SPEC_DEFAULTS}),  # ignored
    ("spec", {**MIN_SPEC, "grace": 1}, {**MIN_SPEC, **SPEC_DEFAULTS, "grace": 1.0}),
    ("spec", {**MIN_SPEC, "node_rank": "1"}, "supervisor spec: node_rank must be int, not str"),
    ("spec", {**MIN_SPEC, "node_rank": True}, "supervisor spec: node_rank must be int, not bool"),
    ("spec", {**MIN_SPEC, "deadman": None}, "supervisor spec: deadman must be float, not NoneType"),
    ("spec", {**MIN_SPEC, "detach": 1}, "supervisor spec: detach must be bool, not int"),
    ("spec", {**MIN_SPEC, "argv": ["a", 1]}, "supervisor spec: argv must be list of str, not list"),
    ("spec", {**MIN_SPEC, "env": {"A": 1}}, "supervisor spec: env must be dict of str, not dict"),
    ("spec", {**MIN_SPEC, "cwd": 5}, "supervisor spec: cwd must be str or null, not int"),
    ("spec", {**MIN_SPEC, "argv": []}, "supervisor spec: needs argv and job_id"),
    ("spec", {"job_id": "j", "argv": ["a"]}, "supervisor spec: run_dir is missing"),
    ("spec", ["not", "a", "dict"], "supervisor spec: not a JSON object"),
    # supervisor.json of an older supervisor: no dropped_frames, exit_report, containers
    (
        "state",
        {"job_id": "j", "state": "exited", "exit_code": 0, "pid": 7},
        {"job_id": "j", "state": "exited", "exit_code": 0, "pid": 7},
    ),
    ("state", {"exit_code": "0"}, "supervisor.json: exit_code must be int or null, not str"),
    ("state", {"end_time": 12}, {"end_time": 12.0}),
]
STATE_DEFAULTS = SupervisorState().to_dict()


def expected(kind: str, want: object) -> object:
    if kind == "state" and isinstance(want, dict):
        return {**STATE_DEFAULTS, **want}
    return want


def read_here(kind: str, doc: object) -> object:
    cls = SupervisorSpec if kind == "spec" else SupervisorState
    try:
        return cls.from_dict(doc).to_dict()
    except RecordError as e:
        return str(e)


#: Run by Python 3.8 with the node module itself (flat import, as on a node): each case's answer.
SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit.records import RecordError, SupervisorSpec, SupervisorState
out = []
for kind, doc in json.load(sys.stdin):
    cls = SupervisorSpec if kind == "spec" else SupervisorState
    try:
        out.append(cls.from_dict(doc).to_dict())
    except RecordError as e:
        out.append(str(e))
print(json.dumps(out))
"""


@pytest.mark.parametrize(("kind", "doc", "want"), CASES)
def test_the_records_read_older_documents_and_refuse_wrong_types(
    kind: str, doc: object, want: object
) -> None:
    assert read_here(kind, doc) == expected(kind, want)


def test_python_3_8_reads_every_record_case_as_the_controller_does(py38: str) -> None:
    docs = [[kind, doc] for kind, doc, _ in CASES]
    res = subprocess.run(
        [py38, "-S", "-c", SCRIPT, node_tree()],
        input=json.dumps(docs).encode(),
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr.decode()
    assert json.loads(res.stdout) == [expected(kind, want) for kind, _, want in CASES]


def test_a_record_round_trips_and_read_state_is_lenient_about_missing_files(
    tmp_path: Path,
) -> None:
    spec = SupervisorSpec.from_dict(FULL_SPEC)
    assert SupervisorSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert read_state(str(tmp_path / "none.json")) is None
    (tmp_path / "cut.json").write_text('{"state": "runn')  # a write cut short
    assert read_state(str(tmp_path / "cut.json")) is None
    (tmp_path / "bad.json").write_text('{"pid": "7"}')
    with pytest.raises(RecordError, match="pid must be int or null, not str"):
        read_state(str(tmp_path / "bad.json"))


def test_the_supervisor_refuses_a_spec_of_the_wrong_shape_by_its_key(
    py38: str, tmp_path: Path
) -> None:
    """The node reads the spec through the record: no defaulting on a value of the wrong type,
    the ``F`` frame names the key, ``X 127``."""
    spec = {**MIN_SPEC, "run_dir": str(tmp_path / "r"), "grace": "soon"}
    res = subprocess.run(
        [py38, remote.NO_SITE, "-c", remote.inline("supervisor.py"), "run"],
        input=json.dumps(spec).encode() + b"\n",
        capture_output=True,
        timeout=60,
    )
    reader = FrameReader()
    frames = reader.feed(res.stdout) + reader.flush()
    kinds = [(f.kind, f.text) for f in frames]
    assert ("F", "bad spec: supervisor spec: grace must be float, not str") in kinds, kinds
    assert kinds[-1] == ("X", "127")
    assert not (tmp_path / "r").exists()
