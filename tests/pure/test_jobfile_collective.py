"""The role job file's ``collective:`` key: ``run --collective`` from the file, by the flags'
one definition (``api/runspec_collective.py``): the same bounds, and the line the command prints
for the flag's bad value, named by the file's line."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.api.runspec_collective import FILE_KEYS
from fleetctl.errors import UsageError
from fleetctl.plan.collective import CollectiveOptions, MiB
from fleetctl.plan.roles.jobfile import parse_job_file
from fleetctl.testing.cli_runner import run_cli

ROLES = "roles:\n  worker:\n    script: train.py\n"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("", None),
        ("collective: false\n", None),
        ("collective: true\n", CollectiveOptions()),
        (
            "collective:\n  size_mib: 4\n  min: 0.3\n  floor: 1.5\n  timeout: 30\n",
            CollectiveOptions(size=4 * MiB, min_fraction=0.3, floor=1.5, timeout=30.0),
        ),
        ("collective:\n  min: 0.7\n", CollectiveOptions(min_fraction=0.7)),
        ("collective:\n  size_mib: 0.001\n", CollectiveOptions(size=1049)),  # the flag's least
        (
            "collective:\n  min: 0\n  timeout: 3600\n",
            CollectiveOptions(min_fraction=0.0, timeout=3600.0),
        ),
    ],
    ids=["absent", "false", "true", "every knob", "one knob", "least size", "bounds"],
)
def test_collective_key(text: str, want: CollectiveOptions | None) -> None:
    assert parse_job_file(text + ROLES).collective == want


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("collective: yes please\n", "job.yml:1: collective must be true, false or a mapping of"),
        ("collective:\n  size: 4\n", "job.yml:2: unknown key 'size' (known: size_mib, min, "),
    ],
)
def test_collective_key_shape_errors(text: str, line: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_job_file(text + ROLES)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


# (file key, bad value in YAML, the same value on the command line)
BAD = [
    ("min", "2", "2"),
    ("min", "-0.1", "-0.1"),
    ("timeout", "true", "True"),
    ("timeout", "0.5", "0.5"),
    ("timeout", "3601", "3601"),
    ("size_mib", ".nan", "nan"),
    ("size_mib", "0", "0"),
    ("size_mib", "65537", "65537"),
    ("floor", "-1", "-1"),
]


@pytest.mark.parametrize(("key", "yaml", "flag_value"), BAD)
def test_a_bad_knob_is_refused_with_the_flags_line(
    tmp_path: Path, key: str, yaml: str, flag_value: str
) -> None:
    """The file's line and the command's name the same bound (UsageError, exit 2)."""
    flag = FILE_KEYS[key].flag
    with pytest.raises(UsageError) as e:
        parse_job_file(f"collective:\n  {key}: {yaml}\n" + ROLES)
    assert e.value.exit_code == 2
    r = run_cli("check", "--collective", f"{flag}={flag_value}", cwd=tmp_path)
    assert r.exit_code == 2, r.stderr
    said = r.stderr.strip().removeprefix(f"fleetctl: error: Invalid value for '{flag}': ")
    assert str(e.value) == f"job.yml:2: collective {key}: {said.rstrip('.')} ({flag})"


def test_every_file_key_is_a_collective_flag() -> None:
    assert sorted(FILE_KEYS) == ["floor", "min", "size_mib", "timeout"]
    assert all(s.flag.startswith("--collective-") for s in FILE_KEYS.values())
