"""fleetctl push on the namespace lab: real sshd hosts, real OpenSSH rsync, real conda-pack
archives (built offline by fleetctl.testing.envbuild), peer distribution over the data network."""

from __future__ import annotations

import dataclasses
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetctl.errors import NodePushError, PushError
from fleetctl.lab import Lab
from fleetctl.node import Node
from fleetctl.phases.push import NodePush, PushEvent, PushOptions, PushRequest, push
from fleetctl.plan.inventory import load_inventory
from fleetctl.ssh.fanout import FanOut
from fleetctl.testing.envbuild import EnvCache, build_env, nccl_from_wheel
from fleetctl.testing.pytest_plugin import lab_login

pytestmark = [pytest.mark.lab, pytest.mark.login, pytest.mark.shared_home]

NCCL_WHEEL = "nvidia-nccl-cu12==2.21.5"
# FLEETCTL_LAB_SHARED_HOME=1: every host reads one home, so one node (the first) pushes for
# all of them and the others say "shared with node1"
SHARED_HOME = bool(lab_login().get("shared_home"))
ONE_PUSH = "on one shared home the first node pushes for every host: no per-host transfer"
# the node whose disk fills or that lacks rsync: on a shared home the one that pushes for all
VICTIM = "node1" if SHARED_HOME else "node2"
OTHER = "node2" if SHARED_HOME else "node1"  # one that pushes and succeeds


@pytest.fixture
def wd(lab3: Lab) -> Iterator[str]:
    """A fresh workdir on every host, inside the lab's workdir: private per host for root (the
    lab mounts one per host; /root itself is this machine's) and for a plain user, one for
    all hosts on a shared home (``FLEETCTL_LAB_USER`` / ``FLEETCTL_LAB_SHARED_HOME``)."""
    w = f"{lab3.workdir}/push-{secrets.token_hex(4)}"
    yield w
    for h in lab3.hosts:
        lab3.exec(h.name, ["rm", "-rf", w])


def lab_nodes(lab: Lab, workdir: str) -> list[Node]:
    return [
        dataclasses.replace(n, workdir=workdir) for n in load_inventory(lab.inventory_path).nodes
    ]


def sh(lab: Lab, host: str, script: str) -> str:
    return lab.exec(host, ["sh", "-c", script], check=True).stdout


def leftovers(lab: Lab, host: str, workdir: str) -> str:
    return sh(lab, host, f"find {workdir} -name '.tmp-*' -o -name '*.part' 2>/dev/null; true")


def project(root: Path) -> Path:
    """A git project with ignored, untracked and .fleetignore'd files."""
    files = {
        "train.py": "print('train')\n",
        "model/net.py": "N = 1\n",
        ".gitignore": "*.ckpt\nout/\n",
        ".fleetignore": "datasets/\n",
        "model.ckpt": "weights",
        "out/log.txt": "x",
        "datasets/big.bin": "data",
        "notes.txt": "untracked, not ignored",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "add", "train.py", "model/net.py"], check=True)
    return root


SHIPPED = [".fleetignore", ".gitignore", "model/net.py", "notes.txt", "train.py"]


def remote_files(lab: Lab, host: str, code_dir: str) -> list[str]:
    out = sh(lab, host, f"cd {code_dir} && find . -type f | sort")
    return [line[2:] for line in out.split()]


def test_push_to_three_hosts_then_second_push_transfers_nothing(
    lab3: Lab, wd: str, envs: EnvCache, tmp_path: Path
) -> None:
    env = envs.get("nccl")
    src = project(tmp_path / "proj")
    nodes = lab_nodes(lab3, wd)
    with FanOut(nodes) as fleet:
        report = push(fleet, PushRequest(src, env.archive), options=PushOptions(peer=False))
        sha = report.env_sha256["node1"]
        assert set(report.env_sha256.values()) == {sha}
        assert report.env_dirs == {h.name: f"{wd}/envs/{sha}" for h in lab3.hosts}
        assert report.nccl_versions == {h.name: "2.21.5" for h in lab3.hosts}
        for h in lab3.hosts:
            res = report.nodes[h.name]
            want = ("rsync", "sftp")
            if SHARED_HOME and h.name != "node1":
                want = ("shared with node1", "shared with node1")
            assert (res.code_method, res.env_method) == want
            assert sh(lab3, h.name, f"cat {wd}/envs/{sha}/{env.prefix_file}") == (
                f"prefix={wd}/envs/{sha}\n"
            )
            assert remote_files(lab3, h.name, report.code_dirs[h.name]) == SHIPPED
            assert leftovers(lab3, h.name, wd) == ""
            # code and envs are as private as the run folders
            assert sh(lab3, h.name, f"stat -c %a {wd} {wd}/code {wd}/envs").split() == ["700"] * 3
        pushed = 1 if SHARED_HOME else 3
        assert report.controller_bytes >= pushed * env.archive.stat().st_size

        again = push(fleet, PushRequest(src, env.archive), options=PushOptions(check_torch=True))
    import torch

    assert again.controller_bytes == 0
    assert again.code_dirs == report.code_dirs and again.env_dirs == report.env_dirs
    for res in again.nodes.values():
        assert (res.code_method, res.env_method, res.bytes_sent) == ("present", "present", 0)
        assert res.torch_version == torch.__version__ and res.nccl_version == "2.21.5"


