"""attempts.json as a typed record (``AttemptsRecord``, ``Attempt`` per attempt, on the run
folder's record base): round-trips the current shape, reads an older file's shape (before ``run
--nodes`` and the checkpoint relay) with defaults, keeps keys it does not know, and names the
file and key of a value of the wrong type (the golden file: tests/pure/records/attempts.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.errors import FleetctlError, RunFolderError
from fleetctl.job.records.attempts import Attempt
from fleetctl.job.run.attempts import _write_attempts, read_attempts

CURRENT = {
    "attempt": 2,
    "job_id": "j.2",
    "folder": "/runs/j.2",
    "status": "failed",
    "ended_by": "rank 3 on b: exit 1",
    "decision": "retryable: lost a node; retrying in 1.0s",
    "retried": True,
    "backoff": 1.0,
    "nodes": ["a", "c"],
    "left_out": {"b": "failed its check"},
    "checkpoints": {"files": 2, "bytes": 10, "via": "upload"},
    "membership": [{"rank": 2, "left": "c", "joined": None, "world": 2}],
}
# before run --nodes (0bc97f7) and the relay: no nodes, left_out, checkpoints
OLDER = {k: CURRENT[k] for k in list(CURRENT)[:8]} | {"backoff": 2}


def test_the_current_shape_round_trips() -> None:
    a = Attempt.from_dict(json.loads(json.dumps(CURRENT)))
    assert a.to_dict() == CURRENT
    assert Attempt.from_dict(a.to_dict()) == a


def test_an_older_file_reads_with_defaults_and_unknown_keys_are_kept() -> None:
    a = Attempt.from_dict({**OLDER, "from_the_future": [1]})
    assert (a.nodes, a.left_out, a.checkpoints) == (None, None, None)
    assert a.backoff == 2.0 and isinstance(a.backoff, float)
    assert a.to_dict()["from_the_future"] == [1]
    first = Attempt.from_dict({"attempt": 1, "job_id": "j", "folder": "/r/j", "status": "ok"})
    assert (first.ended_by, first.decision, first.retried) == (None, None, False)
    assert first.backoff is None


def in_file(tmp_path: Path, *attempts: dict[str, Any]) -> Path:
    (tmp_path / "attempts.json").write_text(json.dumps({"attempts": list(attempts)}))
    return tmp_path


@pytest.mark.parametrize(
    ("key", "value", "error"),
    [
        ("attempt", "2", "attempt must be int, not str"),
        ("attempt", True, "attempt must be int, not bool"),
        ("retried", 1, "retried must be bool, not int"),
        ("backoff", "1s", "backoff must be float or null, not str"),
        ("nodes", ["a", 3], "nodes must be list of str or null, not list"),
        ("left_out", {"b": 1}, "left_out must be dict of str or null, not dict"),
        ("checkpoints", [], "checkpoints must be dict or null, not list"),
        ("status", None, "status must be str, not NoneType"),
    ],
)
def test_a_value_of_the_wrong_type_names_the_file_and_the_key(
    tmp_path: Path, key: str, value: Any, error: str
) -> None:
    with pytest.raises(RunFolderError) as e:
        read_attempts(in_file(tmp_path, CURRENT, {**CURRENT, key: value}))
    assert isinstance(e.value, FleetctlError)
    assert str(e.value) == f"{tmp_path / 'attempts.json'}: attempts[1].{error}"


def test_an_attempt_without_its_identity_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match=r"attempts\.json: attempts\[0\]\.job_id is missing$"):
        read_attempts(in_file(tmp_path, {k: v for k, v in CURRENT.items() if k != "job_id"}))


def test_the_file_the_attempt_loop_writes_reads_back(tmp_path: Path) -> None:
    attempts = [Attempt.from_dict(OLDER), Attempt.from_dict(CURRENT)]
    _write_attempts(tmp_path, attempts)
    assert read_attempts(tmp_path) == attempts
    (tmp_path / "attempts.json").write_text('{"attempts": {"attempt": 1}}')
    with pytest.raises(RunFolderError, match="attempts must be list, not dict"):
        read_attempts(tmp_path)
    (tmp_path / "attempts.json").write_text('{"attempts": [3]}')
    with pytest.raises(RunFolderError, match=r"attempts\[0\]: not a JSON object"):
        read_attempts(tmp_path)
    with pytest.raises(RunFolderError, match="not found"):
        read_attempts(tmp_path / "none")
