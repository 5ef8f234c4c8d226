"""``--collective*`` and ``--collect-*`` come from one definition, the sub-options of
``RunSpec``'s ``collective`` and ``collect`` fields (``fleetctl/api/runspec_collective.py``):
``run`` and ``check`` (and ``collect``) get the same options from it, and a bound is refused
with the same line by the command and by the library (``UsageError``, exit 2; issue 35 item 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest

from fleetctl import Fleet, UsageError
from fleetctl.api.runspec import RunSpec, field_of
from fleetctl.phases.collect import CollectOptions
from fleetctl.plan.collective import CollectiveOptions, MiB
from fleetctl.testing.cli_runner import run_cli

NAN, INF = float("nan"), float("inf")
REPO = Path(__file__).resolve().parents[2]


def _params(name: str) -> dict[str, click.Parameter]:
    from fleetctl.cli import cli

    cmd = cli.get_command(click.Context(cli), name)
    assert cmd is not None, name
    return {p.name: p for p in cmd.params if p.name}


def _same_option(a: click.Parameter, b: click.Parameter, sub: Any) -> None:
    assert isinstance(a, click.Option) and isinstance(b, click.Option)
    assert a.opts == b.opts == [sub.flag]
    assert a.help == b.help == sub.help
    assert a.default == b.default
    if not (a.is_flag or a.multiple):  # click keeps its own "unset" for those
        assert a.default == sub.default
    assert a.show_default == b.show_default
    assert a.multiple == b.multiple == sub.multiple
    if sub.check is not None and not sub.text:  # the flag's bounds are the record's check
        assert a.type.check() == b.type.check() == sub.check  # type: ignore[attr-defined]


@pytest.mark.parametrize("kw,other", [("collective", "check"), ("collect", "collect")])
def test_run_and_the_other_command_get_the_options_of_one_definition(kw: str, other: str) -> None:
    subs = field_of(kw).metadata["subs"]
    run, them = _params("run"), _params(other)
    assert len(subs) >= 2
    for sub in subs:
        _same_option(run[sub.param], them[sub.param], sub)


def test_no_module_writes_the_flags_a_second_time() -> None:
    flags = [s.flag for kw in ("collective", "collect") for s in field_of(kw).metadata["subs"]]
    for path in (REPO / "fleetctl").rglob("*.py"):
        text = path.read_text()
        for flag in flags:
            if f'"{flag}"' in text:
                assert path.name == "runspec_collective.py", (path, flag)


# (flag, command-line value, the record's attribute for the same value)
BOUNDS: list[tuple[str, str, dict[str, Any]]] = [
    ("--collective-size", "0", {"size": 0}),
    ("--collective-size", "70000", {"size": 70000 * MiB}),
    ("--collective-size", "nan", {"size": NAN}),
    ("--collective-min", "2", {"min_fraction": 2}),
    ("--collective-min", "-0.5", {"min_fraction": -0.5}),
    ("--collective-floor", "-1", {"floor": -1}),
    ("--collective-floor", "inf", {"floor": INF}),
    ("--collective-timeout", "0.5", {"timeout": 0.5}),
    ("--collective-timeout", "3601", {"timeout": 3601}),
]


@pytest.mark.parametrize("flag,text,attrs", BOUNDS, ids=[f"{b[0]}={b[1]}" for b in BOUNDS])
def test_a_bound_is_one_line_from_run_check_the_record_and_a_dry_run(
    tmp_path: Path, flag: str, text: str, attrs: dict[str, Any]
) -> None:
    bad = CollectiveOptions(**attrs)
    with pytest.raises(UsageError) as made:
        RunSpec.build("train.py", collective=bad)
    line = str(made.value)
    assert line.startswith(f"Invalid value for '{flag}': ") and "\n" not in line
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(UsageError) as ran:
        Fleet.local(runs_dir=tmp_path / "runs").run(str(script), dry_run=True, collective=bad)
    assert str(ran.value) == line and ran.value.exit_code == 2
    for argv in (("run", "--dry-run", "--collective"), ("check", "--collective")):
        tail = (str(script),) if argv[0] == "run" else ()
        r = run_cli(*argv, f"{flag}={text}", *tail, cwd=tmp_path)
        assert r.exit_code == 2, r.stderr
        assert r.stdout == "" and r.stderr.strip().splitlines() == [f"fleetctl: error: {line}"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("size_mib", ["0.001", "65536", "32"])
def test_what_the_command_makes_of_a_value_in_bounds_the_record_takes(size_mib: str) -> None:
    from fleetctl.cli.options import spec_keywords

    params = {s.param: s.default for s in field_of("collective").metadata["subs"]}
    params.update(collective=True, collective_size=float(size_mib))
    kw = spec_keywords(params, "collective")
    assert params == {}
    got = RunSpec.build("train.py", **kw).collective.collective
    assert got is not None and got.size >= float(size_mib) * MiB


def test_a_negative_collect_cap_is_the_flags_line() -> None:
    with pytest.raises(UsageError) as caught:
        RunSpec.build("train.py", collect=CollectOptions(max_bytes=-1))
    assert str(caught.value) == "Invalid value for '--collect-max': -1 is not in the range x>=0."
