"""Keys as they really leak into a code folder: inside a notebook's JSON strings, as a JSON
value with ``\\n`` escapes, after a UTF-8 BOM, in a Python triple-quoted string. Each is found;
code and prose that only mention the header are not keys (issue 40)."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest

from fleetctl.phases.codesync import SecretError, snapshot
from fleetctl.remote.kit.keyscan import KeyScan, looks_like_private_key

# a PuTTY file's first lines (puttygen is not installed here); the body is made up. The header
# is split in two here: whole, this file would hold a key as the scan sees one, and a push of
# this repository (README's first command) would stop on it.
PUTTY = (
    "PuTTY-User-" + "Key-File-3: ssh-ed25519\nEncryption: none\nComment: eddsa-key-20240101\n"
    "Public-Lines: 2\nAAAAC3NzaC1lZDI1NTE5AAAAIDe2t0bm90YXJlYWxrZXlidXRzaGFwZWRsaWtlb25l\n"
)


def _keygen(tmp: Path, *args: str) -> str:
    key = tmp / "k"
    subprocess.run(["ssh-keygen", "-q", *args, "-f", str(key)], check=True)
    return key.read_text()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An OpenSSH key, a PEM RSA key, an encrypted PEM key (Proc-Type), PuTTY's shape."""
    out = {"putty": PUTTY}
    for name, args in {
        "openssh": ("-t", "ed25519", "-N", ""),
        "pem": ("-t", "rsa", "-b", "1024", "-m", "PEM", "-N", ""),
        "encrypted pem": ("-t", "rsa", "-b", "1024", "-m", "PEM", "-N", "secret-pass"),
    }.items():
        out[name] = _keygen(tmp_path_factory.mktemp(name.replace(" ", "-")), *args)
    return out


def notebook(source: str, output: str = "") -> str:
    """An .ipynb as Jupyter writes it: each line a JSON string of its own, ending in ``\\n``."""
    cell = {
        "cell_type": "code",
        "execution_count": 1,
        "metadata": {},
        "source": source.splitlines(keepends=True),
        "outputs": [{"name": "stdout", "output_type": "stream", "text": [output]}]
        if output
        else [],
    }
    doc = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    return json.dumps(doc, indent=1)


LEAKS = {
    "a notebook cell holding the key, line by line": lambda k: notebook(
        "key = '''\n" + k + "'''\nopen('id', 'w').write(key)\n"
    ),
    "a notebook output that printed the key": lambda k: notebook("print(key)\n", output=k),
    "a JSON value with \\n escapes": lambda k: json.dumps({"name": "deploy", "ssh_key": k}),
    "a JSON value in a notebook cell (escapes escaped)": lambda k: notebook(
        "cfg = " + json.dumps({"ssh_key": k}) + "\n"
    ),
    "a key file after a UTF-8 BOM": lambda k: "\ufeff" + k,
    "a triple-quoted string after key = ": lambda k: 'key = """' + k + '"""\n',
    "an indented triple-quoted string": lambda k: (
        "def deploy():\n    key = '''\n" + textwrap.indent(k, "    ") + "    '''\n"
    ),
    "a Python string with \\n escapes": lambda k: "KEY = " + repr(k) + "\n",
}


@pytest.mark.parametrize("shape", sorted(LEAKS))
@pytest.mark.parametrize("kind", ["openssh", "pem", "encrypted pem", "putty"])
def test_a_key_leaked_inside_code_or_data_is_found(
    shape: str, kind: str, keys: dict[str, str]
) -> None:
    data = LEAKS[shape](keys[kind]).encode("utf-8")
    assert looks_like_private_key(data), (shape, kind)


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_json_key_value_is_found_in_utf16_too(encoding: str, keys: dict[str, str]) -> None:
    assert looks_like_private_key(json.dumps({"k": keys["openssh"]}).encode(encoding))


