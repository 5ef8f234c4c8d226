"""``run --resume JOB`` reads the earlier job's run folder alone to know where its checkpoints
are (its last planned attempt's rank 0: host, work folder, code snapshot); a job that is not
there or never got as far as a plan is refused in one line, exit 2, before any host."""

from __future__ import annotations

import calendar
import json
from pathlib import Path

import pytest

from fleetctl.errors import UsageError
from fleetctl.job.run.resume import resolve
from fleetctl.node import Node
from fleetctl.plan.rankplan import JobSpec, make_plan
from fleetctl.testing.cli_runner import run_cli

NODES = [Node(f"node{i}", f"10.0.0.{i}", workdir="~/.fleetctl") for i in (1, 2, 3)]
JOB = "20261128-100000-abc123"


def planned(runs: Path, folder: str, order: list[Node], *, started: str | None = None) -> None:
    """A run folder as a job leaves it: job.json, and plan.json for ``order``."""
    d = runs / folder
    d.mkdir(parents=True)
    (d / "job.json").write_text(
        json.dumps({"job_id": folder, "status": "failed", "started": started})
    )
    spec = JobSpec(script="train.py", job_id=folder, work_id=JOB, folder="sub")
    (d / "plan.json").write_text(json.dumps(make_plan(order, spec, code_digest="d1").to_dict()))


def test_the_last_planned_attempts_rank_0_is_the_source(tmp_path: Path) -> None:
    planned(tmp_path, JOB, NODES, started="2026-11-28T10:00:05.000Z")
    planned(tmp_path, f"{JOB}.2", [NODES[1], NODES[0], NODES[2]])
    (tmp_path / f"{JOB}.3").mkdir()  # its preflight failed: no plan
    (tmp_path / f"{JOB}.3" / "job.json").write_text(
        json.dumps({"job_id": f"{JOB}.3", "status": "error"})
    )
    relay = resolve(JOB[:15], tmp_path, NODES, "ckpt")  # a unique prefix is enough
    src = relay.source
    assert (relay.resume, src.node.name, src.attempt, relay.dir) == (JOB, "node2", 2, "ckpt")
    assert src.work_dir == f"~/.fleetctl/work/{JOB}" and src.cwd == f"~/.fleetctl/work/{JOB}/sub"
    assert src.code_dir == "~/.fleetctl/code/d1"
    start = calendar.timegm((2026, 11, 28, 10, 0, 5, 0, 0, 0))
    assert relay.since == start - 10  # the job's start, with slack for clocks


def test_last_is_the_newest_job_and_its_host_comes_from_connect_json_if_not_inventoried(
    tmp_path: Path,
) -> None:
    planned(tmp_path, JOB, NODES)
    newer = "20261128-110000-def456"
    gone = Node("old9", "10.0.0.9", workdir="~/.fleetctl")
    planned(tmp_path, newer, [gone, NODES[0]])
    (tmp_path / newer / "connect.json").write_text(
        json.dumps({"nodes": [{"name": "old9", "address": "10.0.0.9", "port": 2222}]})
    )
    relay = resolve("last", tmp_path, NODES, None)
    assert relay.resume == newer and relay.source.node.port == 2222


@pytest.mark.parametrize(
    "value,words",
    [
        ("20200101-000000-ffffff", "no job 20200101-000000-ffffff in"),
        ("../etc", "is not a job id"),
        (JOB + "\n", "give a job id"),
        ("", "give a job id"),
    ],
)
def test_an_unknown_job_is_one_usage_error(tmp_path: Path, value: str, words: str) -> None:
    planned(tmp_path, JOB, NODES)
    with pytest.raises(UsageError, match=words) as e:
        resolve(value, tmp_path, NODES, None)
    assert str(e.value).startswith(f"--resume {value!r}: ") and "\n" not in e.value.one_line()


def test_a_job_that_never_planned_or_an_empty_runs_folder_has_nothing_to_resume(
    tmp_path: Path,
) -> None:
    with pytest.raises(UsageError, match=r"no job in .* to resume"):
        resolve("last", tmp_path, NODES, None)
    (tmp_path / JOB).mkdir()
    (tmp_path / JOB / "job.json").write_text(json.dumps({"job_id": JOB, "status": "error"}))
    with pytest.raises(UsageError, match=f"job {JOB} never got as far as a plan"):
        resolve(JOB, tmp_path, NODES, None)


def test_the_command_refuses_an_unknown_job_in_a_dry_run_too(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    res = run_cli("run", "--dry-run", "--resume", "nosuch", "train.py", cwd=tmp_path)
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "fleetctl: error: --resume 'nosuch': no job nosuch in fleet-runs (see `fleetctl runs`)"
    ]
