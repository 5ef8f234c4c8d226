"""``fleetctl run --help`` groups its options in sections named by ``RunSpec``'s groups and
ends with examples (issue 40: 59 options in one flat list, no examples)."""

from __future__ import annotations

import re

from fleetctl.testing.cli_runner import run_cli

HEADINGS = [
    "What to run",
    "Where",
    "Supervision",
    "Retries",
    "Collection",
    "Collective benchmark",
    "Containers",
    "Detach and monitor",
    "Metrics and hooks",
    "Slurm",
    "Output",
    "Other options",
    "Examples",
]


def _help() -> str:
    r = run_cli("run", "--help")
    assert r.exit_code == 0, r.stderr
    return r.stdout


def test_run_help_has_one_section_per_group_then_examples() -> None:
    headings = [line[:-1] for line in _help().splitlines() if re.match(r"^[A-Z][^:]*:$", line)]
    assert headings == HEADINGS


def test_only_help_itself_is_left_for_other_options() -> None:
    text = _help()
    other = text.split("\nOther options:\n")[1].split("\nExamples:\n")[0]
    assert [line.split()[0] for line in other.splitlines() if line.strip()] == ["-h,"]


def test_every_option_of_run_is_listed_once() -> None:
    from fleetctl.cli.run_cmd import run_command

    text = _help()
    for p in run_command.params:
        if getattr(p, "hidden", False):  # --spec: what run --slurm's batch script runs
            continue
        for opt in p.opts if p.param_type_name == "option" else ():
            assert len(re.findall(rf"(?m)^  (?:\S+, )?{re.escape(opt)}[ ,\n]", text)) == 1, opt


def test_the_examples_are_commands_of_run() -> None:
    examples = _help().split("\nExamples:\n")[1]
    lines = [line.strip() for line in examples.splitlines() if line.strip()]
    assert len(lines) >= 5 and all(line.startswith("fleetctl run ") for line in lines)
