"""Collection cannot lie: the node's ``pack`` (real supervisor code) sends its manifest and the
small files first, leaves files over the cap or excluded on the node and lists them, skips what
is home already; the controller never leaves a truncated file and says what did not arrive."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from fleetctl.errors import UsageError
from fleetctl.phases.collect import CollectOptions, NodeCollect, account, parse_size
from fleetctl.phases.unpack import PART_PREFIX, local_files, partial_files, unpack
from fleetctl.remote.programs import supervisor

BIG = 300_000


def node_run_dir(root: Path) -> Path:
    run = root / "node-run"
    (run / "log").mkdir(parents=True)
    (run / "console.log").write_bytes(b"line\n" * 1000)
    (run / "supervisor.json").write_text('{"state": "exited", "exit_code": 0}')
    (run / "log" / "workerlog.0").write_bytes(b"worker 0\n" * 50)
    (run / "checkpoint.pt").write_bytes(os.urandom(BIG))
    (run / "metrics.bin").write_bytes(b"m" * 100)
    os.utime(run / "console.log", (1_700_000_000, 1_700_000_000))
    return run


def pack(
    run: Path, options: CollectOptions, have: dict | None = None, partial: dict | None = None
) -> bytes:
    out = run.parent / "packed.tar"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        supervisor.pack_dir(str(run), fd, options.wire(have, partial))
    finally:
        os.close(fd)
    return out.read_bytes()


def member_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        return [m.name for m in tar if not m.isdir()]


def collected(data: bytes, dest: Path, out: NodeCollect | None = None) -> NodeCollect:
    out = out or NodeCollect("node3", 2, str(dest))
    account(out, unpack(io.BytesIO(data), dest))
    return out


def test_pack_sends_the_manifest_and_logs_first_and_lists_a_file_over_the_cap(
    tmp_path: Path,
) -> None:
    run = node_run_dir(tmp_path)
    data = pack(run, CollectOptions(max_bytes=100_000))
    names = member_names(data)
    assert names[0] == supervisor.COLLECT_MANIFEST
    assert names[1:4] == ["supervisor.json", "console.log", "log/workerlog.0"]
    assert "checkpoint.pt" not in names and "metrics.bin" in names

    dest = tmp_path / "home"
    got = collected(data, dest)
    assert got.files == ["console.log", "log/workerlog.0", "metrics.bin", "supervisor.json"]
    assert got.not_collected == [
        {
            "path": "checkpoint.pt",
            "size": BIG,
            "reason": "over cap",
            "detail": "over the 97.7 KiB cap",
        }
    ]
    assert not got.incomplete and got.to_dict()["complete"] is True
    assert not (dest / "checkpoint.pt").exists()
    assert not (dest / supervisor.COLLECT_MANIFEST).exists()
    assert (dest / "console.log").read_bytes() == (run / "console.log").read_bytes()
    assert int((dest / "console.log").stat().st_mtime) == 1_700_000_000  # the node's mtime


def test_excluded_files_stay_on_the_node_and_are_listed_with_their_glob(tmp_path: Path) -> None:
    run = node_run_dir(tmp_path)
    data = pack(run, CollectOptions(max_bytes=None, exclude=("*.pt", "log/*")))
    got = collected(data, tmp_path / "home")
    assert got.files == ["console.log", "metrics.bin", "supervisor.json"]
    assert {(f["path"], f["reason"], f["detail"]) for f in got.not_collected} == {
        ("checkpoint.pt", "excluded", "excluded by '*.pt'"),
        ("log/workerlog.0", "excluded", "excluded by 'log/*'"),
    }


def test_a_later_collect_with_a_larger_cap_sends_only_what_is_not_home(tmp_path: Path) -> None:
    run = node_run_dir(tmp_path)
    dest = tmp_path / "home"
    first = collected(pack(run, CollectOptions(max_bytes=100_000)), dest)
    assert [f["path"] for f in first.not_collected] == ["checkpoint.pt"]

    (run / "console.log").write_bytes(b"line\n" * 1001)  # grew since: sent again
    again = pack(run, CollectOptions(max_bytes=1 << 20), have=local_files(dest))
    assert member_names(again)[1:] == ["console.log", "checkpoint.pt"]
    got = collected(again, dest)
    assert got.not_collected == []
    assert got.files == [
        "checkpoint.pt",
        "console.log",
        "log/workerlog.0",
        "metrics.bin",
        "supervisor.json",
    ]
    assert (dest / "checkpoint.pt").read_bytes() == (run / "checkpoint.pt").read_bytes()
    assert (dest / "console.log").read_bytes() == b"line\n" * 1001


def test_a_broken_transfer_leaves_no_truncated_file_and_says_what_is_missing(
    tmp_path: Path,
) -> None:
    run = node_run_dir(tmp_path)
    data = pack(run, CollectOptions(max_bytes=None))
    cut = data[: len(data) - BIG // 2]  # the link dies in the middle of the big file
    dest = tmp_path / "home"
    got = collected(cut, dest)
    assert got.transfer_failed and got.incomplete
    assert [(f["path"], f["reason"]) for f in got.not_collected] == [
        ("checkpoint.pt", "transfer failed")
    ]
    assert "console.log" in got.files and "checkpoint.pt" not in got.files
    assert not (dest / "checkpoint.pt").exists()
    assert [p.name for p in dest.rglob(f"{PART_PREFIX}*")] == []

    # the retry asks only for what is missing and completes the folder
    retry = pack(run, CollectOptions(max_bytes=None), have=local_files(dest))
    assert member_names(retry)[1:] == ["checkpoint.pt"]
    done = collected(retry, dest, got)
    assert not done.incomplete and done.not_collected == []
    assert (dest / "checkpoint.pt").read_bytes() == (run / "checkpoint.pt").read_bytes()


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4096", 4096),
        ("500M", 500 << 20),
        ("2G", 2 << 30),
        ("1.5GiB", int(1.5 * (1 << 30))),
        ("64k", 64 << 10),
        ("unlimited", None),
    ],
)
def test_collect_sizes_read_like_ops_people_write_them(text: str, size: int | None) -> None:
    assert parse_size(text) == size


def test_a_bad_collect_size_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="bad size '12 parsecs'"):
        parse_size("12 parsecs")


class _CutAfter:
    """A real stream that breaks after ``limit`` bytes, as a dying SSH link does."""

    def __init__(self, stream: Any, limit: int) -> None:
        self.stream, self.left = stream, limit

    def recv(self, timeout: float) -> bytes | None:
        if self.left <= 0:
            self.stream.close()
            return b""
        data = self.stream.recv(timeout)
        if data:
            data = data[: self.left]
            self.left -= len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def test_a_transfer_that_breaks_is_retried_and_fetches_only_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.job.monitor.supervisors import ensure_supervisor
    from fleetctl.node import Node
    from fleetctl.phases.collect import collect
    from fleetctl.plan.rankplan import JobSpec, make_plan
    from fleetctl.ssh.fanout import FanOut
    from fleetctl.transport.local import LocalConnection

    node = Node.localhost(name="n0", workdir=str(tmp_path / "w"))
    plan = make_plan([node], JobSpec(script="x.py", job_id="j-cut", launcher="plain"))
    (tmp_path / "w" / "runs" / "j-cut").mkdir(parents=True)
    node_run_dir(tmp_path / "w" / "runs").rename(tmp_path / "w" / "runs" / "j-cut" / "0-n0")
    starts: list[str] = []
    real_start = LocalConnection.start

    def start(self: LocalConnection, command: Any) -> Any:
        stream = real_start(self, command)
        if " pack " not in str(command):
            return stream
        starts.append(str(command))
        return _CutAfter(stream, 60_000) if len(starts) == 1 else stream  # the 1st breaks

    monkeypatch.setattr(LocalConnection, "start", start)
    home = tmp_path / "home"
    with FanOut([node]) as fleet:
        ensure_supervisor(fleet)
        [got] = collect(
            fleet,
            plan,
            home,
            pythons={"n0": node.python},
            options=CollectOptions(max_bytes=None),
        )
    assert len(starts) == 2 and got.attempts == 2
    assert got.error is None and not got.incomplete and got.not_collected == []
    run = tmp_path / "w" / "runs" / "j-cut" / "0-n0"
    dest = home / "0-n0"
    assert (dest / "checkpoint.pt").read_bytes() == (run / "checkpoint.pt").read_bytes()
    assert (dest / "console.log").read_bytes() == (run / "console.log").read_bytes()
    # the second transfer carried only the big file: the small ones were home after the first
    assert BIG <= got.bytes < BIG + 60_000
    assert [p.name for p in dest.rglob(f"{PART_PREFIX}*")] == []


def test_a_big_file_cut_half_way_is_resumed_from_where_it_broke(tmp_path: Path) -> None:
    run = node_run_dir(tmp_path)
    (run / "checkpoint.pt").write_bytes(os.urandom(3 << 20))
    data = pack(run, CollectOptions(max_bytes=None))
    dest = tmp_path / "home"
    got = collected(data[: len(data) - (1 << 20)], dest)  # 2 MiB of it arrived
    assert got.transfer_failed and not (dest / "checkpoint.pt").exists()
    [partial] = list(dest.glob(f"{PART_PREFIX}checkpoint.pt.*.part"))  # marked, not the real name
    have = partial.stat().st_size
    assert have >= 1 << 20

    again = pack(run, CollectOptions(max_bytes=None), local_files(dest), partial_files(dest))
    with tarfile.open(fileobj=io.BytesIO(again), mode="r|") as tar:
        sent = [(m.name, m.size, m.pax_headers.get("fleetctl.offset")) for m in tar if m.isfile()]
    assert sent[1:] == [("checkpoint.pt", (3 << 20) - have, str(have))]  # only the rest
    done = collected(again, dest, got)
    assert not done.incomplete and done.not_collected == []
    assert (dest / "checkpoint.pt").read_bytes() == (run / "checkpoint.pt").read_bytes()
    assert list(dest.glob(f"{PART_PREFIX}*")) == []


def test_a_bad_collect_max_is_refused_before_anything_runs(tmp_path: Path) -> None:
    from fleetctl.testing.cli_runner import run_cli

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    runs = tmp_path / "runs"
    p = run_cli("run", "--collect-max", "12 parsecs", "--runs-dir", str(runs), str(script))
    assert p.exit_code == 2
    assert p.stderr.strip().splitlines() == [
        "fleetctl: error: Invalid value for --collect-max: bad size '12 parsecs': "
        "use e.g. 500M, 2G, 1.5GiB or unlimited"
    ]
    assert not runs.exists()
