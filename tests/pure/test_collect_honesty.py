"""Collection never claims more than came home: a started node's console.log must arrive
whole, Ctrl-C while collecting is recorded per node, and the run folder names its controller."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleetctl.cli.render_collect import collect_lines, collect_summary_lines
from fleetctl.job.records.files import ConnectRecord
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.runfolder import STREAMED_CONSOLE, RunFolder
from fleetctl.phases.collect import (
    INTERRUPTED,
    CollectInterrupted,
    NodeCollect,
    check_console,
    collect,
    interrupted,
)


def _node(tmp_path: Path, console: bytes | None) -> NodeCollect:
    folder = tmp_path / "1-node2"
    folder.mkdir()
    files = ["supervisor.json"]
    if console is not None:
        (folder / "console.log").write_bytes(console)
        files.append("console.log")
    return NodeCollect("node2", 1, str(folder), files=files)


def test_a_node_whose_console_log_was_not_in_its_run_folder_is_incomplete(
    tmp_path: Path,
) -> None:
    c = _node(tmp_path, None)  # the manifest listed no console.log: folder hidden mid-run
    assert not c.incomplete
    check_console(c, 2002)
    assert c.incomplete and c.to_dict()["complete"] is False
    [gap] = c.not_collected
    assert gap["path"] == "console.log" and gap["reason"] == "missing"
    (Path(c.folder) / STREAMED_CONSOLE).write_text("kept\n")
    [line, hint] = collect_summary_lines([c], "job-1")
    assert line.startswith("LOGS INCOMPLETE for node 1 (node2): console.log: not in the node's")
    assert line.endswith(f"every line that streamed is in {c.folder}/{STREAMED_CONSOLE}")
    assert hint == "`fleetctl collect job-1` fetches what is missing (nothing twice)"


def test_a_console_log_with_fewer_lines_than_streamed_is_incomplete(tmp_path: Path) -> None:
    c = _node(tmp_path, b"a\nb\nc")  # 3 lines, the last without its newline
    check_console(c, 4)
    [gap] = c.not_collected
    assert gap["reason"] == "short" and gap["detail"].startswith("3 of the 4 lines")
    assert c.incomplete


def test_a_whole_console_log_keeps_the_node_complete(tmp_path: Path) -> None:
    c = _node(tmp_path, b"a\nb\nc\n")
    check_console(c, 3)
    check_console(c)  # `fleetctl collect`: nothing streamed to compare with
    assert c.not_collected == [] and not c.incomplete
    assert collect_summary_lines([c], "job-1") == []


def test_ctrl_c_while_collecting_marks_every_unfinished_node_interrupted(tmp_path: Path) -> None:
    nodes = [SimpleNamespace(name=h) for h in ("node1", "node2", "node3")]

    def cut(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    fleet = SimpleNamespace(nodes=nodes, fanout=64, map=cut)
    plan = SimpleNamespace(
        nodes=[SimpleNamespace(host=n.name, node_rank=i, run_dir="r") for i, n in enumerate(nodes)]
    )
    with pytest.raises(KeyboardInterrupt) as got:
        collect(fleet, plan, tmp_path, pythons={}, skip={"node3"})  # type: ignore[arg-type]
    assert isinstance(got.value, CollectInterrupted)
    results = got.value.results
    assert [(c.host, c.error, c.skipped) for c in results] == [
        ("node1", INTERRUPTED, None),
        ("node2", INTERRUPTED, None),
        ("node3", None, "node lost: not reachable"),
    ]
    assert interrupted(results) and all(c.incomplete for c in results)
    assert not interrupted([NodeCollect("node1", 0, str(tmp_path))])


def test_a_node_kept_from_the_jobs_own_collection_says_nothing_was_copied_now() -> None:
    """`collect` after a Slurm allocation ended (or with a node powered off since): the node's
    record stands, complete, and its line says why nothing came now, never "copied now"."""
    kept = NodeCollect(
        "node1",
        0,
        "/r/0-node1",
        files=["console.log", "supervisor.json"],
        bytes=1843,
        unreachable="srun: error: Unable to confirm allocation for job 12: Invalid job id\nx",
    )
    assert not kept.incomplete and kept.to_dict()["complete"] is True
    assert kept.to_dict()["unreachable"].startswith("srun: error: Unable to confirm")
    assert "unreachable" not in NodeCollect("node2", 1, "/r/1-node2").to_dict()
    assert collect_lines([kept]) == [
        "  [0 node1] 2 file(s) home, whole since the job ended; not reachable now "
        "(srun: error: Unable to confirm allocation for job 12: Invalid job id)"
    ]
    assert collect_summary_lines([kept], "j1") == []


def test_the_run_folder_names_the_controller_that_created_it(tmp_path: Path) -> None:
    from fleetctl.job.monitor.handle import JobHandle

    folder = RunFolder.create(tmp_path, "job-1")
    folder.write_job(JobRecord(job_id="job-1", status="running"))
    folder.write_record(ConnectRecord())
    ctl = JobHandle(tmp_path, "job-1").controller()
    assert ctl is not None and ctl["pid"] == os.getpid() and ctl["alive"] is True
    dead = subprocess.Popen(["true"])
    dead.wait()
    info = folder.load_controller()
    assert info is not None
    info.pid = dead.pid
    folder.write_record(info)
    ctl = JobHandle(tmp_path, "job-1").controller()
    assert ctl is not None and ctl["alive"] is False
