"""``RunSpec``'s JSON form (what ``run --slurm`` ships to the allocation in run-spec.json):
every field of every group survives ``to_dict`` → JSON → ``from_dict`` (golden case files),
and a bad value in the file is refused with the command's own line (issue 35, item 2)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl import UsageError
from fleetctl.api.runspec import GROUPS, RunSpec
from fleetctl.api.types import CollectiveOptions, CollectOptions
from tests.pure.test_runspec import BAD

CASES = Path(__file__).parent / "runspec_cases"

#: every field away from its default but the role job's two (a role job replaces SCRIPT) and
#: --elastic's (torchrun, no --detach)
SCRIPT_CASE: dict[str, Any] = dict(
    script="train.py", args=("--lr", "0.1", "a b"), launcher="plain", nproc_per_node=2,
    master_port=29600, launcher_args=("--x=1",), env={"TOKEN": "s3cret", "EMPTY": ""},
    backend="gloo", code="code", allow_secrets=("keys/id",), env_archive="env.tar.gz",
    before="fabfile.py:prepare",
    check=False, nodes=3, allow_busy_gpus=True, probe_timeout=45.5,
    grace=2.5, lost_timeout=7, deadman=3, timeout=600, stall_timeout=60, startup_timeout=900,
    on_slow="stop", slow_rounds=2, progress_regex=r"done (\d+)", post_mortem=False,
    post_mortem_timeout=12.5,
    max_retries=2, retry_on=("exit:1,2", "lost"), no_retry_on=("signal:KILL",),
    retry_backoff=1.5, reboot_timeout=600, checkpoint_dir="ckpt", resume="last",
    collect=CollectOptions(max_bytes=1 << 20, exclude=("*.pt",)), report=False,
    collective=CollectiveOptions(size=1 << 20, min_fraction=0.25, floor=1.5, timeout=30,
                                 iters=5, backend="gloo"),
    image="ghcr.io/x/y:1", container_runtime="podman", runtime_timeout=12.5,
    detach=True, monitor=False, monitor_lost_timeout=90,
    metrics_addr="127.0.0.1:9400", metrics_textfile="m.prom", on_failure="page $X",
    on_end="echo end", hook_timeout=30,
    partition="gpu", gres="gpu:2", time="1:00:00", account="ml",
    sbatch_args=("--qos=high",), queue_timeout=120,
)  # fmt: skip
#: case file → the record's keywords; together they set every field away from its default
SPECS: dict[str, dict[str, Any]] = {
    "script.json": SCRIPT_CASE,
    "role.json": dict(job_file="job.yml", env_style="pai", collect=CollectOptions(max_bytes=None)),
    # torchrun only, in the foreground: what --elastic allows
    "elastic.json": dict(script="train.py", nodes=3, elastic=True, min_nodes=2),
}


@pytest.mark.parametrize("case", sorted(SPECS))
def test_every_field_survives_the_json_form(case: str) -> None:
    spec = RunSpec().replace(**SPECS[case])
    data = spec.to_dict()
    assert data == json.loads((CASES / case).read_text())  # the golden form
    back = RunSpec.from_dict(json.loads(json.dumps(data)))
    assert back == spec and back.to_dict() == data


def test_the_cases_move_every_field_of_every_group_off_its_default() -> None:
    default = RunSpec().to_dict()
    cases = [json.loads((CASES / c).read_text()) for c in SPECS]
    for group, cls in GROUPS.items():
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            values = [c[group][f.name] for c in cases]
            assert any(v != default[group][f.name] for v in values), f"{group}.{f.name}"


def _with(kw: str, value: Any) -> dict[str, Any]:
    """The script case's data with ``kw``'s field set to ``value`` (as a file would hold it)."""
    from fleetctl.api.runspec import KEYWORDS

    data = json.loads((CASES / "script.json").read_text())
    group, name = KEYWORDS[kw]
    data[group][name] = list(value) if isinstance(value, (list, tuple)) else value
    return data


@pytest.mark.parametrize("kw,value,argv", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_in_the_file_is_refused_with_the_commands_line(
    kw: str, value: Any, argv: tuple[str, ...]
) -> None:
    with pytest.raises(UsageError) as built:
        RunSpec.build("train.py", **{kw: value})
    with pytest.raises(UsageError) as read:
        RunSpec.from_dict(_with(kw, value))
    assert str(read.value) == str(built.value)


@pytest.mark.parametrize(
    ("data", "msg"),
    [
        ([], "a run spec must be a JSON object of groups"),
        ({"bogus": {}}, "unknown group 'bogus'"),
        ({"supervision": []}, "'supervision' must be a JSON object"),
        ({"supervision": {"timeuot": 5}}, "unknown field supervision.timeuot"),
        ({"supervision": {"grace": None}}, "Invalid value for '--grace': 'None' is not a valid"),
        ({"hosts": {"check": "yes"}}, "Invalid value for '--no-check': 'yes' is not True or"),
        ({"program": {"args": ["a", 1]}}, "Invalid value for 'args': ['a', 1] is not a list"),
        ({"program": {"env": {"A": 1}}}, "Invalid value for '--env-var': A=1: the value is not"),
        ({"retry": {"max_retries": 2.5}}, "Invalid value for '--max-retries': '2.5' is not a"),
        ({"collection": {"collect": {"max_bytes": "1G"}}}, "'--collect-max': max_bytes: '1G'"),
        ({"collection": {"collect": {"cap": 1}}}, "'--collect-max': unknown key 'cap'"),
        ({"collective": {"collective": {"size": 2}}}, "Invalid value for '--collective-size': "),
        ({"program": {"script": "a.py", "job_file": "j.yml"}}, "--job j.yml replaces SCRIPT"),
    ],
)
def test_a_garbled_spec_is_one_usage_error(data: Any, msg: str) -> None:
    with pytest.raises(UsageError) as caught:
        RunSpec.from_dict(data)
    assert msg in str(caught.value) and "\n" not in str(caught.value)


def test_a_python_callable_cannot_travel_in_the_json_form() -> None:
    def prepare(nodes: Any, settings: Any) -> None:
        pass

    with pytest.raises(UsageError, match=r"'--before': a Python callable \('prepare'\) cannot"):
        RunSpec.build("train.py", before=prepare).to_dict()
