"""The push's secret scan reads whole files (a key appended to a big CSV), in UTF-8 and in
UTF-16 either way round, and a cached verdict is reused only for the same file and scan."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from fleetctl.phases.codesync import SecretError, snapshot
from fleetctl.remote.kit.keyscan import KeyScan, looks_like_private_key


@pytest.fixture(scope="module")
def openssh_key(tmp_path_factory: pytest.TempPathFactory) -> str:
    key = tmp_path_factory.mktemp("key") / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.read_text()


def _csv(size: int) -> bytes:
    row = b"1234,0.5,2024-01-01,some text without keys\n"
    return row * (size // len(row))


def test_a_key_appended_to_a_12_mb_csv_stops_the_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openssh_key: str
) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("")
    (code / "data.csv").write_bytes(_csv(12 << 20) + openssh_key.encode())
    with pytest.raises(SecretError, match=r"1 file\(s\) that look like private keys: data\.csv"):
        snapshot(code)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_utf16_key_is_found_with_or_without_a_bom(encoding: str, openssh_key: str) -> None:
    data = ("notes\r\n" + openssh_key).encode(encoding)
    assert looks_like_private_key(data)
    assert looks_like_private_key(openssh_key.encode(encoding))


def test_a_header_split_across_chunks_is_found_wherever_the_cut_falls(openssh_key: str) -> None:
    for encoding in ("utf-8", "utf-16-le", "utf-16-be"):
        data = _csv(4096).decode().encode(encoding) + openssh_key.encode(encoding)
        at = data.index(openssh_key[:5].encode(encoding))
        for cut in range(at - 3, at + 80):
            scan = KeyScan()
            scan.feed(data[:cut])
            scan.feed(data[cut:])
            assert scan.found, (encoding, cut - at)


def test_mentions_of_the_header_inside_a_line_are_not_keys_in_any_encoding() -> None:
    text = "HEADER = '-----BEGIN OPENSSH PRIVATE KEY-----'  # a parser's constant\n"
    for encoding in ("utf-8", "utf-16-le", "utf-16-be"):
        data = (text * 1000).encode(encoding)
        for cut in (0, 17, 70, len(data) // 2):
            scan = KeyScan()
            scan.feed(data[:cut])
            scan.feed(data[cut:])
            assert not scan.found, (encoding, cut)


def test_a_verdict_cached_by_the_old_head_only_scan_is_scanned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, openssh_key: str
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(cache))
    code = tmp_path / "code"
    code.mkdir()
    data = code / "data.csv"
    data.write_bytes(_csv(2 << 20) + openssh_key.encode())
    st = os.stat(data)
    cache.mkdir()
    old = {str(data): [st.st_size, st.st_mtime_ns, st.st_ino, "0" * 64, False]}
    (cache / "filehash.json").write_text(json.dumps(old))
    with pytest.raises(SecretError, match=r"data\.csv"):
        snapshot(code)
    with pytest.raises(SecretError, match=r"data\.csv"):  # and now from the new cache entry
        snapshot(code)
