"""The failing rank's own error in the summary: its last traceback from its rank log, since a
launcher's last lines are its own boilerplate (golden files from a real torchrun 2.13 run in
rank_logs/: rank 1's stderr.log and torchrun's ``ChildFailedError`` tail)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from fleetctl.cli.render_summary import run_summary_lines
from fleetctl.job.diagnose.ranks import failed_ranks, rank_error, traceback_lines
from fleetctl.job.records.result import JobResult, NodeOutcome

LOGS = Path(__file__).parent / "rank_logs"
RANK1 = (LOGS / "torchrun_2.13_rank1_stderr.log").read_text()
CHILD_FAILED = (LOGS / "torchrun_2.13_child_failed_tail.txt").read_text().splitlines()
ERROR = "[rank1]: RuntimeError: rank 1 cannot load shard 7"


def test_the_last_traceback_keeps_torchs_rank_prefix_and_ends_at_its_exception() -> None:
    text = "step 1\nTraceback (most recent call last):\n  x\nValueError: old\n" + RANK1
    text += "[W1126 08:47:10] ProcessGroupGloo: some teardown noise\n"
    got = traceback_lines(text)
    assert got == RANK1.splitlines()
    assert got[0] == "[rank1]: Traceback (most recent call last):" and got[-1] == ERROR


def test_a_message_over_several_lines_and_a_deep_stack_are_kept_short() -> None:
    frames = "".join(f'  File "m.py", line {i}, in f{i}\n    f{i + 1}()\n' for i in range(30))
    text = f"Traceback (most recent call last):\n{frames}RuntimeError: first\nsecond\n\nafter\n"
    got = traceback_lines(text)
    assert len(got) == 12 and got[:2] == ["Traceback (most recent call last):", "  …"]
    assert got[-2:] == ["RuntimeError: first", "second"]


def test_a_traceback_cut_off_before_its_exception_is_not_shown() -> None:
    assert traceback_lines('Traceback (most recent call last):\n  File "m.py"\n') == []
    assert traceback_lines("no traceback here\n") == []


def test_without_a_traceback_the_last_lines_of_the_ranks_stderr_say_it(tmp_path: Path) -> None:
    (tmp_path / "stdout.log").write_text("epoch 1\n")
    (tmp_path / "stderr.log").write_text("terminate called after throwing\nAborted\n")
    got = rank_error(tmp_path, ["stderr.log", "stdout.log"])
    assert got == {
        "error": ["terminate called after throwing", "Aborted"],
        "error_log": "stderr.log",
    }
    assert rank_error(tmp_path, ["missing.log"]) == {}


def _torchrun_result(folder: Path, launcher: str = "torchrun") -> JobResult:
    node = folder / "1-node2"
    ranks = node / "torchrun" / "j_abc" / "attempt_0" / "1"
    ranks.mkdir(parents=True)
    (ranks / "stderr.log").write_text(RANK1)
    (ranks / "stdout.log").write_text("loading shard 7\n")
    (node / "console.log").write_text("\n".join(CHILD_FAILED) + "\n")
    exits = '{"exits": [{"local": 1, "code": 1, "at": 1.0}, {"local": 0, "code": -15, "at": 1.2}]}'
    (node / "rank_exits.json").write_text(exits)  # the supervisor's times name the culprit
    res = JobResult(job_id="j", folder=folder, status="failed")
    res.nodes = [
        NodeOutcome(0, "node1", "10.0.0.2", state="stopped", signal=15),
        NodeOutcome(1, "node2", "10.0.0.3", state="failed", exit_code=1, folder=str(node)),
    ]
    res.nodes[1].tail.extend(CHILD_FAILED)
    res.first_failure = 1
    res.plan = SimpleNamespace(launcher=launcher, procs=2)  # type: ignore[assignment]
    return res


def test_torchruns_summary_shows_the_failing_ranks_runtime_error(tmp_path: Path) -> None:
    res = _torchrun_result(tmp_path)
    rel = "1-node2/torchrun/j_abc/attempt_0/1"
    ranks = [
        {"rank": 3, "node": "node2", "node_rank": 1, "local_rank": 1,
         "logs": [f"{rel}/stderr.log", f"{rel}/stdout.log"]},
    ]  # fmt: skip
    res.failed_ranks = failed_ranks(res, ranks)
    [f] = res.failed_ranks
    assert f["rank"] == 3 and f["error"][-1] == ERROR and f["error_log"] == f"{rel}/stderr.log"
    lines = run_summary_lines(res)
    assert ERROR in lines  # torchrun's ChildFailedError tail alone would not say it
    at = lines.index(f"--- rank 3 (node2), from {rel}/stderr.log ---")
    assert lines[at + 1 : at + 7] == RANK1.splitlines() and lines[at + 7] == "---"
    assert lines.index(CHILD_FAILED[-1]) < at  # after the node's tail, nearest the prompt


def test_an_error_the_nodes_tail_already_shows_is_not_repeated(tmp_path: Path) -> None:
    res = _torchrun_result(tmp_path, launcher="plain")
    (tmp_path / "1-node2" / "console.log").write_text("step 1\n" + RANK1)
    (tmp_path / "1-node2" / "rank_exits.json").unlink()
    res.nodes[1].tail.clear()  # the collected console.log is the tail
    res.failed_ranks = failed_ranks(res, [{"rank": 1, "logs": ["1-node2/console.log"]}])
    assert res.failed_ranks[0]["error"][-1] == ERROR
    lines = run_summary_lines(res)
    assert lines.count(ERROR) == 1 and not any(x.startswith("--- rank 1") for x in lines)
