"""The one result protocol (``fleetctl.results.Outcome``), one contract for every result the
API returns over hosts: a job's verdict (direct and submitted), a fan-out, ``exec``'s result,
``check``'s report, and what ``status``, ``stop`` and ``collect`` return of a job. Each row is a
real result and what it must answer; every row goes through the same checks (mypy holds the
types to the protocol in ``fleetctl/api/types.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fleetctl.api import RunResult
from fleetctl.api.lifecycle import CollectReport, StatusReport, StopReport
from fleetctl.api.submitted import Submitted
from fleetctl.api.types import CheckReport, ExecResult, NodeRun
from fleetctl.job.monitor.supervisors import NodeReport
from fleetctl.job.records.files import SlurmRecord
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.phases.check.report import FAIL, OK, CheckResult, HostReport, MeshFailure
from fleetctl.phases.collect import NodeCollect
from fleetctl.phases.teardown import NodeStop, TeardownReport
from fleetctl.results import Cancelled, CommandResult, FleetResult, Outcome
from fleetctl.slurm.queue import JobInfo

NODES = [
    {"rank": 0, "host": "node1", "state": "succeeded", "exit_code": 0},
    {"rank": 1, "host": "node2", "state": "failed", "exit_code": 7},
    {"rank": 2, "host": "node3", "state": "lost", "reason": "no answer for 60 s"},
]
FAILED_JOB = {
    "job_id": "j1", "status": "failed", "nodes": NODES,
    "first_failure": {"rank": 1, "host": "node2", "state": "failed", "exit_code": 7},
}  # fmt: skip
GOOD_JOB = {"job_id": "j1", "status": "succeeded", "nodes": NODES[:1]}


def _submitted(tmp_path: Path, record: dict[str, Any], state: str, code: int) -> RunResult:
    run = RunFolder.create(tmp_path, "j1")
    run.write_job(JobRecord.from_dict({**record, "folder": str(run.path), "executor": "sbatch"}))
    sub = Submitted(run, "42", SlurmRecord(job_id="42"), client=object())  # type: ignore[arg-type]
    return sub.verdict(JobInfo("42", state, exit_code=code))


def _exec(*runs: NodeRun) -> ExecResult:
    return ExecResult("hostname", runs, 0.2)


def _check(cells: dict[str, dict[str, CheckResult]], mesh: list[MeshFailure]) -> CheckReport:
    hosts = {h: HostReport(h, h, dict(c)) for h, c in cells.items()}
    return CheckReport(hosts=hosts, mesh_failures=mesh)


def _status(status: str, live: bool, *nodes: NodeReport) -> StatusReport:
    return StatusReport("j1", status, False, live, "/runs/j1", 1, list(nodes), {})


def _stop(*nodes: NodeStop) -> StopReport:
    return StopReport("j1", TeardownReport(list(nodes), grace=5.0), "stopped")


def _collect(*nodes: NodeCollect) -> CollectReport:
    return CollectReport("j1", "failed", list(nodes))


_Make = Callable[[Path], Any]
CASES: list[tuple[str, _Make, bool, int, dict[str, str]]] = [
    ("job succeeded", lambda p: RunResult.from_record(GOOD_JOB, p), True, 0, {}),
    (
        "job failed",
        lambda p: RunResult.from_record(FAILED_JOB, p),
        False,
        3,
        {"node2": "exit code 7", "node3": "lost (no answer for 60 s)"},
    ),
    (
        "job logs incomplete",
        lambda p: RunResult.from_record(GOOD_JOB, p, exit_code=4),
        False,
        4,
        {},
    ),
    ("submitted job succeeded", lambda p: _submitted(p, GOOD_JOB, "COMPLETED", 0), True, 0, {}),
    (
        "submitted job failed",
        lambda p: _submitted(p, FAILED_JOB, "FAILED", 3),
        False,
        3,
        {"node2": "exit code 7", "node3": "lost (no answer for 60 s)"},
    ),
    ("fan-out ok", lambda p: FleetResult({"a": CommandResult("true", 0)}), True, 0, {}),
    (
        "fan-out failed",
        lambda p: FleetResult(
            {
                "a": CommandResult("true", 0),
                "b": ConnectionError("refused by 10.0.0.2:22"),
                "c": Cancelled("another node failed"),
            }
        ),
        False,
        1,
        {"b": "refused by 10.0.0.2:22"},  # a cancelled host did not fail: it was not run
    ),
    ("exec ok", lambda p: _exec(NodeRun("a", "a", 0, "a\n")), True, 0, {}),
    (
        "exec failed",
        lambda p: _exec(
            NodeRun("a", "a", 0, "a\n"),
            NodeRun("b", "b", None, error="b: connection refused by 10.0.0.2:22"),
            NodeRun("c", "c", 7, stderr="oops\n"),
        ),
        False,
        3,
        {"b": "b: connection refused by 10.0.0.2:22", "c": "exit 7"},
    ),
    (
        "exec timed out",
        lambda p: _exec(NodeRun("a", "a", None, error="timed out after 5s: …", timed_out=True)),
        False,
        124,
        {"a": "timed out after 5s: …"},
    ),
    (
        "check passed",
        lambda p: _check({"node1": {"ssh": CheckResult(OK)}}, []),
        True,
        0,
        {},
    ),
    (
        "check failed",
        lambda p: _check(
            {
                "node1": {"ssh": CheckResult(OK), "disk": CheckResult(FAIL, "0.4 GiB free")},
                "node2": {"ssh": CheckResult(OK)},
                "node3": {
                    "ssh": CheckResult(OK),
                    "gpu": CheckResult(FAIL, "1 of 2 GPUs"),
                    "clock": CheckResult(FAIL, "3 s off"),
                },
            },
            [MeshFailure("node2", "node3", ("tcp", "mtu"))],
        ),
        False,
        3,
        {
            "node1": "disk: 0.4 GiB free",
            "node2": "mesh → node3: tcp, mtu",
            "node3": "gpu: 1 of 2 GPUs; clock: 3 s off",
        },
    ),
    (
        "status running",
        lambda p: _status("running", True, NodeReport(0, "node1", "running", pid=7)),
        True,
        0,
        {},
    ),
    (
        "status failed",
        lambda p: _status(
            "failed",
            False,
            NodeReport(0, "node1", "exited", exit_code=0),
            NodeReport(1, "node2", "exited", exit_code=7),
            NodeReport(2, "node3", "stopped", signal=9),
            NodeReport(3, "node4", "unreachable", error="connection refused"),
        ),
        False,
        3,
        {
            "node2": "exit code 7",
            "node3": "signal 9",
            "node4": "unreachable: connection refused",
        },
    ),
    ("status interrupted", lambda p: _status("interrupted", False), False, 130, {}),
    ("stop verified", lambda p: _stop(NodeStop("node1", 0, found=[42])), True, 0, {}),
    (
        "stop not verified",
        lambda p: _stop(
            NodeStop("node1", 0, found=[42]),
            NodeStop("node2", 1, remaining=[{"pid": 43}]),
            NodeStop("node3", 2, skipped="lost"),
            NodeStop("node4", 3, error="ssh: connection refused"),
        ),
        False,
        3,
        {"node2": "1 process(es) left", "node3": "lost", "node4": "ssh: connection refused"},
    ),
    ("collect complete", lambda p: _collect(NodeCollect("node1", 0, "/r/n1")), True, 0, {}),
    (
        "collect incomplete",
        lambda p: _collect(
            NodeCollect("node1", 0, "/r/n1", not_collected=[{"reason": "over cap"}]),
            NodeCollect("node2", 1, "/r/n2", error="ssh: connection refused"),
            NodeCollect("node3", 2, "/r/n3", not_collected=[{"reason": "short"}]),
        ),
        False,
        4,
        {"node2": "ssh: connection refused", "node3": "not home: short"},
    ),
]


@pytest.mark.parametrize(
    ("make", "ok", "code", "failed"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_result_answers_the_one_result_protocol(
    tmp_path: Path, make: _Make, ok: bool, code: int, failed: dict[str, str]
) -> None:
    result = make(tmp_path)
    assert isinstance(result, Outcome)
    assert (result.ok, result.exit_code) == (ok, code)
    assert isinstance(result.exit_code, int) and result.ok == (result.exit_code == 0)
    # host → what, in rank order: the same shape everywhere (a fan-out keeps the exception)
    said = {host: str(what) for host, what in result.failed.items()}
    assert said == failed and list(said) == list(failed)
    if ok:
        assert not result.failed
    doc = json.loads(json.dumps(result.to_dict()))
    assert (doc["ok"], doc["exit_code"], doc["failed"]) == (ok, code, failed)


def test_a_single_commands_result_is_a_hosts_value_not_an_outcome() -> None:
    """``CommandResult`` names no host: it is what a fan-out holds per host."""
    one = CommandResult("false", 1, stderr="no\n")
    assert not isinstance(one, Outcome)
    assert (one.ok, one.exit_code, one.to_dict()["ok"]) == (False, 1, False)


def test_exec_keeps_the_largest_remote_code_and_the_failed_runs() -> None:
    res = _exec(
        NodeRun("a", "a", 0),
        NodeRun("b", "b", None, error="unreachable"),
        NodeRun("c", "c", 7, stderr="oops\n"),
    )
    assert (res.exit_code, res.max_rc) == (3, 255)
    assert [(r.node, r.stderr) for r in res.failed_runs] == [("b", ""), ("c", "oops\n")]
    assert _exec(NodeRun("a", "a", 0)).max_rc == 0
