"""Every numeric option of every command takes finite numbers in a sane range only, and a dry
run refuses what the real run would (one-line usage error, exit 2)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest

from fleetctl.testing.cli_runner import all_commands, run_cli

BAD = ("nan", "NaN", "inf", "-inf", "1e309", "99999999999999999999", "2e23", "-1")


def _numeric_params() -> list[tuple[str, click.Parameter]]:
    out = []
    for path, cmd in all_commands():
        for p in cmd.params:
            t = p.type
            if isinstance(t, (click.types._NumberParamTypeBase,)) or t.name in ("N|auto",):
                out.append((f"{path} {p.name}", p))
    return out


NUMERIC = _numeric_params()


def test_the_walk_finds_the_numeric_options() -> None:
    names = {name for name, _ in NUMERIC}
    assert len(NUMERIC) >= 30
    for want in (
        "run connect_timeout",
        "run monitor_lost_timeout",
        "run retry_backoff",
        "run nproc",
        "run nodes_wanted",
        "exec timeout",
        "check min_free",
        "lab fault netem loss_pct",
        "monitor poll",
    ):
        assert want in names, want


@pytest.mark.parametrize("name,param", NUMERIC, ids=[n for n, _ in NUMERIC])
def test_no_numeric_option_takes_nan_inf_overflow_huge_or_negative(
    name: str, param: click.Parameter
) -> None:
    accepted = []
    for value in BAD:
        try:
            param.type.convert(value, param, None)
        except click.BadParameter:
            continue
        accepted.append(value)
    assert accepted == [], f"{name} accepts {accepted}"


@pytest.mark.parametrize(
    "args,words",
    [
        (("--monitor-lost-timeout", "nan"), "'nan' is not a finite number"),
        (("--retry-backoff", "inf"), "'inf' is not a finite number"),
        (("--connect-timeout", "99999999999999999999"), "1e+20 is not in the range"),
        (("--nproc-per-node", "200000000000000000000000"), "more than 4096 processes"),
        (("--collect-max", "abc"), "--collect-max"),
    ],
)
def test_a_dry_run_refuses_what_the_real_run_refuses(
    tmp_path: Path, args: tuple[str, ...], words: str
) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    res = run_cli("run", "--dry-run", *args, str(script), cwd=tmp_path)
    assert res.exit_code == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert words in lines[-1], res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
