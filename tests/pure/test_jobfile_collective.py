"""The role job file's ``collective:`` key: ``run --collective`` from the file."""

from __future__ import annotations

import pytest

from fleetctl.errors import UsageError
from fleetctl.phases.check.collective_judge import CollectiveOptions, MiB
from fleetctl.plan.roles.jobfile import parse_job_file

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
    ],
    ids=["absent", "false", "true", "every knob", "one knob"],
)
def test_collective_key(text: str, want: CollectiveOptions | None) -> None:
    assert parse_job_file(text + ROLES).collective == want


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("collective: yes please\n", "job.yml:1: collective must be true, false or a mapping"),
        ("collective:\n  size: 4\n", "job.yml:2: unknown key 'size'"),
        ("collective:\n  min: 2\n", "job.yml:2: collective min must be a number 0..1"),
        ("collective:\n  timeout: true\n", "job.yml:2: collective timeout must be a number"),
        ("collective:\n  size_mib: .nan\n", "job.yml:2: collective size_mib must be a number"),
    ],
)
def test_collective_key_errors(text: str, words: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_job_file(text + ROLES)
    assert words in str(e.value)
