"""One result protocol (``ok``, ``exit_code``, ``failed`` host → what went wrong, ``to_dict``)
for a job run directly, a job submitted with sbatch, and a fan-out; one ``Job`` handle for
both executors, told apart by the run folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.api import Fleet, Job, RunResult
from fleetctl.api.submitted import Submitted, log_line
from fleetctl.errors import Interrupted, JobFailed, LogsIncomplete
from fleetctl.job.records.files import SlurmRecord
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.results import Cancelled, CommandResult, FleetResult, Outcome
from fleetctl.slurm.batch import SlurmJobFailed
from fleetctl.slurm.queue import JobInfo

FAILED = {
    "job_id": "j1", "status": "failed", "launcher": "plain",
    "nodes": [
        {"rank": 0, "host": "node1", "state": "stopped", "exit_code": None, "signal": 15},
        {"rank": 1, "host": "node2", "state": "failed", "exit_code": 7},
        {"rank": 2, "host": "node3", "state": "lost", "reason": "no answer for 60 s"},
    ],
    "first_failure": {"rank": 1, "host": "node2", "state": "failed", "exit_code": 7},
}  # fmt: skip
SUCCEEDED = {
    "job_id": "j1", "status": "succeeded",
    "nodes": [{"rank": 0, "host": "node1", "state": "succeeded", "exit_code": 0}],
}  # fmt: skip


def _folder(tmp_path: Path, record: dict[str, Any], *, slurm: str | None = None) -> RunFolder:
    run = RunFolder.create(tmp_path, "j1")
    run.write_job(JobRecord.from_dict({**record, "folder": str(run.path)}))
    if slurm is not None:
        run.write_slurm(SlurmRecord(job_id=slurm, state="RUNNING"), "#!/bin/sh\n")
    return run


@pytest.mark.parametrize(
    ("record", "ok", "code", "failed", "error"),
    [
        (SUCCEEDED, True, 0, {}, None),
        (
            FAILED,
            False,
            3,
            {"node2": "exit code 7", "node3": "lost (no answer for 60 s)"},
            JobFailed,
        ),
        ({**FAILED, "status": "interrupted", "first_failure": None}, False, 130, None, Interrupted),
    ],
)
def test_a_jobs_verdict_answers_the_one_result_protocol(
    tmp_path: Path,
    record: dict[str, Any],
    ok: bool,
    code: int,
    failed: dict[str, str] | None,
    error: type[Exception] | None,
) -> None:
    result = RunResult.from_record(record, tmp_path)
    assert isinstance(result, Outcome)
    assert (result.ok, result.exit_code) == (ok, code)
    if failed is not None:
        assert result.failed == failed
    doc = json.loads(json.dumps(result.to_dict()))
    assert (doc["ok"], doc["exit_code"], doc["failed"]) == (ok, code, result.failed)
    assert "slurm" not in doc  # only a submitted job's result names its Slurm job
    err = result.error()
    assert (type(err) if err is not None else None) is error
    if err is not None:
        assert str(err).startswith("job j1: ") and err.exit_code == code


def test_logs_incomplete_is_exit_4_with_its_own_error(tmp_path: Path) -> None:
    result = RunResult.from_record(SUCCEEDED, tmp_path, exit_code=4)
    assert not result.ok and result.failed == {}
    assert isinstance(result.error(), LogsIncomplete)


def test_a_fan_out_answers_the_same_protocol() -> None:
    res: FleetResult[CommandResult] = FleetResult(
        {
            "a": CommandResult("true", 0, "hi\n"),
            "b": RuntimeError("connection refused"),
            "c": Cancelled("another node failed"),
        }
    )
    assert isinstance(res, Outcome)
    assert (res.ok, res.exit_code, list(res.failed)) == (False, 1, ["b"])
    doc = json.loads(json.dumps(res.to_dict()))
    assert doc["failed"] == {"b": "connection refused"}
    assert doc["nodes"]["a"] == {"ok": True, "value": CommandResult("true", 0, "hi\n").to_dict()}
    assert doc["nodes"]["c"]["cancelled"] is True
    assert FleetResult({"a": 1}).to_dict()["exit_code"] == 0


def test_a_submitted_jobs_verdict_is_returned_not_raised_with_its_slurm_job(
    tmp_path: Path,
) -> None:
    run = _folder(tmp_path, FAILED, slurm="42")
    sub = Submitted(run, "42", SlurmRecord(job_id="42"), client=object())  # type: ignore[arg-type]
    result = sub.verdict(JobInfo("42", "FAILED", exit_code=3))
    assert (result.ok, result.exit_code, result.slurm) == (
        False,
        3,
        {"job_id": "42", "state": "FAILED"},
    )
    assert result.failed == {"node2": "exit code 7", "node3": "lost (no answer for 60 s)"}
    err = sub.error(result)
    assert isinstance(err, SlurmJobFailed) and err.exit_code == 3
    assert str(err) == "job j1 (Slurm job 42, FAILED): node 1 (node2): exit code 7"
    assert result.to_dict()["slurm"] == {"job_id": "42", "state": "FAILED"}
    run.write_job(JobRecord.from_dict({**SUCCEEDED, "folder": str(run.path)}))
    done = sub.verdict(JobInfo("42", "COMPLETED", exit_code=0))
    assert (done.ok, done.exit_code, sub.error(done)) == (True, 0, None)


class _Forgotten:
    """A Slurm that no longer knows the job (``MinJobAge`` passed)."""

    def show(self, job: str) -> None:
        return None


def test_waiting_on_a_job_slurm_has_forgotten_reads_the_run_folder(tmp_path: Path) -> None:
    run = _folder(tmp_path, FAILED, slurm="42")
    sub = Submitted(run, "42", SlurmRecord(job_id="42", state="COMPLETED"), client=_Forgotten())  # type: ignore[arg-type]
    result = sub.wait()
    assert (result.ok, result.exit_code, result.slurm) == (
        False,
        3,
        {"job_id": "42", "state": "COMPLETED"},
    )
    run.write_job(JobRecord.from_dict({**SUCCEEDED, "folder": str(run.path)}))
    assert sub.wait().ok
    run.write_job(JobRecord(job_id="j1", status="queued", folder=str(run.path)))
    with pytest.raises(JobFailed, match=r"job 42 ended COMPLETED \(last seen\) before fleetctl"):
        sub.wait()


def test_attach_tells_the_executor_from_the_run_folder(tmp_path: Path) -> None:
    run = _folder(tmp_path, {**SUCCEEDED, "executor": "sbatch"}, slurm="42")
    job = Job.attach("j1", tmp_path)
    assert (job.executor, job.record.executor) == ("sbatch", "sbatch")
    assert job.submitted is not None and job.submitted.slurm_job_id == "42"
    # a folder from before the field: slurm.json alone says it was submitted
    with run.editing_job() as rec:
        rec.executor = None
    assert "executor" not in json.loads((run.path / "job.json").read_text())
    assert Job.attach("j1", tmp_path).executor == "sbatch"
    (run.path / "slurm.json").unlink()
    direct = Job.attach("j1", tmp_path)
    assert (direct.executor, direct.submitted) == ("direct", None)


@pytest.mark.parametrize(
    ("text", "rank", "host", "said"),
    [
        ("[0 node1] started 0", 0, "node1", "started 0"),
        ("[12 gpu-7.cluster] loss 0.5 [x]", 12, "gpu-7.cluster", "loss 0.5 [x]"),
        ("\x1b[36m[1 node2]\x1b[0m hi", 1, "node2", "hi"),
        ("fleetctl: launching plain on 3 node(s), job j1", -1, "", None),
        ("[not a node] x", -1, "", None),
    ],
)
def test_a_batch_scripts_line_becomes_a_log_line(
    text: str, rank: int, host: str, said: str | None
) -> None:
    line = log_line(text)
    assert (line.node_rank, line.host, line.text) == (rank, host, text if said is None else said)


def test_from_environment_takes_the_allocation_only_inside_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        monkeypatch.delenv(var, raising=False)
    assert Fleet.in_slurm() is None and Fleet.in_slurm({"SLURM_JOBID": "9"}) == "9"
    outside = Fleet.from_environment()
    assert len(outside.nodes) == 1
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "localhost")
    assert Fleet.in_slurm() == "7"
    inside = Fleet.from_environment().nodes
    assert [n.name for n in inside] == ["localhost"] and inside[0].vars["fleetctl_slurm_job"] == "7"
    assert [n.name for n in Fleet.from_environment(slurm=False).nodes] == [outside.nodes[0].name]
