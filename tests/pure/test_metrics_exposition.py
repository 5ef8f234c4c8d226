"""The run's metrics (``--metrics-addr``): what the job's observer keeps from its events, and
the exposition text a sample renders to — a golden table, sample in, series out."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl.job.monitor.exposition import render
from fleetctl.job.monitor.hooks import Hooks, hook_env, run_hooks
from fleetctl.job.monitor.metrics import JobMetrics, JobSample, NodeSample
from fleetctl.job.records.result import JobEvent, JobPhase, JobResult, NodeOutcome
from fleetctl.job.records.state import NodeState

J = 'job_id="j1"'

# (sample, every series line it renders, in order; HELP/TYPE lines left out)
GOLDEN: list[tuple[str, JobSample, list[str]]] = [
    (
        "two nodes mid-run, one lost, a collective figure and a slow score",
        JobSample(
            job_id="j1",
            attempt=2,
            max_attempts=3,
            phase="run",
            status="running",
            started=1000.0,
            last_progress=1090.0,
            nproc=2,
            now=1100.0,
            nodes=[
                NodeSample("gpu01", 0, "running", 10, 200, 1090.0, busbw=12.5),
                NodeSample("gpu02", 1, "lost", 3, 40, None, None, slow_score=2.5),
            ],
        ),
        [
            f'fleetctl_job_phase{{{J},phase="run"}} 1.0',
            f'fleetctl_job_status{{{J},status="running"}} 1.0',
            f"fleetctl_job_attempt{{{J}}} 2.0",
            f"fleetctl_job_max_attempts{{{J}}} 3.0",
            f"fleetctl_job_retries{{{J}}} 1.0",
            f"fleetctl_job_ranks_alive{{{J}}} 2.0",
            f"fleetctl_job_start_time_seconds{{{J}}} 1000.0",
            f"fleetctl_job_last_progress_age_seconds{{{J}}} 10.0",
            f'fleetctl_job_nodes{{{J},state="pending"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="running"}} 1.0',
            f'fleetctl_job_nodes{{{J},state="succeeded"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="failed"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="stopped"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="lost"}} 1.0',
            f'fleetctl_job_nodes{{{J},state="start_failed"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="left"}} 0.0',
            f'fleetctl_node_state{{host="gpu01",{J},node_rank="0",state="running"}} 1.0',
            f'fleetctl_node_state{{host="gpu02",{J},node_rank="1",state="lost"}} 1.0',
            f'fleetctl_node_lines_total{{host="gpu01",{J},node_rank="0"}} 10.0',
            f'fleetctl_node_lines_total{{host="gpu02",{J},node_rank="1"}} 3.0',
            f'fleetctl_node_bytes_total{{host="gpu01",{J},node_rank="0"}} 200.0',
            f'fleetctl_node_bytes_total{{host="gpu02",{J},node_rank="1"}} 40.0',
            f'fleetctl_node_last_line_age_seconds{{host="gpu01",{J},node_rank="0"}} 10.0',
            "fleetctl_node_collective_busbw_bytes_per_second"
            f'{{host="gpu01",{J},node_rank="0"}} 1.25e+10',
            f'fleetctl_node_slow_score{{host="gpu01",{J},node_rank="0"}} 0.0',
            f'fleetctl_node_slow_score{{host="gpu02",{J},node_rank="1"}} 2.5',
        ],
    ),
    (
        "before the launch: no line yet, the age counts from the start, nproc auto",
        JobSample(
            job_id="j1",
            attempt=1,
            phase="check",
            status="starting",
            started=1000.0,
            now=1004.0,
            nodes=[NodeSample("a", 0)],
        ),
        [
            f'fleetctl_job_phase{{{J},phase="check"}} 1.0',
            f'fleetctl_job_status{{{J},status="starting"}} 1.0',
            f"fleetctl_job_attempt{{{J}}} 1.0",
            f"fleetctl_job_max_attempts{{{J}}} 1.0",
            f"fleetctl_job_retries{{{J}}} 0.0",
            f"fleetctl_job_ranks_alive{{{J}}} 0.0",
            f"fleetctl_job_start_time_seconds{{{J}}} 1000.0",
            f"fleetctl_job_last_progress_age_seconds{{{J}}} 4.0",
            f'fleetctl_job_nodes{{{J},state="pending"}} 1.0',
            f'fleetctl_job_nodes{{{J},state="running"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="succeeded"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="failed"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="stopped"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="lost"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="start_failed"}} 0.0',
            f'fleetctl_job_nodes{{{J},state="left"}} 0.0',
            f'fleetctl_node_state{{host="a",{J},node_rank="0",state="pending"}} 1.0',
            f'fleetctl_node_lines_total{{host="a",{J},node_rank="0"}} 0.0',
            f'fleetctl_node_bytes_total{{host="a",{J},node_rank="0"}} 0.0',
            f'fleetctl_node_slow_score{{host="a",{J},node_rank="0"}} 0.0',
        ],
    ),
]


def _series(text: bytes) -> list[str]:
    return [x for x in text.decode().splitlines() if x and not x.startswith("#")]


@pytest.mark.parametrize("case,sample,want", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_a_sample_renders_to_its_golden_series(
    case: str, sample: JobSample, want: list[str]
) -> None:
    assert _series(render(sample)) == want


@pytest.mark.parametrize("case,sample,want", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_the_text_passes_promtool_check_metrics(
    case: str, sample: JobSample, want: list[str]
) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (apt-get install prometheus; .ci/run installs it)")
    p = subprocess.run(
        [promtool, "check", "metrics"], input=render(sample), capture_output=True, timeout=30
    )
    assert p.returncode == 0, p.stdout + p.stderr


def _nodes(*states: NodeState) -> list[NodeOutcome]:
    return [NodeOutcome(i, f"h{i}", f"10.0.0.{i}", state=s) for i, s in enumerate(states)]


def test_the_observer_keeps_phase_states_lines_and_scores_from_the_job_events() -> None:
    m = JobMetrics(max_attempts=2, clock=lambda: 50.0)
    m.attempt("j.2", 2, ["h0", "h1"], 4)
    m.collective({"h0": {"busbw": 3.0}, "h1": {"busbw": None}})
    m.slow_scores({"h1": 7.0})
    running = _nodes(NodeState.RUNNING, NodeState.RUNNING)
    m.event(JobEvent("phase", "checking", time=10.0, phase=JobPhase.CHECK), running, "starting")
    m.event(JobEvent("phase", "launching", time=11.0, phase=JobPhase.RUN), running, "running")
    m.event(JobEvent("lines", rank=1, lines=("é", "ab"), time=12.0), running, "running")
    m.event(JobEvent("progress", rank=0, time=13.0), running, "running")
    ended = _nodes(NodeState.FAILED, NodeState.RUNNING)
    m.event(JobEvent("exit", "exit code 1", rank=0, code=1, time=14.0), ended, "failed")
    s = m.sample()
    assert (s.job_id, s.attempt, s.max_attempts, s.phase, s.status) == (
        "j.2", 2, 2, "run", "failed",
    )  # fmt: skip
    assert [(n.host, n.state, n.lines, n.bytes, n.busbw, n.slow_score) for n in s.nodes] == [
        ("h0", "failed", 0, 0, 3.0, 0.0),
        ("h1", "running", 2, 6, None, 7.0),
    ]
    assert (s.last_progress, s.nodes[1].last_line, s.ranks_alive, s.now) == (13.0, 12.0, 4, 50.0)
    m.event(JobEvent("phase", "attempt 2 of 2: job j.2"), ended, "failed")  # no JobPhase
    assert m.sample().phase == "run"  # keeps the last
    m.event(JobEvent("phase", "checking every host", phase=JobPhase.POST_MORTEM), ended, "failed")
    assert m.sample().phase == "post_mortem"


def test_a_hook_is_told_the_job_its_end_and_the_node_that_failed_first(tmp_path: Path) -> None:
    r = JobResult("j1", tmp_path, status="failed", nodes=_nodes(NodeState.STOPPED, NodeState.LOST))
    r.nodes[1].reason, r.first_failure, r.attempt = "no heartbeat for 5s", 1, 2
    r.culprits = ["h1: data link down"]
    env = hook_env("j1", r.status, tmp_path, result=r)
    assert env == {
        "FLEETCTL_JOB_ID": "j1",
        "FLEETCTL_STATUS": "failed",
        "FLEETCTL_RUN_DIR": str(tmp_path.resolve()),
        "FLEETCTL_EXIT_CODE": "3",
        "FLEETCTL_ATTEMPT": "2",
        "FLEETCTL_CULPRIT_HOST": "h1",
        "FLEETCTL_CULPRIT_RANK": "1",
        "FLEETCTL_CULPRIT_REASON": "lost (no heartbeat for 5s)",
        "FLEETCTL_LIKELY_CAUSE": "h1: data link down",
        "FLEETCTL_REASON": "node 1 (h1): lost (no heartbeat for 5s)",
    }
    before = hook_env("j2", "error", tmp_path, reason="preflight failed (…)")
    assert (before["FLEETCTL_STATUS"], before["FLEETCTL_CULPRIT_HOST"]) == ("error", "")
    assert before["FLEETCTL_REASON"] == "preflight failed (…)"


def test_on_failure_runs_for_a_run_that_never_launched_and_on_end_for_every_end(
    tmp_path: Path,
) -> None:
    hooks = Hooks(on_failure='echo "$FLEETCTL_STATUS: $FLEETCTL_REASON"', on_end="echo end")
    said: list[str] = []
    runs = run_hooks(
        hooks,
        "j1",
        "error",
        tmp_path,
        reason="preflight failed",
        on_event=lambda ev: said.append(ev.text),
    )
    assert [(r.name, r.exit_code) for r in runs] == [("on-failure", 0), ("on-end", 0)]
    assert (tmp_path / "hook-on-failure.log").read_text() == "error: preflight failed\n"
    assert said[0].startswith("--on-failure exited 0 after ")
    assert [r.name for r in run_hooks(hooks, "j1", "succeeded", tmp_path)] == ["on-end"]
    assert (tmp_path / "hook-on-end.log").read_text() == "end\nend\n"


@pytest.mark.parametrize(
    ("given", "split"),
    [
        ("127.0.0.1:9400", ("127.0.0.1", 9400)),
        ("[::1]:9400", ("::1", 9400)),
        ("node:80", ("node", 80)),
    ],
)
def test_the_endpoint_splits_each_address_the_check_accepts(
    given: str, split: tuple[str, int]
) -> None:
    """--metrics-addr is checked by ``api.checks.host_port`` and split where it is bound."""
    from fleetctl.api.checks import host_port
    from fleetctl.job.monitor.exposition import _split_host_port

    assert _split_host_port(host_port(given)) == split
