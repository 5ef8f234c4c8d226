"""push() against local nodes (LocalConnection, no SSH, no network): real conda-pack archives
built offline, unpacked, prefix-rewritten and verified; failure and fallback paths."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from fleetctl.errors import NodePushError, PushError
from fleetctl.node import Node
from fleetctl.phases.push import NodePush, PushOptions, PushRequest, env_path_prefix, push
from fleetctl.ssh.fanout import FanOut
from fleetctl.testing.envbuild import EnvCache


def local(name: str, workdir: Path, **kw: object) -> Node:
    return Node.localhost(name=name, workdir=str(workdir), **kw)


def code_tree(root: Path) -> Path:
    for rel, text in {
        "train.py": "print('hi')\n",
        "lib/util.py": "X = 1\n",
        "run.log": "noise",
        ".gitignore": "*.log\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def leftovers(workdir: Path) -> list[str]:
    """Temp/partial files a push may leave (none allowed after it returns or raises)."""
    return sorted(
        str(p.relative_to(workdir))
        for p in workdir.rglob("*")
        if p.name.startswith(".tmp-") or p.name.endswith(".part")
    )


def test_push_ships_code_and_env_rewrites_prefix_and_reads_nccl(
    tmp_path: Path, envs: EnvCache
) -> None:
    env = envs.get("nccl")
    w = tmp_path / "w"
    with FanOut([local("n1", w)]) as fleet:
        report = push(fleet, PushRequest(code_tree(tmp_path / "src"), env.archive))
    res = report.nodes["n1"]
    sha = report.env_sha256["n1"]
    final = w / "envs" / sha
    assert report.env_dirs == {"n1": str(final)} and res.env_method == "sftp"
    assert (final / env.prefix_file).read_text() == f"prefix={final}\n"
    assert str(env.prefix) not in (final / env.prefix_file).read_text()
    assert res.nccl_version == "2.21.5" and res.nccl_path == str(final / "lib/libnccl.so.2")
    assert report.nccl_versions == {"n1": "2.21.5"}
    assert env_path_prefix(report, "n1") == f"{final}/bin"
    code = Path(report.code_dirs["n1"])
    assert code == w / report.code_dir
    assert sorted(p.name for p in code.rglob("*") if p.is_file()) == [
        ".gitignore",
        "train.py",
        "util.py",
    ]
    assert report.controller_bytes == res.bytes_sent >= env.archive.stat().st_size
    assert leftovers(w) == []


def test_second_push_transfers_nothing(tmp_path: Path, envs: EnvCache) -> None:
    src = code_tree(tmp_path / "src")
    with FanOut([local("n1", tmp_path / "w")]) as fleet:
        first = push(fleet, PushRequest(src, envs.get("nccl").archive))
        again = push(fleet, PushRequest(src, envs.get("nccl").archive))
    assert first.controller_bytes > 0
    assert again.controller_bytes == 0
    res = again.nodes["n1"]
    assert (res.code_method, res.env_method, res.nccl_version) == ("present", "present", "2.21.5")
    assert again.code_dirs == first.code_dirs and again.env_dirs == first.env_dirs


def test_a_snapshot_the_preflight_saw_is_not_probed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fleetctl run` passes the nodes whose fresh check found this snapshot: no remote
    command for them; the others are probed (and sent the code) as usual."""
    import fleetctl.phases.push.phase as push_mod

    src = code_tree(tmp_path / "src")
    n1, n2 = local("n1", tmp_path / "w1"), local("n2", tmp_path / "w2")
    with FanOut([n1]) as fleet:
        first = push(fleet, PushRequest(src))
    calls: list[tuple[str, str]] = []
    real = push_mod._Push._remote

    def counting(self, node, conn, mode, cfg, timeout):  # type: ignore[no-untyped-def]
        calls.append((node.name, mode))
        return real(self, node, conn, mode, cfg, timeout)

    monkeypatch.setattr(push_mod._Push, "_remote", counting)
    with FanOut([n1, n2]) as fleet:
        again = push(fleet, PushRequest(src), options=PushOptions(known_present=frozenset({"n1"})))
    assert ("n1", "probe") not in calls and ("n2", "probe") in calls
    assert again.nodes["n1"].code_method == "present"
    assert again.code_dirs["n1"] == first.code_dirs["n1"]
    assert Path(again.code_dirs["n2"], "train.py").read_text() == "print('hi')\n"


def test_unpack_needs_no_python_on_path(
    tmp_path: Path, envs: EnvCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """conda-unpack's shebang is `#!/usr/bin/env python`; push runs it with the node's python."""
    env = envs.get("nccl")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "tar", "rsync"):
        real = next(Path(d) / tool for d in ("/usr/bin", "/bin") if (Path(d) / tool).exists())
        (bindir / tool).symlink_to(real)
    monkeypatch.setenv("PATH", str(bindir))
    with FanOut([local("n1", tmp_path / "w", python=os.path.realpath(sys.executable))]) as fleet:
        report = push(fleet, PushRequest(env_archive=env.archive))
    final = Path(report.env_dirs["n1"])
    assert (final / "bin/conda-unpack").read_text().startswith("#!/usr/bin/env python\n")
    assert (final / env.prefix_file).read_text() == f"prefix={final}\n"


