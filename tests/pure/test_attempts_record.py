"""attempts.json as a typed record: ``Attempt.to_dict``/``from_dict`` round-trip the current
shape, read an older file's shape (before ``run --nodes`` and the checkpoint relay) with
defaults, ignore keys they do not know, and name the file and key of a value of the wrong
type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.errors import FleetctlError, RunFolderError
from fleetctl.job.run.attempts import Attempt, _write_attempts, read_attempts

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


def test_an_older_file_reads_with_defaults_and_unknown_keys_are_ignored() -> None:
    a = Attempt.from_dict({**OLDER, "from_the_future": [1]})
    assert (a.nodes, a.left_out, a.checkpoints) == (None, None, None)
    assert a.backoff == 2.0 and isinstance(a.backoff, float)
    first = Attempt.from_dict({"attempt": 1, "job_id": "j", "folder": "/r/j", "status": "ok"})
    assert (first.ended_by, first.decision, first.retried) == (None, None, False)
    assert first.backoff is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("attempt", "2"),
        ("attempt", True),
        ("retried", 1),
        ("backoff", "1s"),
        ("nodes", ["a", 3]),
        ("left_out", {"b": 1}),
        ("checkpoints", []),
        ("status", None),
    ],
)
def test_a_value_of_the_wrong_type_names_the_file_and_the_key(key: str, value: Any) -> None:
    with pytest.raises(RunFolderError) as e:
        Attempt.from_dict({**CURRENT, key: value}, source="/runs/j/attempts.json")
    assert isinstance(e.value, FleetctlError)
    assert str(e.value).startswith("/runs/j/attempts.json: attempt ") and repr(key) in str(e.value)


def test_an_attempt_without_its_identity_is_refused() -> None:
    with pytest.raises(RunFolderError, match=r"attempts\.json: an attempt without 'job_id'"):
        Attempt.from_dict({k: v for k, v in CURRENT.items() if k != "job_id"})


def test_the_file_the_attempt_loop_writes_reads_back(tmp_path: Path) -> None:
    attempts = [Attempt.from_dict(OLDER), Attempt.from_dict(CURRENT)]
    _write_attempts(tmp_path, attempts)
    assert read_attempts(tmp_path) == attempts
    (tmp_path / "attempts.json").write_text('{"attempts": {"attempt": 1}}')
    with pytest.raises(RunFolderError, match="'attempts' is not a list of objects"):
        read_attempts(tmp_path)
    with pytest.raises(RunFolderError, match="not found"):
        read_attempts(tmp_path / "none")
