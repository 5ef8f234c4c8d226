"""Unbounded inventory input is refused in one line, before it costs memory or time."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import InventoryError
from fleetctl.plan.inventory import load_inventory


def test_a_host_range_past_the_limit_is_refused_before_expanding(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\ngpu[0:99999999]\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    msg = e.value.one_line()
    assert msg.startswith(f"{inv}:2:") and "names 100000000 hosts, more than 10000" in msg


def test_nested_ranges_multiply_and_are_bounded_too(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\nr[0:999]n[0:999]\n")
    with pytest.raises(InventoryError, match="more than 10000 hosts per pattern"):
        load_inventory(inv)


def test_a_range_at_the_limit_still_loads(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[gpus]\ngpu[00001:10000]\n")
    assert len(load_inventory(inv).nodes) == 10_000


def test_a_yaml_alias_bomb_is_refused_naming_the_file(tmp_path: Path) -> None:
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        levels.append(f"a{i}: &a{i} [{refs}]")
    body = "\n".join("    " + line for line in levels)
    inv = tmp_path / "hosts.yml"
    inv.write_text(f"all:\n  vars:\n{body}\n  hosts:\n    g1: {{}}\n")
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    msg = e.value.one_line()
    assert msg.startswith(f"{inv}:") and "aliases expand to more than 1000000 values" in msg


def test_ordinary_aliases_and_merges_still_work(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n    g1: &base {fleetctl_gpus: 2}\n    g2:\n      <<: *base\n"
        "      fleetctl_nic: ib0\n"
    )
    g1, g2 = load_inventory(inv).nodes
    assert g1.gpus == g2.gpus == 2 and g2.nic == "ib0"


# --------------------------------------------- files the user names: regular and bounded


def _fifo(tmp_path: Path, name: str) -> Path:
    import os

    fifo = tmp_path / name
    os.mkfifo(fifo)  # nobody writes it: reading would block forever
    return fifo


def test_a_character_device_inventory_is_refused_before_reading() -> None:
    from fleetctl.testing.cli_runner import run_cli

    res = run_cli("inventory", "-i", "/dev/zero")
    assert res.exit_code == 2
    assert res.stderr.strip() == (
        "fleetctl: error: /dev/zero: inventory is not a regular file (a character device); "
        "fleetctl reads only files"
    )


def test_a_fifo_inventory_and_a_fifo_limit_file_are_refused_not_waited_on(tmp_path: Path) -> None:
    with pytest.raises(
        InventoryError, match=r"hosts\.ini: inventory is not a regular file \(a FIFO"
    ):
        load_inventory(_fifo(tmp_path, "hosts.ini"))
    inv = tmp_path / "real.ini"
    inv.write_text("[g]\na\nb\n")
    fifo = _fifo(tmp_path, "limit.txt")
    with pytest.raises(InventoryError, match=r"--limit @.*limit\.txt: limit file is not a regular"):
        load_inventory(inv, limit=f"@{fifo}")


def test_an_oversized_inventory_or_vars_file_is_refused_by_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.plan import userinput

    inv = tmp_path / "hosts.ini"
    inv.write_text("[g]\na\n")
    (tmp_path / "group_vars").mkdir()
    big = tmp_path / "group_vars" / "all.yml"
    big.write_text("x: " + "y" * (3 << 20) + "\n")
    monkeypatch.setattr(userinput, "MAX_INPUT_BYTES", 2 << 20)
    with pytest.raises(InventoryError) as e:
        load_inventory(inv)
    assert e.value.one_line() == (
        f"{tmp_path}/group_vars/all.yml: vars file is {big.stat().st_size} bytes, more than "
        "the 2 MiB fleetctl reads"
    )
    inv.write_text("[g]\n" + "a\n" * (1 << 20) + "\n")
    with pytest.raises(InventoryError, match="inventory is 2097157 bytes, more than the 2 MiB"):
        load_inventory(inv)


def test_a_fifo_vars_file_is_refused_naming_it(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.ini"
    inv.write_text("[g]\na\n")
    (tmp_path / "host_vars").mkdir()
    _fifo(tmp_path / "host_vars", "a")
    with pytest.raises(InventoryError, match=r"host_vars/a: vars file is not a regular file"):
        load_inventory(inv)


def _bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    return "\n".join(lines)


def test_a_job_file_alias_bomb_is_refused_by_the_inventory_guard(tmp_path: Path) -> None:
    from fleetctl.errors import UsageError
    from fleetctl.plan.roles import load_job_file

    job = tmp_path / "job.yml"
    job.write_text(_bomb(7) + "\nroles:\n  w: {script: train.py}\n")
    with pytest.raises(UsageError) as e:
        load_job_file(str(job))
    assert e.value.one_line() == (
        f"{job}:1: YAML aliases expand to more than 1000000 values (an alias bomb?); "
        "write the values out"
    )


def test_a_job_file_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    from fleetctl.errors import UsageError
    from fleetctl.plan.roles import load_job_file

    fifo = _fifo(tmp_path, "job.yml")
    with pytest.raises(UsageError, match=r"job\.yml: job file is not a regular file \(a FIFO\)"):
        load_job_file(str(fifo))


@pytest.mark.parametrize("command", ["run", "push"])
def test_a_fifo_env_archive_is_refused_before_anything_is_contacted(
    tmp_path: Path, command: str
) -> None:
    from fleetctl.testing.cli_runner import run_cli

    fifo = _fifo(tmp_path, "env.tar.gz")
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = [command, "--env", str(fifo)] + ([str(script)] if command == "run" else [])
    res = run_cli(*args)
    assert res.exit_code == 2, res.stderr
    assert res.stderr.strip() == (
        f"fleetctl: error: Invalid value for '--env': '{fifo}' is not a regular file"
    )
