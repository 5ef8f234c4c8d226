"""The push helper's checkpoint relay (``relay-pack`` / ``relay-apply``), run by Python 3.8 as
a node runs it: what rank 0's work folder holds beyond the code snapshot is packed, and another
node's work folder is seeded and gets it (uploaded, or fetched from the source's ``serve``)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

# tests/remote is on sys.path (pytest's rootdir-relative import)
from conftest import node_tree
from test_programs_py38 import traced_flushes

from fleetctl import remote
from fleetctl.phases.frames import last_data

Run = Callable[..., subprocess.CompletedProcess[bytes]]
KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n"
# keys the push refuses and the relay's old head-only rule let through (split: this file must
# pass the scan itself): one past the first MiB, one inside a notebook's JSON strings
HEADER = "-----BEGIN " + "RSA PRIVATE KEY-----"
BODY = "MIIEowIBAAKCAQEA" + "q" * 48
LATE_KEY = b"\0" * (2 << 20) + f"\n{HEADER}\n{BODY}\n".encode()
NOTEBOOK_KEY = json.dumps({"cells": [{"source": [f"{HEADER}\n", f"{BODY}\n"]}]}).encode()


def helper(run38: Run, mode: str, cfg: dict) -> tuple[int, dict]:
    res = run38("push_helper.py", [mode], stdin=json.dumps(cfg).encode() + b"\n")
    return res.returncode, last_data(res.stdout)


def node(tmp_path: Path, name: str) -> tuple[Path, Path, Path]:
    """A node's workdir with a code snapshot; returns (workdir, snapshot, work folder)."""
    w = tmp_path / name / ".fleetctl"
    snap = w / "code" / "abc123"
    (snap / "data").mkdir(parents=True)
    (snap / "train.py").write_text("print('train')\n")
    (snap / "data" / "input.txt").write_text("a b c\n")
    return w, snap, w / "work" / "job1"


def test_rank_0s_new_files_are_packed_and_land_in_a_fresh_nodes_seeded_work_folder(
    run38: Run, tmp_path: Path
) -> None:
    w, snap, work = node(tmp_path, "node1")
    shutil.copytree(snap, work)  # as the supervisor seeds it: mtimes kept
    (work / "snapshot.pt").write_bytes(b"epoch=12")
    (work / "data" / "input.txt").write_text("changed\n")
    (work / "__pycache__").mkdir()
    (work / "__pycache__" / "train.cpython-38.pyc").write_bytes(b"x")
    (work / "id_ed25519").write_bytes(b"x")
    (work / "deploy.pem").write_bytes(KEY)
    (work / "late.bin").write_bytes(LATE_KEY)
    (work / "notes.ipynb").write_bytes(NOTEBOOK_KEY)
    (work / "link.pt").symlink_to(work / "snapshot.pt")
    cfg = {"workdir": str(w), "work": str(work), "seed": str(snap), "tar": ".tmp-relay-t1.tar"}
    code, out = helper(run38, "relay-pack", {**cfg, "max_bytes": 1 << 20, "allow_secrets": []})
    assert code == 0, out
    assert out["files"] == ["snapshot.pt", "data/input.txt"] and out["count"] == 2
    assert out["bytes"] == len(b"epoch=12") + len("changed\n")
    assert sorted(out["secrets"]) == ["deploy.pem", "id_ed25519", "late.bin", "notes.ipynb"]
    tar = Path(out["tar"])
    assert tar == w / "envs" / ".tmp-relay-t1.tar" and out["size"] == tar.stat().st_size
    with tarfile.open(tar) as tf:
        assert sorted(tf.getnames()) == ["data/input.txt", "snapshot.pt"]

    # a spare: its work folder does not exist yet; it is seeded from its snapshot, then filled
    w2, snap2, work2 = node(tmp_path, "node3")
    (w2 / "envs").mkdir()
    shutil.copy(tar, w2 / "envs" / ".tmp-relay-up.tar")
    apply = {"workdir": str(w2), "work": str(work2), "seed": str(snap2), "tar": ".tmp-relay-up.tar"}
    apply.update(sha=out["sha"], size=out["size"], source_id=out["workdir_id"])
    code, got = helper(run38, "relay-apply", apply)
    assert code == 0, got
    assert got == {"files": 2, "bytes": out["bytes"]}
    assert (work2 / "snapshot.pt").read_bytes() == b"epoch=12"
    assert (work2 / "data" / "input.txt").read_text() == "changed\n"
    assert (work2 / "train.py").read_text() == "print('train')\n"  # the seed copy
    assert not (work2 / "deploy.pem").exists() and not (w2 / "envs" / ".tmp-relay-up.tar").exists()
    assert not (snap2 / "snapshot.pt").exists()  # the shared snapshot is never written to
    assert not [p for p in work2.rglob("*") if ".relay-" in p.name]

    # the source's own workdir (a shared home) reads the same id: nothing to do
    shutil.copy(tar, w / "envs" / ".tmp-relay-same.tar")
    same = {**apply, "workdir": str(w), "work": str(work), "tar": ".tmp-relay-same.tar"}
    code, got = helper(run38, "relay-apply", same)
    assert code == 0 and got == {"shared": True}


