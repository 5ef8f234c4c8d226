"""``RunSpec`` is the one record of a run: the library and the command refuse the same values
with the same one-line message (``UsageError``, exit 2), and the record's fields are the
command's options (issue 35, item 1)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import click
import click.testing
import pytest

from fleetctl import Fleet, UsageError
from fleetctl.api.runspec import GROUPS, KEYWORDS, RunSpec, field_of
from fleetctl.testing.cli_runner import run_cli

NAN, INF = float("nan"), float("inf")

# (library keyword, library value, command-line words): each refused by both, in a dry run
BAD: list[tuple[str, Any, tuple[str, ...]]] = [
    ("timeout", NAN, ("--timeout=nan",)),
    ("grace", -1, ("--grace=-1",)),
    ("on_slow", "kill", ("--on-slow=kill",)),
    ("slow_rounds", 0, ("--slow-rounds=0",)),
    ("slow_rounds", 7, ("--slow-rounds=7",)),  # more than the judge's window of 6 rounds
    ("progress_regex", "step (", ("--progress-regex=step (",)),  # not a regex
    ("progress_regex", r"step \d+", (r"--progress-regex=step \d+",)),  # no group for the count
    ("post_mortem_timeout", 0.5, ("--post-mortem-timeout=0.5",)),
    ("stall_timeout", INF, ("--stall-timeout=inf",)),
    ("lost_timeout", 0, ("--lost-timeout=0",)),
    ("max_retries", -2, ("--max-retries=-2",)),
    ("deadman", 11, ("--deadman=11",)),
    ("retry_backoff", 301, ("--retry-backoff=301",)),
    ("reboot_timeout", 3601, ("--reboot-timeout=3601",)),
    ("monitor_lost_timeout", -INF, ("--monitor-lost-timeout=-inf",)),
    ("nodes", 0, ("--nodes=0",)),
    ("min_nodes", 0, ("--min-nodes=0", "--elastic", "--nodes=1")),
    ("master_port", 70000, ("--master-port=70000",)),
    ("nproc_per_node", 0, ("--nproc-per-node=0",)),
    ("launcher", "mpirun", ("--launcher=mpirun",)),
    ("backend", "mpi", ("--backend=mpi",)),
    ("container_runtime", "lxc", ("--container-runtime=lxc", "--image=i")),
    ("runtime_timeout", 0.5, ("--runtime-timeout=0.5", "--image=i")),
    ("env", {"A\n": "1"}, ("--env-var=A\n=1",)),
    ("launcher_args", ["--x\ntouch /tmp/PWN"], ("--launcher-arg=--x\ntouch /tmp/PWN",)),
    ("image", "img\nrm -rf ~", ("--image=img\nrm -rf ~",)),
    ("checkpoint_dir", "ck\rpt", ("--checkpoint-dir=ck\rpt",)),
    ("retry_on", ["exit:1\x1b[2J"], ("--retry-on=exit:1\x1b[2J",)),
    ("before", "fabfile.py:t\nid", ("--before=fabfile.py:t\nid",)),
    ("metrics_addr", "9400", ("--metrics-addr=9400",)),
    ("metrics_addr", "127.0.0.1:65536", ("--metrics-addr=127.0.0.1:65536",)),
    ("metrics_addr", "127.0.0.1:", ("--metrics-addr=127.0.0.1:",)),
    ("on_failure", "page\nrm -rf ~", ("--on-failure=page\nrm -rf ~",)),
    ("hook_timeout", 0, ("--hook-timeout=0",)),
]


@pytest.fixture
def script(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('hi')\n")
    return tmp_path / "train.py"


@pytest.mark.parametrize("kw,value,argv", BAD, ids=[b[0] for b in BAD])
def test_the_library_and_the_command_refuse_a_bad_value_with_one_message(
    tmp_path: Path, script: Path, kw: str, value: Any, argv: tuple[str, ...]
) -> None:
    with pytest.raises(UsageError) as caught:
        Fleet.local(runs_dir=tmp_path / "runs").run(str(script), dry_run=True, **{kw: value})
    r = run_cli("run", "--dry-run", *argv, str(script), cwd=tmp_path)
    assert r.exit_code == 2, r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"fleetctl: error: {caught.value.one_line()}"]
    assert caught.value.one_line() == str(caught.value)  # one line
    assert not (tmp_path / "runs").exists()


def test_a_slurm_value_with_a_newline_is_refused_before_any_sbatch_line(tmp_path: Path) -> None:
    for argv in (("--partition=p\ntouch x",), ("--sbatch-arg=--comment=a\ntouch x",)):
        r = run_cli("run", "--slurm", "--nodes=1", "--dry-run", *argv, "t.py", cwd=tmp_path)
        assert r.exit_code == 2, r.stderr
        assert "holds a control character" in r.stderr and "#SBATCH" not in r.stdout
    with pytest.raises(UsageError, match="'--partition': 'p\\\\n' holds a control character"):
        RunSpec.build("t.py", partition="p\n")


def test_a_misspelt_keyword_is_a_type_error_not_an_ignored_option() -> None:
    with pytest.raises(TypeError, match="stall_timeot"):
        RunSpec.build("t.py", stall_timeot=5)


def test_the_record_is_frozen_grouped_and_holds_checked_values() -> None:
    spec = RunSpec.build("t.py", "--lr", "3", timeout="90", max_retries=2, image="i")
    assert spec.supervision.timeout == 90.0 and spec.retry.max_retries == 2
    assert spec.program.args == ("--lr", "3") and spec.container.image == "i"
    assert spec.flat()["timeout"] == 90.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.supervision.timeout = 5  # type: ignore[misc]
    assert spec.replace(grace=1).supervision.grace == 1.0


def _run_command() -> click.Command:
    from fleetctl.cli import cli

    cmd = cli.get_command(click.Context(cli), "run")
    assert cmd is not None
    return cmd


def test_every_field_with_flags_is_an_option_of_run_with_its_parameter_name() -> None:
    params = {p.name: p for p in _run_command().params}
    for kw in KEYWORDS:
        f = field_of(kw)
        flags = f.metadata["flags"]
        if not flags:
            continue
        name = f.metadata["param"] or kw
        assert name in params, (kw, name)
        assert set(flags) <= set(params[name].opts + params[name].secondary_opts), kw
    assert {g.TITLE for g in GROUPS.values()} >= {"What to run", "Supervision", "Slurm"}


def test_one_decorator_makes_a_groups_options_from_the_record() -> None:
    from fleetctl.cli.options import spec_keywords, spec_options

    got: dict[str, Any] = {}

    @click.command()
    @spec_options("hosts", "supervision")
    def cmd(**params: Any) -> None:
        got.update(spec_keywords(params, "hosts", "supervision"))

    runner = click.testing.CliRunner()
    ok = runner.invoke(cmd, ["--no-check", "--timeout", "90", "--nodes", "2"])
    assert ok.exit_code == 0, ok.output
    assert got == {
        "check": False,
        "nodes": 2,
        "allow_busy_gpus": False,
        "grace": 5.0,
        "lost_timeout": 5.0,
        "deadman": 10.0,
        "timeout": 90.0,
        "stall_timeout": None,
        "startup_timeout": None,
        "on_slow": "warn",
        "slow_rounds": 4,
        "progress_regex": None,
        "post_mortem": True,
        "post_mortem_timeout": 30.0,
        "probe_timeout": 30.0,
    }
    RunSpec.build("t.py", **got)  # the keywords are the record's
    bad = runner.invoke(cmd, ["--lost-timeout", "0"])
    assert bad.exit_code == 2 and "0.0 is not in the range 1<=x<=60." in bad.output
    helps = {p.name: p.help for p in cmd.params}
    assert helps["deadman"] == field_of("deadman").metadata["help"]


def test_env_vars_become_the_records_env_and_a_bad_name_is_the_records_message() -> None:
    from fleetctl.cli.options import spec_keywords

    params: dict[str, Any] = {"env_vars": ("A=1", "B=x=y"), "script": "t.py"}
    assert spec_keywords(params, "program") == {"env": {"A": "1", "B": "x=y"}}
    assert params == {"script": "t.py"}  # taken out: what is left is the command's own
    with pytest.raises(click.BadParameter, match="'A-B' is not a valid variable name"):
        spec_keywords({"env_vars": ("A-B=1",)}, "program")


def test_a_fleet_runs_a_record_as_it_runs_the_keywords(tmp_path: Path, script: Path) -> None:
    fleet = Fleet.local(runs_dir=tmp_path / "runs")
    spec = RunSpec.build(str(script), "--lr", "3", launcher="plain", master_port=29777)
    plan = fleet.run_spec(spec, dry_run=True)
    same = fleet.run(str(script), "--lr", "3", launcher="plain", master_port=29777, dry_run=True)
    assert [n.argv for n in plan.nodes] == [n.argv for n in same.nodes]
    assert tuple(plan.nodes[0].argv[-2:]) == ("--lr", "3")


def test_the_command_checks_the_whole_record_before_reading_the_inventory(
    tmp_path: Path, script: Path
) -> None:
    r = run_cli(
        "run", "--dry-run", "-i", str(tmp_path / "missing.yml"), "--env-style", "pai",
        str(script), cwd=tmp_path,
    )  # fmt: skip
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [
        "fleetctl: error: --env-style names role env variables: it needs a role job (--job FILE)"
    ]
