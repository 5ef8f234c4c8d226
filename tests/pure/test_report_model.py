"""The offline report from run folders written here the way a run writes them: what the model
reads (golden values), that the HTML is self-contained and escaped, that a 64-node job's report
stays under 2 MB, and the command's answers for a missing or damaged job."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from fleetctl.report import build_report, write_report
from fleetctl.report.model import load
from fleetctl.testing.cli_runner import run_cli

JOB = "20261128-120000-abcdef"


def at(seconds: float) -> str:
    m, s = divmod(seconds, 60)
    return f"2026-11-28T12:{int(m):02d}:{s:06.3f}Z"


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) if not isinstance(data, str) else data)


def make_run(
    root: Path,
    job_id: str = JOB,
    *,
    hosts: list[str],
    nproc: int = 2,
    fail_node: int = 1,
    attempt: int = 1,
    log_lines: int = 30,
    collective: dict[str, Any] | None = None,
    stacks: list[dict[str, Any]] | None = None,
    failing_ranks: int = 1,
) -> Path:
    """A run folder as `fleetctl run` leaves it: connect 0 s, check 1 s, push 3 s, launch 4 s,
    nodes run 5..20 s, node ``fail_node`` fails at 20 s (its local rank 1 first), teardown,
    collection at 22 s, done at 23 s."""
    folder = root / job_id
    ff_host = hosts[fail_node]
    nodes, ranks, failed, events = [], [], [], []
    phases = [
        ("connecting to N node(s)", 0), ("checking nodes", 1), ("pushing code", 3),
        ("launching plain on N node(s)", 4), ("collecting logs into x", 22), ("done: failed", 23),
    ]  # fmt: skip
    for name, t in phases:
        events.append(f"{at(t)} phase {name}")
    for i, h in enumerate(hosts):
        bad = i == fail_node
        nodes.append(
            {"rank": i, "host": h, "address": f"10.0.0.{i + 1}",
             "state": "failed" if bad else "stopped", "exit_code": 1 if bad else None,
             "signal": None if bad else 15,
             "start_time": at(5), "end_time": at(20 if bad else 21), "collected": True}
        )  # fmt: skip
        events.append(f"{at(5)} started [{i} {h}] uploaded supervisor")
        if not bad:
            events.append(f"{at(20.5)} notice [{i} {h}] stopping job: stop requested")
        nd = folder / f"{i}-{h}"
        for local in range(nproc):
            g = i * nproc + local
            log = f"{i}-{h}/rank{local}.log"
            text = "".join(f"step {s} rank {g} loss 0.{s:04d}\n" for s in range(log_lines))
            if bad and local == 1:
                text += "Traceback (most recent call last):\nRuntimeError: <b>boom</b> on purpose\n"
            _write(folder / log, text)
            ranks.append({"rank": g, "node": h, "node_rank": i, "local_rank": local,
                          "pid": 100 + g, "logs": [log]})  # fmt: skip
            if bad and local >= nproc - failing_ranks:
                failed.append({"rank": g, "node": h, "node_rank": i, "local_rank": local,
                               "exit_code": 1, "logs": [log], "error_log": log,
                               "error": ["Traceback (most recent call last):",
                                         "RuntimeError: <b>boom</b> on purpose"]})  # fmt: skip
        _write(nd / "console.log", "console\n")
        _write(nd / "progress", "")
        os.utime(nd / "progress", (0, _epoch(at(18))))
    events += [
        f"{at(20)} exit [{fail_node} {ff_host}] exit code 1",
        f"{at(20.2)} teardown stopping the job on {len(hosts)} node(s) (grace 5s)",
        f"{at(21.5)} teardown verified: no process of job {job_id} left on any node (0.0s)",
        f"{at(23)} done failed",
    ]
    job = {
        "job_id": job_id, "status": "failed", "attempt": attempt, "launcher": "plain",
        "started": at(4), "ended": at(23), "duration": 19.0,
        "first_failure": {"rank": fail_node, "host": ff_host, "address": f"10.0.0.{fail_node + 1}",
                          "state": "failed", "exit_code": 1, "time": at(20), "after": 16.0},
        "nodes": nodes, "errors": [], "folder": str(folder),
        "phases": [{"phase": n, "at": at(t)} for n, t in phases],
        "failed_ranks": failed, "culprits": [f"{ff_host}: data link down"],
    }  # fmt: skip
    if stacks is not None:
        job["stacks"] = stacks
    _write(folder / "job.json", job)
    _write(folder / "events.log", "\n".join(events) + "\n")
    _write(folder / "ranks.json", {"ranks": ranks})
    plan_nodes = [
        {"host": h, "address": f"10.0.0.{i + 1}", "node_rank": i, "nic": "eth0",
         "train_addr": f"10.1.0.{i + 1}", "python": "/usr/bin/python3"}
        for i, h in enumerate(hosts)
    ]  # fmt: skip
    _write(folder / "plan.json", {"job_id": job_id, "script": "train.py", "nodes": plan_nodes})
    if collective is not None:
        _write(folder / "collective.json", collective)
    return folder


def _epoch(iso: str) -> float:
    from fleetctl.report.files import parse_time

    t = parse_time(iso)
    assert t is not None
    return t


def digest(folder: Path) -> dict[str, Any]:
    r = load(folder)
    return {
        "verdict": r.verdict,
        "culprit": r.culprit
        and (
            r.culprit.host,
            r.culprit.rank,
            r.culprit.reason,
            r.culprit.error_lines[-1],
            r.culprit.error_log,
        ),
        "lanes": [
            (
                x.attempt,
                x.rank,
                x.host,
                x.spare,
                x.culprit,
                [s.kind for s in x.spans],
                [m.kind for m in x.marks],
            )
            for x in r.lanes
        ],
        "failed_ranks": [(k.rank, k.logs) for k in r.ranks if k.failed],
        "checks": [(c.host, c.nic, c.state) for c in r.checks],
        "progress": [(p.attempt, p.rank, p.lines, round(p.rate or 0, 2)) for p in r.progress][:3],
        "excerpts": [(e.title, e.path, len(e.lines), e.cut) for e in r.excerpts],
        "slow": sorted(r.collective.slow) if r.collective else None,
        "stacks": [(s.frame, s.ranks) for s in r.stacks],
    }


PHASES = ["connect", "check", "push", "launch", "collect"]


def test_a_retried_job_with_a_spare_and_a_slow_node_reads_as_these_facts(tmp_path: Path) -> None:
    coll = {
        "ok": False, "median_link_busbw": 10.0, "threshold_busbw": 5.0,
        "links": [{"src": "n1", "dst": "n2", "busbw": 10.0},
                  {"src": "n2", "dst": "n3", "busbw": 1.0}],
        "failures": [{"host": "n3", "reason": "link n2 → n3 at 1 GB/s"}],
    }  # fmt: skip
    first = make_run(tmp_path, hosts=["n1", "n2", "n3"], collective=coll)
    make_run(
        tmp_path, f"{JOB}.2", hosts=["n1", "n4", "n3"], attempt=2,
        stacks=[{"frame": "wait (train.py:9)", "ranks": [0, 1, 3]},
                {"frame": "load (train.py:70)", "ranks": [2]}],
    )  # fmt: skip
    run_lanes = [*PHASES[:4], "running", "teardown", "collect"]
    assert digest(first) == {
        "verdict": "failed after 2 attempts: rank 3 on n4 (node 1), exit code 1 after 16.0 s",
        "culprit": (
            "n4",
            3,
            "exit code 1 after 16.0 s",
            "RuntimeError: <b>boom</b> on purpose",
            f"../{JOB}.2/1-n4/rank1.log",
        ),
        "lanes": [
            (1, 0, "n1", False, False, [*PHASES[:4], "collect", "running", "teardown"], []),
            (1, 1, "n2", False, True, [*PHASES[:4], "collect", "running", "teardown"], ["failure"]),
            (1, 2, "n3", False, False, [*PHASES[:4], "collect", "running", "teardown"], ["slow"]),
            (2, 0, "n1", False, False, [*PHASES[:4], "collect", "running", "teardown"], []),
            (2, 1, "n4", True, True, [*PHASES[:4], "collect", "running", "teardown"], ["failure"]),
            (2, 2, "n3", False, False, [*PHASES[:4], "collect", "running", "teardown"], []),
        ],
        "failed_ranks": [(3, (f"../{JOB}.2/1-n4/rank1.log",))],
        "checks": [("n1", "eth0", "stopped"), ("n4", "eth0", "failed"), ("n3", "eth0", "stopped")],
        "progress": [(1, 0, 30, 1.88), (1, 1, 30, 1.88), (1, 2, 30, 2.0)],
        "excerpts": [("rank 3 on n4 (local rank 1)", f"../{JOB}.2/1-n4/rank1.log", 32, False)],
        "slow": ["n3"],
        "stacks": [("wait (train.py:9)", (0, 1, 3)), ("load (train.py:70)", (2,))],
    }
    r = load(first)  # every link resolves from the first folder, where the report lies
    assert r.culprit and (first / r.culprit.error_log).is_file()  # type: ignore[operator]
    assert all((first / p).is_file() for k in r.ranks for p in k.logs)
    assert all((first / e.path).is_file() for e in r.excerpts)
    assert sorted(set(run_lanes)) == sorted({k for lane in digest(first)["lanes"] for k in lane[5]})


def test_the_html_is_self_contained_escaped_and_names_the_culprit_first(tmp_path: Path) -> None:
    folder = make_run(tmp_path, hosts=["n1", "n2", "n3"])
    html = build_report(folder)
    assert not re.search(r"https?://", html)
    assert not re.search(r"<script|<link|<iframe|<img|@import|url\(", html, re.I)
    assert "<b>boom</b>" not in html and "&lt;b&gt;boom&lt;/b&gt;" in html
    culprit = html.index('id="culprit"')
    assert html.index('class="host">n2<') > culprit
    assert culprit < html.index('id="timeline"') < html.index("<svg")
    assert 'href="1-n2/rank1.log"' in html  # links into the run folder, relative
    (tmp_path / "elsewhere").mkdir()
    out = write_report(folder, tmp_path / "elsewhere" / "r.html")
    assert f'href="../{JOB}/1-n2/rank1.log"' in out.read_text()
    assert oct(out.stat().st_mode & 0o777) == "0o600"


def sixty_four_nodes(root: Path, last_words: str) -> Path:
    """A failed 64-node run (8 ranks each): gpu17 failed first and is slow in the full
    all-pairs matrix; its rank 7's 2 MB log ends with ``last_words``."""
    hosts = [f"gpu{i:02d}" for i in range(64)]
    links = [
        {"src": a, "dst": b, "busbw": 20.0 - (b == "gpu17")} for a in hosts for b in hosts if a != b
    ]
    coll = {"median_link_busbw": 20.0, "threshold_busbw": 10.0, "links": links,
            "failures": [{"host": "gpu17", "reason": "slow"}]}  # fmt: skip
    folder = make_run(
        root, hosts=hosts, nproc=8, fail_node=17, log_lines=300, collective=coll, failing_ranks=8
    )
    (folder / "17-gpu17" / "rank7.log").write_text(("x" * 5000 + "\n") * 400 + last_words + "\n")
    return folder