def test_peer_distribution_sends_the_archive_about_once(lab3: Lab, wd: str, envs: EnvCache) -> None:
    if SHARED_HOME:  # not a missing tool: the premise cannot hold on one shared home
        pytest.skip(ONE_PUSH)
    env = envs.get("noise")
    size = env.archive.stat().st_size
    train = {h.name: h.data_addr for h in lab3.hosts}
    assert all(train.values())
    with FanOut(lab_nodes(lab3, wd)) as fleet:
        report = push(
            fleet,
            PushRequest(env_archive=env.archive),
            options=PushOptions(peer_min_nodes=3, train_addrs=train),
        )
    assert report.peer_fetches == 2
    assert size <= report.controller_bytes < 1.5 * size
    assert report.nodes["node1"].env_method == "sftp"
    for name in ("node2", "node3"):
        assert report.nodes[name].env_method == "peer"
        assert report.nodes[name].env_source == "node1"
        assert report.nodes[name].bytes_sent == 0
    assert set(report.nccl_versions.values()) == {"2.21.5"}
    for h in lab3.hosts:  # servers gone, served archives removed
        assert leftovers(lab3, h.name, wd) == ""
        listening = sh(lab3, h.name, "ss -Hltn | awk '{print $4}'").split()
        assert all(a.endswith(":22") for a in listening), listening


def test_host_with_a_different_archive_is_a_nccl_mismatch_naming_it(
    lab3: Lab, wd: str, envs: EnvCache
) -> None:
    good, other = envs.get("nccl").archive, envs.get("nccl-other").archive
    nodes = [
        dataclasses.replace(n, env_archive=str(other if n.name == "node3" else good))
        for n in lab_nodes(lab3, wd)
    ]
    with FanOut(nodes) as fleet, pytest.raises(PushError) as ei:
        push(fleet, PushRequest())
    result = ei.value.result
    assert set(result.failed) == {"node3"}
    err = result["node3"]
    assert isinstance(err, NodePushError) and err.stage == "nccl"
    assert str(err).startswith("node3") and "NCCL 2.19.3 differs from NCCL 2.21.5" in str(err)
    assert isinstance(result["node1"], NodePush) and isinstance(result["node2"], NodePush)
    assert ei.value.exit_code == 3


def test_disk_too_small_for_the_archive_fails_before_upload(
    lab3: Lab, wd: str, envs: EnvCache
) -> None:
    env = envs.get("noise")  # ~3 MiB, needs ~6 MiB free
    lab3.disk_full(VICTIM, f"{wd}/envs", "4m")
    try:
        with FanOut(lab_nodes(lab3, wd)) as fleet, pytest.raises(PushError) as ei:
            push(fleet, PushRequest(env_archive=env.archive), options=PushOptions(peer=False))
        err = ei.value.result[VICTIM]
        assert isinstance(err, NodePushError) and err.stage == "disk" and err.enospc
        assert "not enough disk space" in str(err) and str(err).startswith(VICTIM)
        assert set(ei.value.result.failed) == {VICTIM}
        assert sh(lab3, VICTIM, f"ls -A {wd}/envs") == ""
        assert ei.value.report.nodes[OTHER].bytes_sent > 0  # type: ignore[attr-defined]
    finally:
        lab3.disk_ok(VICTIM, f"{wd}/envs")