def test_corrupt_archive_leaves_no_half_env(tmp_path: Path, envs: EnvCache) -> None:
    data = envs.get("nccl").archive.read_bytes()
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(data[: len(data) // 2])
    w = tmp_path / "w"
    with FanOut([local("n1", w)]) as fleet, pytest.raises(PushError) as ei:
        push(fleet, PushRequest(env_archive=bad))
    err = ei.value.result["n1"]
    assert isinstance(err, NodePushError) and err.stage == "unpack"
    assert "n1" in str(ei.value) and "partial files removed" in str(err)
    assert os.listdir(w / "envs") == []


def test_env_without_nccl_is_an_error_only_when_the_job_uses_nccl(
    tmp_path: Path, envs: EnvCache
) -> None:
    archive = envs.get("no-nccl").archive
    with FanOut([local("n1", tmp_path / "w")]) as fleet:
        report = push(fleet, PushRequest(env_archive=archive))
        assert report.nodes["n1"].nccl_version is None
        with pytest.raises(PushError) as ei:
            push(fleet, PushRequest(env_archive=archive), options=PushOptions(require_nccl=True))
    err = ei.value.result["n1"]
    assert isinstance(err, NodePushError) and err.stage == "nccl"
    assert "no usable NCCL" in str(err) and "n1" in str(err)


def test_nccl_mismatch_names_the_odd_node_and_keeps_every_outcome(
    tmp_path: Path, envs: EnvCache
) -> None:
    good, other = envs.get("nccl").archive, envs.get("nccl-other").archive
    nodes = [
        local("a", tmp_path / "a", env_archive=str(good)),
        local("b", tmp_path / "b", env_archive=str(other)),
        local("c", tmp_path / "c", env_archive=str(good)),
    ]
    with FanOut(nodes) as fleet, pytest.raises(PushError) as ei:
        push(fleet, PushRequest())
    result = ei.value.result
    assert set(result.failed) == {"b"}
    assert "NCCL 2.19.3 differs from NCCL 2.21.5 on a, c" in str(result["b"])
    assert all(isinstance(result[k], NodePush) for k in ("a", "c"))
    assert "push failed on 1 of 3 nodes: b" in str(ei.value)


def test_sftp_fallback_sends_only_changed_files_and_links_the_rest(tmp_path: Path) -> None:
    src = code_tree(tmp_path / "src")
    (src / "big.bin").write_bytes(os.urandom(200_000))
    opts = PushOptions(use_rsync=False)
    with FanOut([local("n1", tmp_path / "w")]) as fleet:
        first = push(fleet, PushRequest(src), options=opts)
        (src / "train.py").write_text("print('changed')\n")
        second = push(fleet, PushRequest(src), options=opts)
    r1, r2 = first.nodes["n1"], second.nodes["n1"]
    assert r1.code_method == r2.code_method == "sftp"
    assert any("code sent over SFTP" in w for w in r2.warnings)
    assert r1.bytes_sent > 200_000 > 2_000 > r2.bytes_sent  # only train.py crossed the wire
    old, new = Path(r1.code_dir), Path(r2.code_dir)
    assert (new / "train.py").read_text() == "print('changed')\n"
    assert (new / "big.bin").stat().st_ino == (old / "big.bin").stat().st_ino  # hard link
    assert not (new / "run.log").exists()
    assert leftovers(tmp_path / "w") == []


def test_old_snapshots_are_pruned(tmp_path: Path) -> None:
    src = code_tree(tmp_path / "src")
    with FanOut([local("n1", tmp_path / "w")]) as fleet:
        dirs = []
        for i in range(4):
            (src / "train.py").write_text(f"print({i})\n")
            dirs.append(
                push(fleet, PushRequest(src), options=PushOptions(keep_snapshots=2))
                .nodes["n1"]
                .code_dir
            )
    left = sorted(p for p in (tmp_path / "w" / "code").iterdir() if not p.name.startswith("."))
    assert left == sorted(Path(d) for d in dirs[-2:])


def test_peer_distribution_on_loopback_sends_the_archive_about_once(
    tmp_path: Path, envs: EnvCache
) -> None:
    env = envs.get("noise")
    size = env.archive.stat().st_size
    nodes = [local(f"n{i}", tmp_path / f"w{i}") for i in range(5)]
    events = []
    with FanOut(nodes) as fleet:
        report = push(
            fleet,
            PushRequest(env_archive=env.archive),
            options=PushOptions(peer_min_nodes=4),
            progress=events.append,
        )
    assert report.peer_fetches == 4
    assert size <= report.controller_bytes < 1.5 * size
    methods = {k: (v.env_method, v.nccl_version) for k, v in report.nodes.items()}
    assert methods == {
        "n0": ("sftp", "2.21.5"),
        **{f"n{i}": ("peer", "2.21.5") for i in range(1, 5)},
    }
    assert {v.env_source for k, v in report.nodes.items() if k != "n0"} <= {"n0", "n1", "n2"}
    assert len(set(report.env_dirs.values())) == 5
    for i in range(5):  # served archives removed when their servers stopped
        assert leftovers(tmp_path / f"w{i}") == []
    assert {e.stage for e in events} >= {"probe", "upload", "fetch", "finalize", "done"}


def test_bad_archive_name_is_a_usage_error(tmp_path: Path) -> None:
    from fleetctl.errors import UsageError

    z = tmp_path / "env.zip"
    z.write_bytes(b"PK")
    with FanOut([local("n1", tmp_path / "w")]) as fleet, pytest.raises(UsageError, match="tar"):
        push(fleet, PushRequest(env_archive=z))