def test_over_the_cap_nothing_is_packed_and_fleetctls_own_folders_are_refused(
    run38: Run, tmp_path: Path
) -> None:
    w, snap, work = node(tmp_path, "node1")
    shutil.copytree(snap, work)
    (work / "ckpt").mkdir()
    (work / "ckpt" / "last.ckpt").write_bytes(b"x" * 100)
    (work / "other.bin").write_bytes(b"y" * 10)
    cfg = {"workdir": str(w), "work": str(work), "seed": str(snap), "tar": ".tmp-relay-t2.tar"}
    code, out = helper(run38, "relay-pack", {**cfg, "max_bytes": 99, "dir": "ckpt"})
    assert code == 0 and out["count"] == 1 and out["bytes"] == 100 and "tar" not in out
    assert out["files"] == ["last.ckpt"]  # only --checkpoint-dir, named relative to it
    assert not (w / "envs" / ".tmp-relay-t2.tar").exists()
    # relative to where the job ran: the script's folder inside the work folder
    (work / "sub" / "ckpt").mkdir(parents=True)
    (work / "sub" / "ckpt" / "epoch3.ckpt").write_bytes(b"z")
    code, out = helper(
        run38, "relay-pack", {**cfg, "max_bytes": 99, "dir": "ckpt", "cwd": str(work / "sub")}
    )
    assert (
        code == 0 and out["files"] == ["epoch3.ckpt"] and out["root"] == str(work / "sub" / "ckpt")
    )
    for bad in (str(w / "runs"), str(w.parent)):
        code, out = helper(run38, "relay-pack", {**cfg, "max_bytes": 99, "dir": bad})
        assert code == 3 and "holds fleetctl's own files" in out["error"], out


def test_a_member_that_leaves_the_folder_is_refused(run38: Run, tmp_path: Path) -> None:
    w, snap, work = node(tmp_path, "node2")
    (w / "envs").mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        info = tarfile.TarInfo("../evil.txt")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    (w / "envs" / ".tmp-relay-e.tar").write_bytes(buf.getvalue())
    import hashlib

    sha = hashlib.sha256(buf.getvalue()).hexdigest()
    cfg = {"workdir": str(w), "work": str(work), "seed": str(snap), "tar": ".tmp-relay-e.tar"}
    code, out = helper(run38, "relay-apply", {**cfg, "sha": sha, "size": len(buf.getvalue())})
    assert code == 3 and "escapes" in out["error"] and out["stage"] == "relay"
    assert not (work.parent / "evil.txt").exists()
    assert not (w / "envs" / ".tmp-relay-e.tar").exists()