def test_disk_full_while_unpacking_leaves_no_half_env(lab3: Lab, wd: str, envs: EnvCache) -> None:
    env = envs.get("ballast")  # small archive, 16 MiB unpacked
    lab3.disk_full(VICTIM, f"{wd}/envs", "2m")
    try:
        with FanOut(lab_nodes(lab3, wd)) as fleet, pytest.raises(PushError) as ei:
            push(fleet, PushRequest(env_archive=env.archive), options=PushOptions(peer=False))
        err = ei.value.result[VICTIM]
        assert isinstance(err, NodePushError) and err.enospc and err.stage == "unpack"
        assert "disk full" in str(err) and "partial files removed" in str(err)
        assert sh(lab3, VICTIM, f"ls -A {wd}/envs") == ""  # no tmp dir, no final dir
        assert set(ei.value.result.failed) == {VICTIM}
    finally:
        lab3.disk_ok(VICTIM, f"{wd}/envs")


def test_disk_filling_up_during_upload_is_a_clear_error_and_cleans_up(
    lab3: Lab, wd: str, envs: EnvCache
) -> None:
    env = envs.get("noise")  # ~3 MiB: 8 MiB passes the 2x check ...
    lab3.disk_full(VICTIM, f"{wd}/envs", "8m")
    filled = []

    def fill_when_upload_starts(event: PushEvent) -> None:  # ... then something else fills it
        if event.node == VICTIM and event.stage == "upload" and not filled:
            filled.append(sh(lab3, VICTIM, f"head -c 7M /dev/zero > {wd}/envs/filler; df"))

    try:
        with FanOut(lab_nodes(lab3, wd)) as fleet, pytest.raises(PushError) as ei:
            push(
                fleet,
                PushRequest(env_archive=env.archive),
                options=PushOptions(peer=False),
                progress=fill_when_upload_starts,
            )
        assert filled
        err = ei.value.result[VICTIM]
        assert isinstance(err, NodePushError) and err.stage == "upload" and err.enospc
        assert "disk full while uploading the env archive" in str(err)
        assert "partial files removed" in str(err)
        assert sh(lab3, VICTIM, f"ls -A {wd}/envs").split() == ["filler"]
        assert set(ei.value.result.failed) == {VICTIM}
    finally:
        lab3.disk_ok(VICTIM, f"{wd}/envs")


def test_host_without_rsync_gets_the_sftp_fallback_with_a_warning(
    lab3: Lab, wd: str, tmp_path: Path
) -> None:
    src = project(tmp_path / "proj")
    rsync = sh(lab3, VICTIM, "command -v rsync").strip()
    lab3.exec(VICTIM, ["mount", "--bind", "/dev/null", rsync], check=True)
    try:
        assert sh(lab3, VICTIM, "command -v rsync || echo none").strip() == "none"
        with FanOut(lab_nodes(lab3, wd)) as fleet:
            report = push(fleet, PushRequest(src))
            (src / "train.py").write_text("print('v2')\n")
            second = push(fleet, PushRequest(src))
    finally:
        lab3.exec(VICTIM, ["umount", rsync], check=True)
    methods = {k: v.code_method for k, v in report.nodes.items()}
    if SHARED_HOME:  # node1 pushed by sftp for all three
        assert methods == {
            "node1": "sftp",
            "node2": "shared with node1",
            "node3": "shared with node1",
        }
    else:
        assert methods == {"node1": "rsync", "node2": "sftp", "node3": "rsync"}
    assert any("rsync not found on the node" in w for w in report.warnings)
    assert all(w.startswith(f"{VICTIM}:") for w in report.warnings)
    for h in lab3.hosts:
        assert remote_files(lab3, h.name, report.code_dirs[h.name]) == SHIPPED
        assert sh(lab3, h.name, f"cat {second.code_dirs[h.name]}/train.py") == "print('v2')\n"
    assert second.nodes[VICTIM].bytes_sent < 1000  # only the changed file, as a tiny tar


@pytest.fixture(scope="session")
def nccl_wheel() -> Path:
    cache = Path(os.environ.get("FLEETCTL_TEST_CACHE", "~/.cache/fleetctl-test")).expanduser()
    dest = cache / "wheels"
    found = sorted(dest.glob("nvidia_nccl_cu12-2.21.5-*.whl"))
    if not found:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(dest),
                NCCL_WHEEL,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        found = sorted(dest.glob("nvidia_nccl_cu12-2.21.5-*.whl"))
        if not found:
            pytest.fail(f"pip download {NCCL_WHEEL} failed: {r.stderr.strip()[-300:]}")
    return found[0]


