"""Push never ships local state or secrets: built-in excludes, state directories, private keys."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fleetctl.phases.codesync import SecretError, list_files, snapshot
from fleetctl.remote.kit.keyscan import looks_like_private_key
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.files import tree

# Assembled at run time so this file itself never holds a key header at a line start.
PEM = "-----BEGIN " + "RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----\n"

LOCAL_STATE = {
    "train.py": "print('hi')\n",
    ".vagrant/machines/default/virtualbox/private_key": "k",
    ".vagrant/machines/default/virtualbox/id": "x",
    "fleet-runs/j1/plan.json": "{}",
    "out/runs/j2/connect.json": "{}",  # a run folder under any name
    "out/runs/j2/plan.json": "{}",
    "out/keep.txt": "kept",
    "myenv/pyvenv.cfg": "home = /usr\n",  # a virtualenv under any name
    "myenv/lib/site.py": "",
    "condaenv/conda-meta/history": "",
    "condaenv/bin/python": "",
    ".venv/bin/python": "",
    "pkg/__pycache__/m.cpython-311.pyc": "",
    "pkg/m.py": "",
    "pkg/stray.pyc": "",
    ".pytest_cache/v/cache": "",
    "web/node_modules/x/index.js": "",
}
SHIPPED = ["out/keep.txt", "pkg/m.py", "train.py"]


def test_local_state_is_never_shipped_from_a_plain_folder(tmp_path: Path) -> None:
    tree(tmp_path, LOCAL_STATE)
    assert list_files(tmp_path) == SHIPPED


def test_local_state_is_never_shipped_from_a_git_work_tree_even_untracked(
    tmp_path: Path,
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tree(tmp_path, LOCAL_STATE)
    subprocess.run(["git", "-C", str(tmp_path), "add", "train.py"], check=True)
    assert list_files(tmp_path) == SHIPPED


def test_a_root_fleetignore_negation_brings_a_builtin_exclude_back(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "", "venv/notes.txt": "", ".fleetignore": "!venv/\n"})
    assert list_files(tmp_path) == [".fleetignore", "train.py", "venv/notes.txt"]


def test_private_keys_stop_the_snapshot_naming_every_file(tmp_path: Path) -> None:
    tree(tmp_path, {"train.py": "", "certs/server.pem": PEM, "deploy/id_ed25519": "opaque"})
    with pytest.raises(SecretError) as e:
        snapshot(tmp_path)
    msg = e.value.one_line()
    assert "2 file(s) that look like private keys" in msg
    assert "certs/server.pem" in msg and "deploy/id_ed25519" in msg
    assert "--allow-secret" in msg and "\n" not in msg


def test_a_real_openssh_key_is_recognised(tmp_path: Path) -> None:
    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    assert looks_like_private_key(key.read_bytes())
    assert not looks_like_private_key((tmp_path / "k.pub").read_bytes())


def test_allowed_secrets_ship_and_mentions_of_the_header_are_not_keys(tmp_path: Path) -> None:
    tree(
        tmp_path,
        {
            "train.py": "HEADER = '" + PEM.splitlines()[0] + "'  # not a key\n",
            "certs/server.pem": PEM,
            "id_rsa.pub": "ssh-rsa AAAA",
        },
    )
    snap = snapshot(tmp_path, allow_secrets=["certs/server.pem"])
    assert set(snap.files) == {"certs/server.pem", "id_rsa.pub", "train.py"}


def test_the_verdict_survives_the_hash_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    code = tree(tmp_path / "code", {"train.py": "", "a.key": PEM})
    for _ in range(2):  # second time from the cache: the flag must come back with the hash
        with pytest.raises(SecretError):
            snapshot(code)


def test_push_refuses_a_key_with_a_one_line_usage_error_and_ships_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    code = tree(tmp_path / "code", {"train.py": "", "secrets/tls.key": PEM})
    work = tmp_path / "work"
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"local ansible_connection=local fleetctl_workdir={work}\n")
    r = run_cli("push", "-i", str(inv), "--code", str(code))
    assert r.exit_code == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "secrets/tls.key" in r.stderr
    assert not (work / "code").exists()
