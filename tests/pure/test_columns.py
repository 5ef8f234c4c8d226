"""The column tables of ``fleetctl inventory`` and ``run --dry-run``: laid out from one pass
over the strings (not rich's per-cell Table), nothing cut, and a dry run's text that grows
with the fleet, not its square."""

from __future__ import annotations

import io
from pathlib import Path

from rich.cells import cell_len
from rich.console import Console

from fleetctl.cli.columns import Column, print_table, table_lines
from fleetctl.testing.cli_runner import run_cli

COLUMNS = [Column("rank", "right"), Column("host"), Column("workdir")]
ROWS = [["0", "gpu01", "~/.fleetctl"], ["12", "a-much-longer-name", "/scratch/fleet"]]


def test_columns_are_as_wide_as_their_widest_cell_and_line_up() -> None:
    header, rule, lines = table_lines(COLUMNS, ROWS, width=200)
    assert header == "  rank   host                 workdir"
    assert rule == " " + "─" * len(lines[1])  # under every column, padding included
    assert lines == [
        "     0   gpu01                ~/.fleetctl",
        "    12   a-much-longer-name   /scratch/fleet",
    ]


def test_a_narrow_terminal_folds_the_widest_cells_and_cuts_nothing() -> None:
    header, rule, lines = table_lines(COLUMNS, ROWS, width=32)
    assert header == "  rank   host        workdir"  # host and workdir gave way, rank kept 4
    assert lines == [
        "     0   gpu01       ~/.fleetc",
        "                     tl",
        "    12   a-much-lo   /scratch/",
        "         nger-name   fleet",
    ]
    assert len(rule) <= 32


def test_wide_characters_are_measured_in_terminal_cells() -> None:
    rows = [["1", "gpu-東京", "x"], ["2", "gpu-ab", "y"]]
    _, _, lines = table_lines(COLUMNS, rows, width=200)
    assert cell_len(lines[0]) == cell_len(lines[1])


def test_cells_are_text_never_markup() -> None:
    out = io.StringIO()
    print_table(Console(file=out, width=100), COLUMNS, [["0", "[bold]x[/]", "~"]], title="[t]")
    assert "[bold]x[/]" in out.getvalue() and "[t]" in out.getvalue()


def _inventory(tmp_path: Path, hosts: int) -> Path:
    lines = ["[gpu]", *(f"gpu{i} ansible_host=10.0.{i // 250}.{i % 250 + 1}" for i in range(hosts))]
    path = tmp_path / "hosts.ini"
    path.write_text("\n".join([*lines, "[gpu:vars]", "fleetctl_gpus=8", "fleetctl_nic=ib0"]))
    return path


def test_inventory_table_has_a_row_per_node_uncut_in_a_pipe(tmp_path: Path) -> None:
    r = run_cli("inventory", "-i", str(_inventory(tmp_path, 300)), env={"COLUMNS": None})
    assert r.exit_code == 0, r.stderr
    rows = [c for c in map(str.split, r.stdout.splitlines()) if len(c) > 5 and c[0].isdigit()]
    assert [row[:3] for row in rows[:2]] == [["0", "gpu0", "10.0.0.1"], ["1", "gpu1", "10.0.0.2"]]
    assert len(rows) == 300 and rows[-1][1:3] == ["gpu299", "10.0.1.50"]
    assert "300 nodes" in r.stdout


def test_dry_run_text_shows_a_fleet_wide_argument_once(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    inv = str(_inventory(tmp_path, 200))
    r = run_cli("run", "-i", inv, "--dry-run", "--launcher", "paddle", "train.py", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.count("--ips=") == 1
    assert "‹argv 3› on every node: --ips=10.0.0.1,10.0.0.2," in r.stdout
    commands = [line for line in r.stdout.splitlines() if "$ python3" in line]
    assert len(commands) == 200 and all(" ‹argv 3› --host=10.0." in c for c in commands)
    assert "run folder" in r.stdout and "dry run: nothing was started" in r.stdout


def test_dry_run_text_says_once_that_every_node_writes_the_same_files(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    inv = str(_inventory(tmp_path, 3))
    r = run_cli("run", "-i", inv, "--dry-run", "--launcher", "deepspeed", "train.py", cwd=tmp_path)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.count("hostfile in") == 1
    assert "every node writes hostfile in its run folder" in r.stdout