@pytest.mark.slow
def test_real_nccl_from_the_wheel_reports_its_version(
    lab3: Lab, wd: str, nccl_wheel: Path, tmp_path: Path
) -> None:
    lib = nccl_from_wheel(nccl_wheel, tmp_path / "nccl" / "libnccl.so.2")
    env = build_env(tmp_path / "env", nccl_lib=lib, tag="real", fmt="tar")  # no compression
    node = lab_nodes(lab3, wd)[0]
    with FanOut([node]) as fleet:
        report = push(
            fleet, PushRequest(env_archive=env.archive), options=PushOptions(require_nccl=True)
        )
    res = report.nodes[node.name]
    assert res.nccl_version == "2.21.5"
    assert res.nccl_path == f"{report.env_dirs[node.name]}/lib/libnccl.so.2"


def test_cli_push_json_reports_every_host(
    lab3: Lab, wd: str, envs: EnvCache, tmp_path: Path
) -> None:
    import json

    import yaml

    inv = yaml.safe_load(lab3.inventory_path.read_text())
    for host in inv["all"]["children"]["nodes"]["hosts"].values():
        host["fleetctl_workdir"] = wd
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    src = project(tmp_path / "proj")
    env = envs.get("nccl")
    argv = [
        sys.executable,
        "-m",
        "fleetctl",
        "push",
        "-i",
        str(path),
        "--code",
        str(src),
        "--env",
        str(env.archive),
        "--backend",
        "nccl",
        "--json",
    ]
    p = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "FLEETCTL_SSH_CONFIG": "/dev/null"},
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["ok"] is True and doc["failures"] == {}
    assert set(doc["nodes"]) == {"node1", "node2", "node3"}
    assert set(doc["nccl_versions"].values()) == {"2.21.5"}
    assert all(d.startswith(f"{wd}/envs/") for d in doc["env_dirs"].values())

    # no --env: each host's fleetctl_env_archive; node2's differs -> exit 3 naming node2
    hosts = inv["all"]["children"]["nodes"]["hosts"]
    for name, host in hosts.items():
        host["fleetctl_env_archive"] = str(
            envs.get("nccl-other" if name == "node2" else "nccl").archive
        )
    path.write_text(yaml.safe_dump(inv))
    p = subprocess.run(
        [*argv[:6], "--no-code", "--backend", "nccl"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "FLEETCTL_SSH_CONFIG": "/dev/null"},
    )
    assert p.returncode == 3, p.stderr
    assert p.stderr.startswith("fleetctl: error: push failed on 1 of 3 nodes: node2")
    assert "NCCL 2.19.3 differs" in p.stderr
    assert "node2" in p.stdout and "✗" in p.stdout  # the table still shows every host


def lab_inventory(lab: Lab, wd: str, path: Path) -> Path:
    """The lab's inventory with every host's workdir set to ``wd``."""
    import yaml

    inv = yaml.safe_load(lab.inventory_path.read_text())
    for host in inv["all"]["children"]["nodes"]["hosts"].values():
        host["fleetctl_workdir"] = wd
    path.write_text(yaml.safe_dump(inv))
    return path


def cli_push(inventory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "fleetctl", "push", "-i", str(inventory), *args]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "FLEETCTL_SSH_CONFIG": "/dev/null"},
    )


def test_cli_push_refuses_a_notebook_holding_a_key_until_allowed(
    lab3: Lab, wd: str, tmp_path: Path
) -> None:
    import json

    key = tmp_path / "deploy_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    src = project(tmp_path / "proj")
    cell = {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None}
    cell["source"] = ["KEY = '''\n", *key.read_text().splitlines(keepends=True), "'''\n"]
    nb = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (src / "setup.ipynb").write_text(json.dumps(nb, indent=1))
    inv = lab_inventory(lab3, wd, tmp_path / "hosts.yml")

    p = cli_push(inv, "--code", str(src))
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "look like private keys: setup.ipynb;" in p.stderr and "--allow-secret" in p.stderr
    for h in lab3.hosts:  # refused before any host was touched
        assert sh(lab3, h.name, f"ls -A {wd} 2>/dev/null; true") == ""

    p = cli_push(inv, "--code", str(src), "--allow-secret", "setup.ipynb", "--json")
    assert p.returncode == 0, p.stderr
    code_dirs = json.loads(p.stdout)["code_dirs"]
    for h in lab3.hosts:
        assert "setup.ipynb" in remote_files(lab3, h.name, code_dirs[h.name])