MENTIONS = {
    "a parser's constant": "HEADER = '-----BEGIN OPENSSH PRIVATE KEY-----'  # a constant\n",
    "a PEM built from its parts": (
        'pem = b"-----BEGIN PRIVATE KEY-----\\n" + base64.encodebytes(der) + b"-----END '
        'PRIVATE KEY-----\\n"\n'
    ),
    "a regex for the header": (
        'PEM = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----\\s+([A-Za-z0-9+/=\\s]+)")\n'
    ),
    "prose in a docstring": (
        '    """A key file starts with "-----BEGIN OPENSSH PRIVATE KEY-----", then base64\n'
        '    lines, then the end marker."""\n'
    ),
    "an indented example with an elided body": (
        "    -----BEGIN RSA PRIVATE KEY-----\n    ...\n    -----END RSA PRIVATE KEY-----\n"
    ),
    "a JSON placeholder": json.dumps(
        {"ssh_key": "-----BEGIN OPENSSH PRIVATE KEY-----\n<paste yours>\n-----END OPENSSH"}
    ),
    "a JSON template with an empty body": json.dumps(
        {"ssh_key": "-----BEGIN OPENSSH PRIVATE KEY-----\n-----END OPENSSH PRIVATE KEY-----\n"}
    ),
    "a notebook's markdown about keys": notebook(
        "Paste your key (it starts with `-----BEGIN OPENSSH PRIVATE KEY-----`) into\n"
        "`~/.ssh/id_ed25519`; PuTTY-User-Key-File-3: files need converting first.\n"
    ),
    "a mention after a BOM, inside a line": "\ufeffsee '-----BEGIN RSA PRIVATE KEY-----' here\n",
}


@pytest.mark.parametrize("shape", sorted(MENTIONS))
def test_code_and_prose_that_mention_the_header_are_not_keys(shape: str) -> None:
    for encoding in ("utf-8", "utf-16-le"):
        assert not looks_like_private_key(MENTIONS[shape].encode(encoding)), (shape, encoding)


def test_a_key_in_a_json_string_cut_by_a_chunk_boundary_is_found_wherever_the_cut_falls(
    keys: dict[str, str],
) -> None:
    filler = ("x" * 70 + "\n") * 200
    for encoding in ("utf-8", "utf-16-le"):
        data = (filler + json.dumps({"k": keys["openssh"]})).encode(encoding)
        at = data.index("-----BEGIN".encode(encoding))
        for cut in range(at - 3, at + 260):
            scan = KeyScan()
            scan.feed(data[:cut])
            scan.feed(data[cut:])
            assert scan.found, (encoding, cut - at)


def test_a_notebook_with_a_key_stops_the_snapshot_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: dict[str, str]
) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    code = tmp_path / "code"
    (code / "notebooks").mkdir(parents=True)
    (code / "train.py").write_text(MENTIONS["a parser's constant"])
    (code / "notebooks" / "setup.ipynb").write_text(LEAKS[sorted(LEAKS)[0]](keys["openssh"]))
    with pytest.raises(
        SecretError, match=r"1 file\(s\) that look like .*: notebooks/setup\.ipynb;"
    ):
        snapshot(code)
    snap = snapshot(code, allow_secrets=["notebooks/setup.ipynb"])
    assert "notebooks/setup.ipynb" in snap.files


def test_a_notebook_the_previous_scan_called_clean_is_scanned_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: dict[str, str]
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(cache))
    code = tmp_path / "code"
    code.mkdir()
    nb = code / "a.ipynb"
    nb.write_text(notebook("k = '''" + keys["openssh"] + "'''\n"))
    st = os.stat(nb)
    cache.mkdir()
    old = {str(nb): [st.st_size, st.st_mtime_ns, st.st_ino, "0" * 64, False, 2]}
    (cache / "filehash.json").write_text(json.dumps(old))
    with pytest.raises(SecretError, match=r"a\.ipynb"):
        snapshot(code)