def test_a_node_fetches_the_checkpoints_from_the_sources_server(
    py38: str, run38: Run, tmp_path: Path
) -> None:
    w, snap, work = node(tmp_path, "node1")
    shutil.copytree(snap, work)
    (work / "snapshot.pt").write_bytes(os.urandom(300_000))
    cfg = {"workdir": str(w), "work": str(work), "seed": str(snap), "tar": ".tmp-relay-p.tar"}
    code, out = helper(run38, "relay-pack", {**cfg, "max_bytes": 1 << 30})
    assert code == 0, out
    serve = subprocess.Popen(
        [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        token = "t" * 64
        assert serve.stdin is not None and serve.stdout is not None
        srv = {"path": out["tar"], "sha": out["sha"], "token": token, "bind": "127.0.0.1"}
        serve.stdin.write(json.dumps({**srv, "timeout": 60}).encode() + b"\n")
        serve.stdin.flush()
        port = last_data(serve.stdout.readline(), "A")["port"]
        w2, snap2, work2 = node(tmp_path, "node4")
        peer = {"name": "node1", "host": "127.0.0.1", "port": port, "token": token}
        apply = {"workdir": str(w2), "work": str(work2), "seed": str(snap2), "tar": ".tmp-r.tar"}
        apply.update(sha=out["sha"], size=out["size"], fetch={"peers": [peer]})
        code, got = helper(run38, "relay-apply", apply)
        assert code == 0 and got["peer"] == "node1" and got["files"] == 1, got
        assert (work2 / "snapshot.pt").read_bytes() == (work / "snapshot.pt").read_bytes()
    finally:
        serve.stdin.close()  # type: ignore[union-attr]
        serve.wait(30)


def test_relay_have_names_the_files_a_node_holds_byte_for_byte_and_pack_takes_only_the_rest(
    run38: Run, tmp_path: Path
) -> None:
    w, snap, work = node(tmp_path, "node1")
    shutil.copytree(snap, work)
    (work / "snapshot.pt").write_bytes(b"epoch=12")
    (work / "opt.pt").write_bytes(b"adam")
    cfg = {"workdir": str(w), "work": str(work), "seed": str(snap), "tar": ".tmp-relay-t3.tar"}
    cfg = {**cfg, "max_bytes": 1 << 20, "allow_secrets": []}
    code, listed = helper(run38, "relay-pack", {**cfg, "manifest": True, "pack": False})
    assert code == 0 and "tar" not in listed, listed
    assert sorted(listed["manifest"]) == ["opt.pt", "snapshot.pt"]
    assert listed["manifest"]["snapshot.pt"][0] == 8
    w2, snap2, work2 = node(tmp_path, "node2")
    shutil.copytree(snap2, work2)
    (work2 / "snapshot.pt").write_bytes(b"epoch=12")  # the last relay's copy
    (work2 / "opt.pt").write_bytes(b"adaX")  # same size, other bytes
    manifest = {**listed["manifest"], "../../outside": [1, "0" * 64]}
    ask = {"workdir": str(w2), "work": str(work2), "seed": str(snap2), "manifest": manifest}
    code, out = helper(run38, "relay-have", ask)
    assert code == 0 and out == {"have": ["snapshot.pt"]}, out
    code, out = helper(run38, "relay-have", {**ask, "source_id": listed["workdir_id"]})
    assert code == 0 and out == {"have": ["snapshot.pt"]}  # another workdir: not shared
    code, packed = helper(run38, "relay-pack", {**cfg, "only": ["opt.pt"]})
    assert code == 0 and packed["count"] == 1 and packed["bytes"] == 4, packed
    with tarfile.open(packed["tar"]) as tf:
        assert tf.getnames() == ["opt.pt"]


def test_an_earlier_job_whose_snapshot_was_pruned_relays_only_what_it_wrote(
    run38: Run, tmp_path: Path
) -> None:
    """``run --resume``: the earlier job's code snapshot may be gone (``push --keep``); its
    work folder's code copy keeps the code's times, so only files from the job's start on
    count, and the old code never overwrites the new job's."""
    w, snap, work = node(tmp_path, "node1")
    shutil.copytree(snap, work)
    old = 1_700_000_000
    for p in work.rglob("*"):
        os.utime(p, (old, old))
    (work / "snapshot.pt").write_bytes(b"epoch=12")
    shutil.rmtree(snap)  # pruned
    cfg = {"workdir": str(w), "work": str(work), "seed": str(snap), "tar": ".tmp-relay-t3.tar"}
    cfg.update(max_bytes=1 << 20, allow_secrets=[], since=old + 60, manifest=False, pack=False)
    code, out = helper(run38, "relay-pack", cfg)
    assert code == 0, out
    assert (out["files"], out["count"]) == (["snapshot.pt"], 1)
    # a retry's relay (no since) still reads every file there as new, as before
    code, out = helper(run38, "relay-pack", {**cfg, "since": None})
    assert code == 0 and out["count"] == 3, out


def flushed_before(calls: list[tuple[str, ...]], dest: Path) -> tuple[str, set[str], set[str]]:
    """(the temp name renamed to ``dest``, paths fsynced before that rename, after it)."""
    [i] = [i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == str(dest)]
    return (
        calls[i][1],
        {c[1] for c in calls[:i] if c[0] == "fsync"},
        {c[1] for c in calls[i + 1 :] if c[0] == "fsync"},
    )


def test_a_relayed_checkpoint_and_the_work_folder_it_lands_in_are_on_disk_before_they_count(
    py38: str, tmp_path: Path
) -> None:
    """A reset after the relay must not leave empty files the retry counts as there: the
    seeded copy of the code is flushed before its rename (the work folder is the mark that it
    was seeded), each relayed file before it replaces the old one, the folders after."""
    src = tmp_path / "src"
    (src / "ckpt").mkdir(parents=True)
    (src / "snapshot.pt").write_bytes(b"epoch=12")
    (src / "ckpt" / "opt.pt").write_bytes(b"adam")
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as tf:
        tf.add(src / "snapshot.pt", "snapshot.pt")
        tf.add(src / "ckpt" / "opt.pt", "ckpt/opt.pt")
    w, snap, work = node(tmp_path, "node2")
    (w / "envs").mkdir()
    (w / "envs" / ".tmp-relay-up.tar").write_bytes(tar.getvalue())
    cfg = {"workdir": str(w), "work": str(work), "seed": str(snap), "tar": ".tmp-relay-up.tar"}
    cfg["sha"] = hashlib.sha256(tar.getvalue()).hexdigest()
    argv = [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "relay-apply"]
    calls = traced_flushes(argv, json.dumps(cfg).encode() + b"\n")
    seeded, before, after = flushed_before(calls, work)
    assert {f"{seeded}/train.py", f"{seeded}/data/input.txt", f"{seeded}/data", seeded} <= before
    assert str(work.parent) in after, calls
    for rel in ("snapshot.pt", "ckpt/opt.pt"):
        tmp, before, after = flushed_before(calls, work / rel)
        assert tmp in before and str((work / rel).parent) in after, (rel, calls)
    assert str(work) in after, calls
    assert (work / "ckpt" / "opt.pt").read_bytes() == b"adam"


def test_the_supervisors_seeded_work_folder_is_on_disk_before_it_counts(
    py38: str, tmp_path: Path
) -> None:
    """The supervisor's own seeding (``kit.spec``), as the relay's above: a work folder that
    exists is never seeded again, so its files reach the disk before its rename."""
    _w, snap, work = node(tmp_path, "node1")
    call = (
        "import sys; sys.path.insert(0, sys.argv[1]); from remote.kit.spec import "
        "seed_work_folder; seed_work_folder(sys.argv[2], sys.argv[3])"
    )
    calls = traced_flushes([py38, "-S", "-c", call, node_tree(), str(work), str(snap)])
    seeded, before, after = flushed_before(calls, work)
    assert {f"{seeded}/train.py", f"{seeded}/data/input.txt", f"{seeded}/data", seeded} <= before
    assert str(work.parent) in after, calls
    assert (work / "train.py").read_text() == "print('train')\n"
