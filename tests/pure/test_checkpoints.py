"""A retry's checkpoint relay: ``--checkpoint-dir`` checking, which nodes get a copy, how, and
the whole relay between local nodes (LocalConnection: the controller's SFTP path, no SSH)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fleetctl.errors import UsageError
from fleetctl.job.records.result import JobResult
from fleetctl.job.run.checkpoints import relay_source
from fleetctl.node import Node
from fleetctl.phases.push.relay import (
    PEER_MIN_BYTES,
    RelayReport,
    RelaySource,
    RelayTarget,
    checkpoint_dir_arg,
    plan_targets,
    relay_checkpoints,
    relay_method,
)
from fleetctl.plan.rankplan import JobSpec, make_plan
from fleetctl.ssh.fanout import FanOut
from fleetctl.testing.cli_runner import run_cli


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (None, None),
        (".", None),
        ("./", None),
        ("ckpt", "ckpt"),
        ("lightning_logs/version_0/checkpoints/", "lightning_logs/version_0/checkpoints"),
        ("/scratch/ckpt", "/scratch/ckpt"),
        ("~/ckpt", "~/ckpt"),
    ],
)
def test_checkpoint_dir_is_relative_to_the_work_folder_or_absolute(
    text: str | None, want: str | None
) -> None:
    assert checkpoint_dir_arg(text) == want


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("..", "'..' is not allowed"),
        ("ckpt/../../runs", "'..' is not allowed"),
        ("/scratch/../etc", "'..' is not allowed"),
        ("", "give a folder name"),
        ("a\nb", "give a folder name"),
        ("/", "not a whole filesystem"),
        ("~", "not a whole filesystem"),
        ("~bob/ckpt", "only ~/"),
    ],
)
def test_a_checkpoint_dir_that_escapes_is_a_usage_error(text: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        checkpoint_dir_arg(text)


def test_the_cli_refuses_a_bad_checkpoint_dir_in_one_line_with_exit_2(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    res = run_cli(
        "run", "--dry-run", "--checkpoint-dir", "../up", str(tmp_path / "train.py"), cwd=tmp_path
    )
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        "fleetctl: error: --checkpoint-dir '../up': '..' is not allowed (relative to the work "
        "folder)"
    ]


def test_targets_skip_the_source_and_nodes_that_share_a_workdir() -> None:
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    # n1 is the source, n2 shares its home; n4 and n5 share another: only n4 gets a copy
    to_copy, notes = plan_targets("n1", nodes, [["n1", "n2"], ["n4", "n5"]])
    assert to_copy == ["n3", "n4"]
    assert notes == {
        "n1": "the source",
        "n2": "shares its workdir with n1",
        "n5": "shares its workdir with n4",
    }
    # a spare run: the source is not among this attempt's nodes
    assert plan_targets("n2", ["n1", "n3"], ()) == (["n1", "n3"], {})
    # a group whose first node is not in this attempt: its next node is the one copied to
    assert plan_targets("n9", ["n2", "n3"], [["n1", "n2", "n3"]])[0] == ["n2", "n3"]


def test_large_sets_on_four_hosts_go_from_peer_to_peer() -> None:
    assert relay_method(4, PEER_MIN_BYTES, "10.0.0.1") == "peer"
    assert relay_method(3, PEER_MIN_BYTES, "10.0.0.1") == "controller"
    assert relay_method(8, PEER_MIN_BYTES - 1, "10.0.0.1") == "controller"
    assert relay_method(8, PEER_MIN_BYTES, None) == "controller"


def test_the_source_is_rank_0_of_the_last_attempt_that_was_planned() -> None:
    pool = [Node.localhost(name=f"n{i}", workdir=f"/w{i}") for i in (1, 2, 3)]
    spec = JobSpec(script="train.py", job_id="j1.2", work_id="j1", launcher="plain")
    planned = JobResult(job_id="j1.2", folder="f", attempt=2)
    planned.plan = make_plan([pool[2], pool[0]], spec, code_digest="d1")
    unplanned = JobResult(job_id="j1.3", folder="f", attempt=3)
    src = relay_source(pool, [planned, unplanned])
    assert src is not None
    assert (src.node.name, src.attempt) == ("n3", 2)
    assert (src.work_dir, src.code_dir) == ("/w3/work/j1", "/w3/code/d1")
    assert relay_source(pool, [unplanned]) is None
    # the job ran in the script's folder inside the work folder: both are kept
    sub = JobSpec(script="sub/train.py", job_id="j1", launcher="plain", folder="sub")
    planned.plan = make_plan([pool[0]], sub, code_digest="d1")
    src = relay_source(pool, [planned])
    assert src is not None and (src.work_dir, src.cwd) == ("/w1/work/j1", "/w1/work/j1/sub")


def folders(root: Path, name: str) -> tuple[Node, Path, Path]:
    w = root / name
    snap = w / "code" / "d1"
    snap.mkdir(parents=True)
    (snap / "train.py").write_text("print('train')\n")
    return Node.localhost(name=name, workdir=str(w)), snap, w / "work" / "j1"


def test_rank_0s_snapshot_reaches_a_fresh_node_and_not_one_sharing_its_workdir(
    tmp_path: Path,
) -> None:
    n1, snap1, work1 = folders(tmp_path, "n1")
    shutil.copytree(snap1, work1)
    (work1 / "snapshot.pt").write_bytes(b"epoch=12")
    n2, snap2, work2 = folders(tmp_path, "n2")
    n3 = Node.localhost(name="n3", workdir=str(tmp_path / "n1"))  # n1's home, seen from n3
    source = RelaySource(n1, str(work1), str(snap1))
    targets = [
        RelayTarget(n1, str(work1), str(snap1)),
        RelayTarget(n2, str(work2), str(snap2)),
        RelayTarget(n3, str(work1), str(snap1)),
    ]
    with FanOut([n1, n2, n3]) as fleet:
        report = relay_checkpoints(fleet, source, targets)
    assert (work2 / "snapshot.pt").read_bytes() == b"epoch=12"
    assert (work2 / "train.py").exists()
    assert report.to_dict() == {
        "from": "n1",
        "attempt": 1,
        "dir": None,
        "files": ["snapshot.pt"],
        "count": 1,
        "bytes": 8,
        "method": "controller",
        "nodes": {"n1": "the source", "n2": "copied", "n3": "shares its workdir with the source"},
        "sent": {"n2": 8},
        "skipped": None,
        "secrets": [],
    }
    assert report.summary() == (
        "checkpoints: 1 file(s), 8 bytes from n1 (rank 0 of attempt 1) to n2 (controller); "
        "n3 share a workdir, nothing copied"
    )
    leftover = [p for p in tmp_path.rglob("*") if ".tmp-relay" in p.name or ".relay-" in p.name]
    assert leftover == []


def test_a_second_relay_sends_a_node_only_the_files_it_does_not_hold(tmp_path: Path) -> None:
    """The retry after a retry: n2 got the snapshot last time (same size and sha256: nothing
    sent), n3 holds a stale one of the same size (sent again), n4 holds one of two files."""
    n1, snap1, work1 = folders(tmp_path, "n1")
    shutil.copytree(snap1, work1)
    (work1 / "snapshot.pt").write_bytes(b"epoch=12")
    (work1 / "opt.pt").write_bytes(b"adam-state")
    others = {name: folders(tmp_path, name) for name in ("n2", "n3", "n4")}
    for name, (_node, snap, work) in others.items():
        shutil.copytree(snap, work)
        (work / "snapshot.pt").write_bytes(b"epoch=12" if name != "n3" else b"epoch=11")
        if name == "n2":
            (work / "opt.pt").write_bytes(b"adam-state")
    before = {n: (w / "snapshot.pt").stat().st_mtime_ns for n, (_, _, w) in others.items()}
    source = RelaySource(n1, str(work1), str(snap1), attempt=2)
    targets = [RelayTarget(node, str(work), str(snap)) for node, snap, work in others.values()]
    with FanOut([n1, *(node for node, _s, _w in others.values())]) as fleet:
        report = relay_checkpoints(fleet, source, targets)
    assert report.nodes == {
        "n2": "up to date (2 file(s) there)",
        "n3": "copied",
        "n4": "copied 1 of 2 file(s)",
    }
    assert report.sent == {"n2": 0, "n3": 18, "n4": 10}
    for name, (_node, _snap, work) in others.items():
        assert (work / "snapshot.pt").read_bytes() == b"epoch=12", name
        assert (work / "opt.pt").read_bytes() == b"adam-state", name
    # n2's and n4's snapshot were never rewritten: only what a node lacked reached it
    assert (others["n2"][2] / "snapshot.pt").stat().st_mtime_ns == before["n2"]
    assert (others["n4"][2] / "snapshot.pt").stat().st_mtime_ns == before["n4"]
    assert "n2 already hold them, nothing sent" in report.summary()
    assert [p for p in tmp_path.rglob("*") if ".tmp-relay" in p.name] == []


def test_over_the_cap_nothing_is_copied_and_the_report_says_why(tmp_path: Path) -> None:
    n1, snap1, work1 = folders(tmp_path, "n1")
    shutil.copytree(snap1, work1)
    (work1 / "snapshot.pt").write_bytes(b"x" * 100)
    n2, snap2, work2 = folders(tmp_path, "n2")
    report = RelayReport("n1", 1)
    with FanOut([n1, n2]) as fleet:
        relay_checkpoints(
            fleet,
            RelaySource(n1, str(work1), str(snap1)),
            [RelayTarget(n2, str(work2), str(snap2))],
            max_bytes=50,
            report=report,
        )
    assert report.skipped == "100 bytes, over the relay cap of 50"
    assert not work2.exists() and report.nodes == {}
    assert report.summary().startswith("checkpoints not relayed from n1 (rank 0 of attempt 1): ")


def test_the_peer_relay_fetches_from_the_sources_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The large-set path, made small: every node fetches the tar from the source's serve."""
    from fleetctl.phases.push import relay as checkpoints

    monkeypatch.setattr(checkpoints, "PEER_MIN_HOSTS", 2)
    monkeypatch.setattr(checkpoints, "PEER_MIN_BYTES", 1)
    n1, snap1, work1 = folders(tmp_path, "n1")
    shutil.copytree(snap1, work1)
    (work1 / "ckpt").mkdir()
    (work1 / "ckpt" / "last.ckpt").write_bytes(b"w" * 5000)
    n2, snap2, work2 = folders(tmp_path, "n2")
    with FanOut([n1, n2]) as fleet:
        report = relay_checkpoints(
            fleet,
            RelaySource(n1, str(work1), str(snap1), train_addr="127.0.0.1"),
            [RelayTarget(n2, str(work2), str(snap2))],
            folder="ckpt",
        )
    assert report.method == "peer" and report.nodes == {"n2": "copied from n1"}
    assert report.files == ["last.ckpt"]
    assert (work2 / "ckpt" / "last.ckpt").read_bytes() == b"w" * 5000
    assert [p for p in tmp_path.rglob("*") if ".tmp-relay" in p.name] == []
