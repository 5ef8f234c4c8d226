"""Collect never trusts remote names: nothing lands outside the node's folder, no links."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from fleetctl.job.records.runfolder import node_folder_name
from fleetctl.phases.unpack import extract_tar, safe_member_path


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("console.log", "console.log"),
        ("./console.log", "console.log"),
        ("torchrun/j_abc/attempt_0/0/error.json", "torchrun/j_abc/attempt_0/0/error.json"),
        ("log//workerlog.0", "log/workerlog.0"),
        ("log/./endpoints.log", "log/endpoints.log"),
        ("", None),
        (".", None),
        ("/etc/passwd", None),
        ("../escape", None),
        ("log/../../escape", None),
        ("log/..", None),
        ("a\\..\\b", None),
        ("nul\0byte", None),
    ],
)
def test_member_names_are_accepted_only_when_they_stay_inside(name: str, safe: str) -> None:
    assert safe_member_path(name) == safe


@pytest.mark.parametrize(
    ("rank", "host", "folder"),
    [
        (0, "node1", "0-node1"),
        (3, "gpu-03.example.com", "3-gpu-03.example.com"),
        (1, "../etc", "1-_etc"),
        (2, "a/b c", "2-a_b_c"),
        (4, "..", "4-node"),
    ],
)
def test_node_folders_are_named_rank_dash_host_without_separators(
    rank: int, host: str, folder: str
) -> None:
    assert node_folder_name(rank, host) == folder


def _tar(entries: list[tarfile.TarInfo], data: dict[str, bytes]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in entries:
            payload = data.get(info.name)
            if payload is not None:
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                tar.addfile(info)
    buf.seek(0)
    return buf


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def test_a_hostile_archive_writes_nothing_outside_and_no_links(tmp_path: Path) -> None:
    dest = tmp_path / "run" / "1-node2"
    outside = tmp_path / "outside"
    outside.mkdir()
    fifo = tarfile.TarInfo("fifo")
    fifo.type = tarfile.FIFOTYPE
    evil_dir = tarfile.TarInfo("logs")
    evil_dir.type = tarfile.DIRTYPE
    entries = [
        _file("console.log"),
        evil_dir,
        _file("logs/workerlog.0"),
        _file("/abs/file"),
        _file("../escape.txt"),
        _file("logs/../../escape2.txt"),
        _link("link", str(outside)),
        _file("link/through-link.txt"),
        _link("hard", "/etc/passwd", tarfile.LNKTYPE),
        fifo,
    ]
    data = {
        "console.log": b"hello\n",
        "logs/workerlog.0": b"worker\n",
        "/abs/file": b"x",
        "../escape.txt": b"x",
        "logs/../../escape2.txt": b"x",
        "link/through-link.txt": b"x",
    }
    files, size, refused = extract_tar(_tar(entries, data), dest)
    assert sorted(files) == ["console.log", "link/through-link.txt", "logs/workerlog.0"]
    assert size == len(b"hello\n") + len(b"worker\n") + 1
    assert set(refused) == {
        "/abs/file",
        "../escape.txt",
        "logs/../../escape2.txt",
        "link",
        "hard",
        "fifo",
    }
    # The symlink was never created, so "link/" is a real folder inside dest.
    assert (dest / "link").is_dir() and not (dest / "link").is_symlink()
    assert list(outside.iterdir()) == []
    assert (
        not (tmp_path / "escape.txt").exists() and not (tmp_path / "run" / "escape2.txt").exists()
    )
    for root, dirs, names in os.walk(tmp_path / "run"):
        for n in dirs + names:
            assert not os.path.islink(os.path.join(root, n))
    assert (dest / "console.log").read_bytes() == b"hello\n"
    assert oct(dest.stat().st_mode & 0o777) == "0o700"
    assert oct((dest / "console.log").stat().st_mode & 0o777) == "0o600"


def test_a_planted_symlink_in_the_destination_is_not_followed(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (dest / "logs").symlink_to(outside)
    (dest / "console.log").symlink_to(outside / "victim")
    entries = [_file("logs/workerlog.0"), _file("console.log")]
    files, _, refused = extract_tar(
        _tar(entries, {"logs/workerlog.0": b"w", "console.log": b"c"}), dest
    )
    assert files == [] and sorted(refused) == ["console.log", "logs/workerlog.0"]
    assert list(outside.iterdir()) == []
