"""Bad inventories: exit code 2, one line ``fleetctl: error: FILE:LINE: …`` naming host/field.

Each case file under inventories/errors/ holds one mistake; the table says on which line it is
and which words (host, field, value) the message must name. Run through the real CLI entry
(``fleetctl.cli.main``) so the exit code and the absence of a traceback are what users get.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import run_cli

HERE = Path(__file__).resolve().parent
ERRORS = HERE / "inventories" / "errors"
GOOD = HERE / "inventories" / "nested.yml"

# (case file, --limit, line or None, words the message must contain)
CASES: list[tuple[str, str | None, int | None, tuple[str, ...]]] = [
    ("dup_address.yml", None, 6, ("gpu02", "gpu01", "10.0.0.1", "dup_address.yml:3")),
    ("dup_address.ini", None, 4, ("gpu03", "gpu01", "10.0.0.1 port 22")),
    ("gpus_word.yml", None, 7, ("gpu02", "fleetctl_gpus", "'eight'")),
    ("gpus_negative.ini", None, 7, ("gpu01", "fleetctl_gpus", "-1")),
    ("gpus_float.yml", None, 3, ("gpu01", "fleetctl_gpus", "7.5")),
    ("empty_address.yml", None, 6, ("gpu02", "ansible_host is empty")),
    ("bad_address.yml", None, 3, ("gpu box 3", "no ansible_host", "not a valid host name")),
    ("malformed.yml", None, 5, ("malformed YAML",)),
    ("malformed.ini", None, 3, ("gpu02", "key=value", "fleetctl_nic")),
    ("bad_section.ini", None, 3, ("[gpu nodes]",)),
    ("bad_range.ini", None, 3, ("gpu[05:8]", "equal length")),
    ("bad_range_reversed.yml", None, 3, ("gpu[09:02]", "begins after it ends")),
    ("bad_range_letters.yml", None, 3, ("node-[a:3]",)),
    ("undefined_child.ini", None, 3, ("train:children", "'cpu'")),
    ("unknown_key.yml", None, 4, ("group gpu", "'host'")),
    ("duplicate_key.yml", None, 6, ("duplicate key 'gpu01'", "line 3")),
    ("templated.yml", None, 4, ("gpu01", "ansible_host", "template")),
    ("bad_port.ini", None, 1, ("gpu01", "ansible_port", "70000")),
    ("bad_env.yml", None, 3, ("gpu01", "fleetctl_env", "mapping")),
    ("loop.yml", None, 5, ("loop", "'a'", "'b'")),
    ("connection.yml", None, 4, ("gpu01", "ansible_connection", "docker")),
    ("shell_type.yml", None, 6, ("gpu01", "ansible_shell_type", "powershell")),
    ("not_mapping.yml", None, 1, ("mapping of groups",)),
    ("not_utf8.ini", None, 4, ("not valid UTF-8",)),  # line 2 is a comment: tolerated
    ("not_utf8.yml", None, 4, ("not valid UTF-8",)),
    ("empty.yml", None, None, ("empty",)),
    ("vault.yml", None, None, ("vault",)),
]


def _cli(*args: str) -> tuple[int, str, str]:
    r = run_cli("inventory", *args)
    return r.exit_code, r.stdout, r.stderr


def _assert_one_line_error(
    code: int, out: str, err: str, where: str, words: tuple[str, ...]
) -> None:
    assert code == 2, err
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"fleetctl: error: {where}"), err
    for word in words:
        assert word in lines[0], (word, err)


@pytest.mark.parametrize(("name", "limit", "line", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_inventory_exits_2_with_file_line(
    name: str,
    limit: str | None,
    line: int | None,
    words: tuple[str, ...],
) -> None:
    path = ERRORS / name
    code, out, err = _cli("-i", str(path), *(["--limit", limit] if limit else []))
    where = f"{path}:{line}: " if line else f"{path}: "
    _assert_one_line_error(code, out, err, where, words)


def test_every_case_file_is_in_the_table() -> None:
    assert sorted(p.name for p in ERRORS.iterdir()) == sorted(c[0] for c in CASES)


def test_error_carries_structured_location() -> None:
    with pytest.raises(InventoryError) as exc:
        load_inventory(ERRORS / "gpus_word.yml")
    e = exc.value
    assert (e.line, e.host, e.field) == (7, "gpu02", "fleetctl_gpus")
    assert e.exit_code == 2


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        ("gpu9*", ("'gpu9*'", "matches no hosts")),
        ("gpu01:nope", ("'nope'", "matches no hosts")),
        ("cpu:&rack_b", ("--limit 'cpu:&rack_b' matches no hosts",)),
        ("rack_b[5]", ("subscript", "rack_b")),
        ("~gpu(", ("invalid pattern",)),
        ("@/nonexistent/limit-file", ("cannot read limit file",)),
        ("~[", ("--limit '~['", "unbalanced '[' or ']'")),  # Ansible's splitter made it `~`: all
        ("~", ("'~' needs a regular expression",)),
    ],
)
def test_bad_limit(limit: str, words: tuple[str, ...]) -> None:
    code, out, err = _cli("-i", str(GOOD), "--limit", limit)
    _assert_one_line_error(code, out, err, f"{GOOD}: ", words)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yml"
    code, out, err = _cli("-i", str(path))
    _assert_one_line_error(code, out, err, f"{path}: ", ("cannot read", "No such file"))


def test_directory(tmp_path: Path) -> None:
    code, out, err = _cli("-i", str(tmp_path))
    _assert_one_line_error(code, out, err, f"{tmp_path}: ", ("directory",))


def test_unreadable_file(tmp_path: Path) -> None:
    """A path that exists but cannot be opened (a symlink loop: fails for root too)."""
    path = tmp_path / "hosts.yml"
    path.symlink_to(path)
    code, out, err = _cli("-i", str(path))
    _assert_one_line_error(code, out, err, f"{path}: ", ("cannot read", "symbolic links"))


def test_unknown_group() -> None:
    code, out, err = _cli("-i", str(GOOD), "--group", "tpu")
    _assert_one_line_error(code, out, err, f"{GOOD}: ", ("'tpu'", "matches no hosts"))


def test_limit_without_inventory() -> None:
    code, out, err = _cli("--limit", "gpu01")
    _assert_one_line_error(code, out, err, "--limit", ("needs an inventory",))


def test_inventory_without_hosts(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\n[gpu:vars]\nfleetctl_gpus=8\n")
    code, out, err = _cli("-i", str(path))
    _assert_one_line_error(code, out, err, f"{path}: ", ("no hosts",))