def test_a_64_node_report_with_big_logs_and_a_full_matrix_stays_under_2_mb(tmp_path: Path) -> None:
    folder = sixty_four_nodes(tmp_path, "RuntimeError: the last words")
    html = build_report(folder)
    size = len(html.encode())
    print(f"64-node report: {size} bytes")
    assert size <= 2 * 1024 * 1024, size
    assert "RuntimeError: the last words" in html and "x" * 5000 not in html
    assert html.count("<rect") >= 64 * 63  # every link of the matrix drawn
    assert "the whole file is in the run folder" in html


def test_report_command_answers_in_one_line_for_a_missing_or_damaged_job(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    folder = make_run(runs, hosts=["n1", "n2"], fail_node=0)
    r = run_cli("report", JOB[:15], "--runs-dir", str(runs), "-o", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "r.html") and (tmp_path / "r.html").stat().st_size
    r = run_cli("report", "nosuch", "--runs-dir", str(runs))
    assert r.exit_code == 2 and r.stderr == f"fleetctl: error: no job nosuch in {runs}\n"
    (folder / "job.json").write_text('{"job_id": "x", "status": 3}')
    r = run_cli("report", str(folder))
    assert r.exit_code == 1 and r.stderr.count("\n") == 1
    assert "job.json: status must be str, not int" in r.stderr


FAILS = "import sys\nprint('about to fail', flush=True)\nsys.exit(5)\n"


def test_a_run_writes_its_report_unless_told_not_and_a_failed_write_is_only_a_warning(
    tmp_path: Path,
) -> None:
    from fleetctl.api import Fleet
    from fleetctl.api.runspec import RunSpec
    from fleetctl.errors import UsageError

    code = tmp_path / "code"
    code.mkdir()
    (code / "fails.py").write_text(FAILS)
    fleet = Fleet.local(runs_dir=tmp_path / "runs")
    host = fleet.nodes[0].name

    told: list[Any] = []
    job = fleet.run(str(code / "fails.py"), launcher="plain", code=code, on_event=told.append)
    r = job.wait(timeout=60)
    html = (r.run_folder / "report.html").read_text()
    assert r.exit_code == 3 and f'<span class="host">{host}</span>' in html
    # the check's own table (check.json): a column per check, each host's cell with its detail
    check = json.loads((r.run_folder / "check.json").read_text())
    assert check["checks"][0] == "ssh" and check["hosts"][0]["host"] == host
    disk = check["hosts"][0]["checks"]["disk"]["detail"]
    assert '<table class="cells">' in html and f'<td class="ok" title="ok">{disk}</td>' in html
    where = f"report: {r.run_folder / 'report.html'} (`fleetctl report {r.job_id}`)"
    assert where in [e.text for e in told if e.kind == "notice"]  # the user is told where

    r = fleet.run(str(code / "fails.py"), launcher="plain", code=code, report=False).wait(60)
    assert r.exit_code == 3 and not (r.run_folder / "report.html").exists()

    def block(nodes: Any, settings: Any) -> None:  # a directory where the report would go
        for job in (tmp_path / "runs3").iterdir():
            (job / "report.html").mkdir()

    events: list[Any] = []
    job = Fleet.local(runs_dir=tmp_path / "runs3").run(
        str(code / "fails.py"), launcher="plain", code=code, before=block, on_event=events.append
    )
    r = job.wait(timeout=60)
    assert r.exit_code == 3 and (r.run_folder / "report.html").is_dir()
    warned = [e.text for e in events if e.kind == "warning"]
    assert warned == [f"report not written: IsADirectoryError: {warned[0].split(': ', 2)[2]}"]
    try:
        RunSpec.build("t.py", report="no")
    except UsageError as e:
        assert str(e) == "Invalid value for '--no-report': 'no' is not True or False"
    else:
        raise AssertionError("report='no' was taken")


def test_a_stall_shades_the_quiet_stretch_on_every_lane_and_its_folded_stacks_are_listed(
    tmp_path: Path,
) -> None:
    stacks = [{"frame": "all_reduce (dist.py:9)", "ranks": [0, 1, 2]},
              {"frame": "stuck_loading_batch (train.py:70)", "ranks": [3]}]  # fmt: skip
    folder = make_run(tmp_path, hosts=["n1", "n2"], stacks=stacks)
    with (folder / "events.log").open("a") as f:
        f.write(f"{at(19)} failure stalled: no progress on any node for 12 s\n")
    r = load(folder)
    for lane in r.lanes:
        [stall] = [s for s in lane.spans if s.kind == "stall"]
        assert (stall.start, stall.end) == (_epoch(at(7)), _epoch(at(19)))
        assert [m.label for m in lane.marks if m.kind == "stall"] == [stall.label]
    html = build_report(folder)
    odd = re.search(r'<tr class="bad"><td><code>([^<]+)</code></td><td>3</td>', html)
    assert odd and odd.group(1) == "stuck_loading_batch (train.py:70)"


def test_lines_are_counted_exactly_in_a_small_log_and_estimated_past_the_limit(
    tmp_path: Path,
) -> None:
    from fleetctl.report.files import count_lines

    log = tmp_path / "rank.log"
    log.write_bytes(b"0123456789\n" * 1000)
    assert count_lines(log) == 1000 and count_lines(log, limit=1100) == 1000
    assert count_lines(tmp_path / "missing.log") == 0


def test_a_job_that_never_launched_still_has_a_report_with_its_errors(tmp_path: Path) -> None:
    folder = tmp_path / "J1"
    _write(folder / "job.json", {"job_id": "J1", "status": "error", "errors": ["node2: <refused>"]})
    html = build_report(folder)
    assert 'Job J1: <span class="status">error</span>' in html
    assert "<li>node2: &lt;refused&gt;</li>" in html and 'id="culprit"' not in html


def test_a_ctrl_c_while_the_report_is_written_is_a_warning_not_the_runs_end(
    tmp_path: Path,
) -> None:
    """The job has ended and its result is final: a Ctrl-C in the report's few milliseconds
    leaves the page unwritten and says how to write it, and the run returns its result."""
    from fleetctl.job.records.report import write_run_report

    def interrupted(folder: Path) -> Path:
        raise KeyboardInterrupt

    told: list[Any] = []
    write_run_report(interrupted, tmp_path / "J1", "J1", told.append)
    assert [(e.kind, e.text) for e in told] == [
        ("warning", "report not written: interrupted (`fleetctl report J1` writes it)")
    ]
