"""Run records from run folders: ``fleetctl runs`` folds retry attempts into their job, reads
reconnect info back, and a detached job's job.json is finalised from collected supervisor.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetctl.errors import UsageError
from fleetctl.job.monitor.handle import JobHandle
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.job.records.runs import (
    describe_failure,
    latest_attempt,
    list_records,
    load_nodes,
    write_connect,
)
from fleetctl.node import Node
from fleetctl.phases.collect import NodeCollect


def _job(runs: Path, job_id: str, **kw) -> RunFolder:
    folder = RunFolder.create(runs, job_id)
    nodes = kw.pop("nodes", [{"rank": 0, "host": "a", "state": "succeeded"}])
    data = {
        "job_id": job_id,
        "status": "succeeded",
        "attempt": 1,
        "launcher": "plain",
        "started": "2026-01-01T00:00:00.000Z",
        "ended": "2026-01-01T00:01:30.500Z",
        "first_failure": None,
        "nodes": nodes,
        "folder": str(folder.path),
    }
    data.update(kw)
    folder.write_job(JobRecord.from_dict(data))
    return folder


def test_attempts_fold_into_their_job_with_the_latest_status(tmp_path: Path) -> None:
    ff = {"rank": 1, "host": "b", "state": "failed", "exit_code": 1, "signal": None, "after": 2.0}
    _job(tmp_path, "20260101-000000-aaaaaa", status="failed", first_failure=ff)
    _job(tmp_path, "20260101-000000-aaaaaa.2", attempt=2, ended="2026-01-01T00:03:00.000Z")
    _job(tmp_path, "20260101-000500-bbbbbb", status="running", detached=True, ended=None)
    recs = list_records(tmp_path)
    assert [(r.job_id, r.status, r.attempts) for r in recs] == [
        ("20260101-000000-aaaaaa", "succeeded", 2),
        ("20260101-000500-bbbbbb", "detached", 1),
    ]
    assert recs[0].duration == 180.0  # first attempt's start to the last one's end
    assert recs[0].first_failure is None
    assert latest_attempt(tmp_path, "20260101-000000").path.name == "20260101-000000-aaaaaa.2"
    assert describe_failure(ff) == "node 1 (b): exit code 1 after 2.0 s"
    assert describe_failure({**ff, "signal": 9}) == "node 1 (b): signal 9 (SIGKILL) after 2.0 s"


def test_two_jobs_of_one_second_are_in_the_order_they_started(tmp_path: Path) -> None:
    """A job id carries its second and a random suffix: within one second the suffix says
    nothing (`--resume last` resumed the older job of two; CI, rehearsal of stop 42)."""
    _job(tmp_path, "20260101-000003-ffffff", started="2026-01-01T00:00:03.100Z")
    _job(tmp_path, "20260101-000003-000000", started="2026-01-01T00:00:03.900Z")
    _job(tmp_path, "20260101-000002-eeeeee", started="2026-01-01T00:00:02.999Z")
    assert [r.job_id for r in list_records(tmp_path)] == [
        "20260101-000002-eeeeee",
        "20260101-000003-ffffff",
        "20260101-000003-000000",
    ]


def test_connect_json_round_trips_nodes_without_env(tmp_path: Path) -> None:
    folder = _job(tmp_path, "j1")
    nodes = [
        Node(
            "a",
            "10.0.0.1",
            port=2222,
            user="u",
            key_file="/k",
            known_hosts="/kh",
            env={"SECRET": "x"},
            groups=("all", "gpu"),
        ),
    ]
    write_connect(folder.path, nodes, inventory="hosts.yml", limit="a")
    text = (folder.path / "connect.json").read_text()
    assert "SECRET" not in text
    assert json.loads(text)["inventory"].endswith("/hosts.yml")
    [back] = load_nodes(folder)
    assert (back.address, back.port, back.user, back.key_file, back.known_hosts) == (
        "10.0.0.1",
        2222,
        "u",
        "/k",
        "/kh",
    )
    assert back.groups == ("all", "gpu") and back.env == {}


def test_a_detached_job_is_finalised_from_the_collected_supervisor_records(tmp_path: Path):
    nodes = [
        {"rank": 0, "host": "a", "state": "running", "address": "10.0.0.1"},
        {"rank": 1, "host": "b", "state": "running", "address": "10.0.0.2"},
    ]
    folder = _job(tmp_path, "j2", status="running", detached=True, nodes=nodes, ended=None)
    write_connect(folder.path, [Node("a", "10.0.0.1"), Node("b", "10.0.0.2")])
    results = []
    for rank, host, code in ((0, "a", 0), (1, "b", 3)):
        d = folder.node_folder(rank, host)
        d.mkdir()
        (d / "supervisor.json").write_text(
            json.dumps(
                {
                    "state": "exited",
                    "exit_code": code,
                    "signal": None,
                    "start_time": 1767225600.0,
                    "end_time": 1767225660.0 + rank,
                }
            )
        )
        results.append(NodeCollect(host, rank, str(d)))
    h = JobHandle(tmp_path, "j2")
    assert h.live
    h._finalise(results)
    job = json.loads((folder.path / "job.json").read_text())
    assert job["status"] == "failed"
    assert [n["state"] for n in job["nodes"]] == ["succeeded", "failed"]
    assert job["first_failure"]["rank"] == 1 and job["first_failure"]["exit_code"] == 3
    assert job["ended"] == "2026-01-01T00:01:01.000Z"
    assert [r for r, _ in h.select("b")] == [1]
    with pytest.raises(UsageError, match="has no node 'zz'"):
        h.select("zz")


def test_stop_keeps_the_final_record_an_attached_run_wrote_meanwhile(tmp_path: Path) -> None:
    """`fleetctl stop` loads job.json at the start; the attached run it interrupts writes its
    own final record ("interrupted") while the stop still collects. The stop's update must
    start from job.json as it is then, not overwrite it from its older copy."""
    from fleetctl.phases.teardown import NodeStop, TeardownReport

    nodes = [{"rank": 0, "host": "a", "state": "running", "address": "10.0.0.1"}]
    folder = _job(tmp_path, "j5", status="running", nodes=nodes, ended=None)
    write_connect(folder.path, [Node("a", "10.0.0.1")])
    h = JobHandle(tmp_path, "j5")
    assert h.live
    final = json.loads((folder.path / "job.json").read_text())
    final.update(status="interrupted", ended="2026-01-01T00:02:00.000Z")
    final["nodes"][0]["state"] = "stopped"
    folder.write_job(JobRecord.from_dict(final))  # the attached run ends first
    report = TeardownReport([NodeStop("a", 0, found=[42])], grace=1.0)
    h.mark_stopped(report, [])
    job = json.loads((folder.path / "job.json").read_text())
    assert job["status"] == "interrupted" and job["ended"] == "2026-01-01T00:02:00.000Z"
    assert [n["state"] for n in job["nodes"]] == ["stopped"]
    assert job["teardown"]["verified"] is True


def test_runs_status_and_logs_commands_read_finished_jobs_without_network(tmp_path: Path):
    from fleetctl.testing.cli_runner import run_cli

    nodes = [
        {"rank": 0, "host": "a", "state": "stopped", "signal": 15, "exit_code": None},
        {"rank": 1, "host": "b", "state": "failed", "exit_code": 2, "signal": None},
    ]
    ff = {"rank": 1, "host": "b", "state": "failed", "exit_code": 2, "after": 1.5}
    folder = _job(
        tmp_path, "20260101-000000-cccccc", status="failed", first_failure=ff, nodes=nodes
    )
    for rank, host in ((0, "a"), (1, "b")):
        d = folder.node_folder(rank, host)
        d.mkdir()
        (d / "console.log").write_text(f"line1 {host}\nline2 {host}\n")

    r = run_cli("runs", "--runs-dir", str(tmp_path), "--json")
    assert r.exit_code == 0, r.stderr
    [rec] = r.json
    assert (
        rec["status"] == "failed" and rec["first_failure"] == "node 1 (b): exit code 2 after 1.5 s"
    )

    r = run_cli("status", "--runs-dir", str(tmp_path), "20260101", "--json")
    assert r.exit_code == 0, r.stderr
    status = r.json
    assert status["live"] is False
    assert [(n["host"], n["state"], n["signal"], n["exit_code"]) for n in status["nodes"]] == [
        ("a", "stopped", 15, None),
        ("b", "failed", None, 2),
    ]

    r = run_cli("logs", "--runs-dir", str(tmp_path), "20260101", "-n", "1")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["[0 a] line2 a", "[1 b] line2 b"]


def test_known_hosts_given_to_run_is_what_later_commands_verify_against(tmp_path: Path) -> None:
    from fleetctl.job.records.runs import nodes_as_reached
    from fleetctl.transport.connection import SSHSettings

    folder = _job(tmp_path, "j2")
    nodes = [Node("a", "10.0.0.1", known_hosts="/inventory_kh"), Node("b", "10.0.0.2")]
    write_connect(folder.path, nodes_as_reached(nodes, SSHSettings(known_hosts="/cli_kh")))
    assert [n.known_hosts for n in load_nodes(folder)] == ["/cli_kh", "/cli_kh"]
    write_connect(folder.path, nodes_as_reached(nodes, SSHSettings()))
    assert [n.known_hosts for n in load_nodes(folder)] == ["/inventory_kh", None]
