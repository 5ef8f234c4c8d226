"""Honest exit codes: a job that succeeded but whose logs did not all come home is not exit 0
(``fleetctl run`` and ``fleetctl collect`` exit 4, naming the hosts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from fleetctl.errors import LogsIncomplete
from fleetctl.job.records.result import JobResult
from fleetctl.job.records.state import JobStatus
from fleetctl.phases.collect import NodeCollect
from fleetctl.testing.cli_runner import run_cli


def _collected(tmp_path: Path, *, lost: bool) -> list[NodeCollect]:
    ok = NodeCollect("node1", 0, str(tmp_path / "0-node1"), files=["supervisor.json"])
    two = NodeCollect("node2", 1, str(tmp_path / "1-node2"), files=["supervisor.json"])
    if lost:
        two.skipped = "node lost: not reachable"
    return [ok, two]


@pytest.mark.parametrize(("lost", "code"), [(False, 0), (True, 4)])
def test_a_succeeded_job_with_logs_missing_exits_4(tmp_path: Path, lost: bool, code: int) -> None:
    r = JobResult("j", tmp_path, status=JobStatus.SUCCEEDED)
    r.collected = _collected(tmp_path, lost=lost)
    assert r.exit_code == code == (LogsIncomplete.exit_code if lost else 0)
    assert r.logs_incomplete == (["node2"] if lost else [])


def test_a_failed_job_stays_3_whatever_its_logs(tmp_path: Path) -> None:
    r = JobResult("j", tmp_path, status=JobStatus.FAILED)
    r.collected = _collected(tmp_path, lost=True)
    assert r.exit_code == 3


class _Handle:
    """``JobHandle`` as ``fleetctl collect`` uses it, with one node that stays unreachable."""

    results: ClassVar[list[NodeCollect]] = []

    def __init__(self, runs_dir: str, job: str, settings: Any = None) -> None:
        self.job_id = job
        self.job = type("J", (), {"status": "succeeded"})()

    def __enter__(self) -> _Handle:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def collect_options(self) -> Any:
        from fleetctl.phases.collect import CollectOptions

        return CollectOptions()

    def collect(self, options: Any = None) -> list[NodeCollect]:
        return self.results


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize(("lost", "code"), [(False, 0), (True, 4)])
def test_collect_exits_non_zero_while_a_node_stays_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost: bool, code: int, as_json: bool
) -> None:
    import fleetctl.job.monitor.handle
    from fleetctl.api import Job

    monkeypatch.setattr(_Handle, "results", _collected(tmp_path, lost=lost))
    monkeypatch.setattr(fleetctl.job.monitor.handle, "JobHandle", _Handle)
    found = classmethod(lambda cls, job, runs_dir, **kw: cls._found(job, runs_dir, None))
    monkeypatch.setattr(Job, "attach", found)
    res = run_cli("collect", *(["--json"] if as_json else []), "20260101-000000-abcdef")
    assert res.exit_code == code, res.stdout + res.stderr
    assert ("logs still incomplete from node2" in res.stderr) == lost
