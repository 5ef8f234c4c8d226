"""A code folder holding checkpoints or data (pytorch/examples' ``snapshot.pt``) is pushed as
code to every node: push and run warn, naming the files, and say how to leave them out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetctl.phases import codesync
from fleetctl.phases.codesync import bulky_warning, is_bulky, snapshot
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.files import tree


@pytest.mark.parametrize(
    "rel",
    [
        "snapshot.pt",
        "checkpoints/epoch_3.pth",
        "lightning_logs/version_0/checkpoints/last.ckpt",
        "model.safetensors",
        "pytorch_model.bin",
        "data/features.npy",
        "data/FEATURES.NPZ",
        "weights.h5",
    ],
)
def test_checkpoint_and_data_files_are_bulky_whatever_their_size(rel: str) -> None:
    assert is_bulky(rel, 0)


@pytest.mark.parametrize(
    "rel", ["train.py", "bin/launch.sh", "requirements.txt", "notes.pt.md", "data/README"]
)
def test_code_is_not_bulky_unless_it_is_over_100_mb(rel: str) -> None:
    assert not is_bulky(rel, 100 * 1000 * 1000)
    assert is_bulky(rel, 100 * 1000 * 1000 + 1)


def test_the_warning_names_the_biggest_files_first_then_a_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(codesync, "BULKY_BYTES", 4000)  # a "huge" file without writing 100 MB
    code = tree(
        tmp_path / "code",
        {
            "train.py": "print('x')\n" * 1000,  # 11 kB of code: not bulky by name, only by size
            "model/net.py": "N = 1\n",
            "snapshot.pt": "w" * 2048,
            "data/a.npy": "d" * 3000,
            "data/b.npy": "d" * 10,
            "weights.safetensors": "s" * 100,
            "old/ignored.ckpt": "c",
            ".fleetignore": "old/\n",
        },
    )
    snap = snapshot(code)
    assert sorted(rel for rel, _ in snap.bulky) == [
        "data/a.npy",
        "data/b.npy",
        "snapshot.pt",
        "train.py",
        "weights.safetensors",
    ]
    assert bulky_warning(snap) == (
        f"code directory {code} holds 5 file(s) that look like checkpoints or data, pushed as "
        "code to every node: train.py (10.7 KiB), data/a.npy (2.9 KiB), snapshot.pt (2.0 KiB) "
        "(+2 more); exclude them in .fleetignore unless the job reads them (a job's own "
        "checkpoints stay in its work folder on the nodes)"
    )


def test_a_folder_of_code_alone_gets_no_warning(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    snap = snapshot(tree(tmp_path / "code", {"train.py": "", "bin/run.sh": "", "data/x.csv": ""}))
    assert snap.bulky == () and bulky_warning(snap) is None


def _local_push(tmp_path: Path, code: Path, *args: str):
    inv = tmp_path / "hosts.ini"
    inv.write_text(f"local ansible_connection=local fleetctl_workdir={tmp_path / 'work'}\n")
    cache = {"FLEETCTL_CACHE_DIR": str(tmp_path / "cache")}
    return run_cli("push", "-i", str(inv), "--code", str(code), *args, env=cache)


def test_push_warns_on_stderr_naming_a_snapshot_pt_and_ships_it(tmp_path: Path) -> None:
    code = tree(tmp_path / "code", {"main.py": "", "snapshot.pt": "weights"})
    r = _local_push(tmp_path, code)
    assert r.exit_code == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("fleetctl: warning:")]
    assert len(warnings) == 1, r.stderr
    assert "look like checkpoints or data" in warnings[0]
    assert "snapshot.pt (7 B)" in warnings[0] and ".fleetignore" in warnings[0]
    assert "snapshot.pt" not in r.stdout  # once, on stderr, not in the table
    assert list((tmp_path / "work" / "code").glob("*/snapshot.pt"))

    r = _local_push(tmp_path, code, "--json")  # stdout stays one JSON document
    assert r.exit_code == 0, r.stderr
    assert "snapshot.pt" in r.stderr
    assert "snapshot.pt (7 B)" in json.loads(r.stdout)["code_warnings"][0]


def test_push_of_a_folder_without_checkpoints_warns_of_nothing(tmp_path: Path) -> None:
    r = _local_push(tmp_path, tree(tmp_path / "code", {"main.py": ""}))
    assert r.exit_code == 0, r.stderr
    assert "warning" not in r.stderr
