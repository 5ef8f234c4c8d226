"""Code snapshots: ignore rules, file lists, content digests, the OpenSSH/rsync command line."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from fleetctl.node import Node
from fleetctl.phases.codesync import (
    IgnoreMatcher,
    list_files,
    rsync_argv,
    snapshot,
)
from fleetctl.phases.envpack import archive_info, nccl_version
from fleetctl.plan.script_arg import default_code_dir
from fleetctl.testing.files import tree
from fleetctl.transport.connection import SSHSettings
from fleetctl.transport.openssh import rsync_target, ssh_argv

# (patterns, path, is_dir, ignored) — gitignore semantics, checked against git below.
IGNORE_CASES = [
    ("*.log", "a.log", False, True),
    ("*.log", "deep/er/a.log", False, True),
    ("*.log\n!keep.log", "keep.log", False, False),
    ("/build", "build", True, True),
    ("/build", "src/build", True, False),
    ("build/", "src/build", True, True),
    ("build/", "build", False, False),
    ("docs/*.md", "docs/a.md", False, True),
    ("docs/*.md", "docs/sub/a.md", False, False),
    ("docs/**/*.md", "docs/sub/a.md", False, True),
    ("**/cache", "x/y/cache", True, True),
    ("data/**", "data/a/b.bin", False, True),
    ("a?c", "abc", False, True),
    ("a?c", "a/c", False, False),
    ("[ab].txt", "b.txt", False, True),
    ("[!ab].txt", "b.txt", False, False),
    ("# comment\n\n*.tmp", "x.tmp", False, True),
    (r"\#lit", "#lit", False, True),
]


@pytest.mark.parametrize(("patterns", "path", "is_dir", "ignored"), IGNORE_CASES)
def test_ignore_patterns_follow_gitignore(
    tmp_path: Path, patterns: str, path: str, is_dir: bool, ignored: bool
) -> None:
    (tmp_path / ".gitignore").write_text(patterns + "\n")
    assert IgnoreMatcher(tmp_path, (".gitignore",)).ignored(path, is_dir) is ignored


@pytest.mark.parametrize(("patterns", "path", "is_dir", "ignored"), IGNORE_CASES)
def test_ignore_cases_agree_with_git_itself(
    tmp_path: Path, patterns: str, path: str, is_dir: bool, ignored: bool
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text(patterns + "\n")
    target = tmp_path / path
    if is_dir:
        target.mkdir(parents=True)
        (target / "f").write_text("x")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x")
    r = subprocess.run(
        ["git", "-C", str(tmp_path), "check-ignore", "-q", path + ("/f" if is_dir else "")],
        check=False,
    )
    assert (r.returncode == 0) is ignored


def test_files_outside_git_honour_gitignore_and_fleetignore_per_directory(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "train.py": "",
            "run.log": "",
            ".gitignore": "*.log\n__pycache__/\n",
            ".fleetignore": "data/\n",
            "data/big.bin": "",
            "pkg/mod.py": "",
            "pkg/__pycache__/mod.pyc": "",
            "pkg/.gitignore": "!important.log\nlocal.cfg\n",
            "pkg/important.log": "",
            "pkg/local.cfg": "",
            ".git/config": "",
        },
    )
    assert list_files(tmp_path) == [
        ".fleetignore",
        ".gitignore",
        "pkg/.gitignore",
        "pkg/important.log",
        "pkg/mod.py",
        "train.py",
    ]


def test_files_in_git_repo_come_from_git_plus_fleetignore(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tree(
        tmp_path,
        {
            "train.py": "",
            ".gitignore": "out/\n",
            "out/ckpt.pt": "",
            "untracked.py": "",
            ".fleetignore": "notes.md\n",
            "notes.md": "",
            "sub/.fleetignore": "*.csv\n",
            "sub/x.csv": "",
            "sub/y.py": "",
        },
    )
    subprocess.run(["git", "-C", str(tmp_path), "add", "train.py"], check=True)
    assert list_files(tmp_path) == [
        ".fleetignore",
        ".gitignore",
        "sub/.fleetignore",
        "sub/y.py",
        "train.py",
        "untracked.py",
    ]


def test_digest_depends_on_content_and_exec_bit_not_on_mtime(tmp_path: Path) -> None:
    tree(tmp_path, {"a.py": "print(1)\n", "b/c.txt": "x"})
    first = snapshot(tmp_path)
    assert first.files == ("a.py", "b/c.txt") and first.total_bytes == 10
    os.utime(tmp_path / "a.py", (1, 1))
    assert snapshot(tmp_path).digest == first.digest
    (tmp_path / "a.py").write_text("print(2)\n")
    second = snapshot(tmp_path)
    assert second.digest != first.digest
    (tmp_path / "a.py").chmod(0o755)
    assert snapshot(tmp_path).digest != second.digest


def test_a_huge_tree_is_refused_with_a_hint(tmp_path: Path) -> None:
    from fleetctl.errors import UsageError

    tree(tmp_path, {f"f{i}.txt": "" for i in range(5)})
    with pytest.raises(UsageError, match=r"has 5 files .*\.fleetignore"):
        snapshot(tmp_path, max_files=4)


def test_symlinks_ship_as_links(tmp_path: Path) -> None:
    tree(tmp_path, {"real.txt": "x"})
    (tmp_path / "link.txt").symlink_to("real.txt")
    snap = snapshot(tmp_path)
    assert snap.manifest["link.txt"][:2] == ["l", "real.txt"]


def test_default_code_dir_is_git_root_else_script_dir(tmp_path: Path) -> None:
    tree(tmp_path, {"plain/train.py": "", "repo/src/train.py": ""})
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    assert default_code_dir(tmp_path / "plain" / "train.py") == (tmp_path / "plain").resolve()
    assert default_code_dir(tmp_path / "repo" / "src" / "train.py") == (tmp_path / "repo")


def test_rsync_uses_openssh_with_fleetctl_trust_settings() -> None:
    node = Node(
        name="n1",
        address="10.9.0.5",
        port=2222,
        user="ubuntu",
        key_file="/keys/my key",
        known_hosts="/etc/fleet kh",
    )
    settings = SSHSettings(connect_timeout=7, ssh_config="/dev/null")
    argv = rsync_argv(
        rsync_target(node, settings, "/home/u/.fleetctl/code/.tmp-x/"),
        Path("/src"),
        files_from="/tmp/list",
        link_dest="/home/u/.fleetctl/code/old",
        io_timeout=60,
    )
    ssh = shlex.split(argv[argv.index("-e") + 1])  # the quoting survives a shell split
    assert ssh == ssh_argv(node, settings)
    pairs = {ssh[i + 1] for i, a in enumerate(ssh) if a == "-o"}
    assert {
        "UserKnownHostsFile=/etc/fleet kh",
        "StrictHostKeyChecking=yes",
        "BatchMode=yes",
        "IdentitiesOnly=yes",
        "ConnectTimeout=7",
        "GlobalKnownHostsFile=/dev/null",
    } <= pairs
    assert ssh[ssh.index("-i") + 1] == "/keys/my key"
    assert ssh[ssh.index("-p") + 1] == "2222" and ssh[ssh.index("-l") + 1] == "ubuntu"
    assert ssh[ssh.index("-F") + 1] == "/dev/null"
    assert "--link-dest=/home/u/.fleetctl/code/old" in argv and "--protect-args" in argv
    assert argv[-2:] == ["/src/", "10.9.0.5:/home/u/.fleetctl/code/.tmp-x/"]
    assert not any("StrictHostKeyChecking=no" in a for a in argv)


@pytest.mark.parametrize(
    ("code", "version"),
    [
        (22703, "2.27.3"),
        (22105, "2.21.5"),
        (21903, "2.19.3"),
        (2708, "2.7.8"),
        (2406, "2.4.6"),
    ],
)
def test_nccl_version_codes(code: int, version: str) -> None:
    assert nccl_version(code) == version


def test_archive_sha256_is_cached_by_size_and_mtime(tmp_path: Path) -> None:
    import hashlib

    p = tmp_path / "env.tar.gz"
    p.write_bytes(b"A" * 100)
    first = archive_info(p)
    assert first.sha256 == hashlib.sha256(b"A" * 100).hexdigest() and first.size == 100
    st = p.stat()
    p.write_bytes(b"B" * 100)  # same size; restore mtime: the cache must answer
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert archive_info(p).sha256 == first.sha256
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert archive_info(p).sha256 == hashlib.sha256(b"B" * 100).hexdigest()
