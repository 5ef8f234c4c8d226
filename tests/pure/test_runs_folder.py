"""The controller run folder: private, atomic job.json, events.log, found again by id."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fleetctl.job.records.attempts import Attempt, AttemptsRecord
from fleetctl.job.records.files import ConnectRecord, RolesRecord
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.runfolder import RunFolder, RunFolderError, iso, list_runs, load_run


def test_a_run_folder_is_private_and_never_reused(tmp_path: Path) -> None:
    f = RunFolder.create(tmp_path / "fleet-runs", "20260101-000000-aaaaaa")
    assert oct(f.path.stat().st_mode & 0o777) == "0o700"
    assert oct(f.path.parent.stat().st_mode & 0o777) == "0o700"
    with pytest.raises(RunFolderError, match="already exists"):
        RunFolder.create(tmp_path / "fleet-runs", "20260101-000000-aaaaaa")


def test_two_runs_starting_together_both_get_their_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runs dir made by a peer between "does it exist?" and mkdir is not our folder clashing.

    Two `fleetctl run` started in the same second into a fresh --runs-dir once failed with
    "run folder already exists" for a job id nobody had used.
    """
    root = tmp_path / "fleet-runs"
    real_mkdir = Path.mkdir

    def peer_wins(self: Path, *args: object, **kwargs: object) -> None:
        if self == root and not root.exists():
            os.mkdir(root, 0o700)  # the other run, a moment earlier
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", peer_wins)
    f = RunFolder.create(root, "20260101-000000-bbbbbb")
    assert f.path.is_dir() and f.path.parent == root


def test_job_plan_and_events_are_written_and_read_back(tmp_path: Path) -> None:
    f = RunFolder.create(tmp_path, "j1")
    f.write_plan({"job_id": "j1", "nodes": []})
    f.write_job(JobRecord.from_dict({"job_id": "j1", "status": "running"}))
    f.write_job(JobRecord.from_dict({"job_id": "j1", "status": "failed"}))
    f.event("exit [1 node2] exit code 1\nsecond line", ts=0.5)
    assert f.load_job().status == "failed" and f.load_plan().job_id == "j1"
    assert (f.path / "events.log").read_text() == (
        "1970-01-01T00:00:00.500Z exit [1 node2] exit code 1 second line\n"
    )
    assert oct((f.path / "job.json").stat().st_mode & 0o777) == "0o600"
    assert [p.name for p in f.path.iterdir() if p.name.startswith(".")] == []  # no temp left
    assert f.node_folder(1, "node2") == f.path / "1-node2"


def test_runs_are_listed_oldest_first_and_found_by_unique_prefix(tmp_path: Path) -> None:
    for job_id, status in (
        ("20260102-000000-bbbbbb", "failed"),
        ("20260101-000000-aaaaaa", "succeeded"),
    ):
        RunFolder.create(tmp_path, job_id).write_job(
            JobRecord.from_dict({"job_id": job_id, "status": status})
        )
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "job.json").write_text("{")
    assert [r.status for r in list_runs(tmp_path)] == ["succeeded", "failed"]
    assert load_run(tmp_path, "20260102").job_id == "20260102-000000-bbbbbb"
    with pytest.raises(RunFolderError, match="ambiguous"):
        load_run(tmp_path, "2026")
    with pytest.raises(RunFolderError, match="no job"):
        load_run(tmp_path, "nope")
    assert json.loads((tmp_path / "20260101-000000-aaaaaa" / "job.json").read_text())


def test_times_are_iso_utc_with_milliseconds() -> None:
    assert iso(None) is None
    assert iso(86400.25) == "1970-01-02T00:00:00.250Z"


def test_a_run_folder_lock_held_too_long_is_an_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl
    import os

    from fleetctl.errors import RunFolderError
    from fleetctl.job.records import runfolder as runs

    folder = runs.RunFolder.create(tmp_path, "j-lock")
    monkeypatch.setattr(runs, "LOCK_TIMEOUT", 0.3)
    fd = os.open(folder.path, os.O_RDONLY | os.O_DIRECTORY)  # another fleetctl holding it
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(RunFolderError, match="locked by another fleetctl"), folder.locked():
            pass
    finally:
        os.close(fd)
    with folder.locked():  # released: taken at once
        pass


@pytest.mark.parametrize("given", ["../../x", "/etc", "*3223*", "a/b", "", ".hidden", "x..y"])
def test_a_job_id_that_is_not_an_id_is_refused_before_any_path_is_read(
    tmp_path: Path, given: str
) -> None:
    from fleetctl.errors import UsageError

    outside = tmp_path / "x"
    outside.mkdir()
    (outside / "job.json").write_text('{"job_id": "x"}')
    runs = tmp_path / "a" / "b"
    runs.mkdir(parents=True)
    with pytest.raises(UsageError, match="is not a job id"):
        load_run(runs, given)


def test_one_broken_job_json_never_hides_the_other_runs(tmp_path: Path) -> None:
    good = RunFolder.create(tmp_path, "20260101-000000-aaaa")
    good.write_job(JobRecord.from_dict({"job_id": good.job_id, "status": "succeeded"}))
    deep = RunFolder.create(tmp_path, "20260101-000001-bbbb")
    (deep.path / "job.json").write_text("[" * 100_000 + "]" * 100_000)
    bad = RunFolder.create(tmp_path, "20260101-000002-cccc")
    (bad.path / "job.json").write_text("{not json")
    assert [j.job_id for j in list_runs(tmp_path)] == [good.job_id]
    with pytest.raises(RunFolderError, match="unreadable"):
        deep.load_job()


def test_every_record_file_is_written_whole_private_and_with_no_temp_file_left(
    tmp_path: Path,
) -> None:
    folder = RunFolder.create(tmp_path, "j")
    folder.write_plan({"job_id": "j"})
    folder.write_job(JobRecord.from_dict({"job_id": "j", "status": "running"}))
    folder.write_record(ConnectRecord())
    folder.write_record(
        AttemptsRecord(attempts=[Attempt(attempt=1, job_id="j", folder="/r/j", status="failed")])
    )
    folder.write_record(RolesRecord())
    folder.write_streamed_console(1, "node/2", ["a", "b"])
    with folder.editing_job() as job:
        job.status = "failed"
    assert folder.load_job().status == "failed"
    files = sorted(p.relative_to(folder.path).as_posix() for p in folder.path.rglob("*"))
    assert files == [
        "1-node_2",
        "1-node_2/console.streamed.log",
        "attempts.json",
        "connect.json",
        "controller.json",
        "job.json",
        "plan.json",
        "roles.json",
    ]
    for p in folder.path.rglob("*"):
        assert p.stat().st_mode & 0o077 == 0, p
    assert (folder.path / "1-node_2" / "console.streamed.log").read_text() == "a\nb\n"


def test_a_failed_edit_leaves_job_json_as_it_was(tmp_path: Path) -> None:
    folder = RunFolder.create(tmp_path, "j")
    folder.write_job(JobRecord.from_dict({"job_id": "j", "status": "running"}))
    with pytest.raises(KeyError), folder.editing_job() as job:
        job.status = "failed"
        raise KeyError("boom")
    assert folder.load_job().status == "running"
