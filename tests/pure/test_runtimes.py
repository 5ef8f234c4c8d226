"""Golden argv for the container runtimes: one JSON file per case in runtime_cases/.

Each case names a runtime, a ``ContainerSpec``, the launcher argv, a stop grace and container
ids, and the exact argv expected of every builder (written by hand; ``null`` where the runtime
has no such command).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from fleetctl.errors import PlanError, UsageError
from fleetctl.node import Node
from fleetctl.phases.check_containers import mismatches, parse, script
from fleetctl.plan.rankplan import JobSpec, NodePlan, make_plan
from fleetctl.plan.runtimes import ORDER, ContainerSpec, runtime
from fleetctl.plan.runtimes.base import grace_seconds
from fleetctl.testing.cli_runner import run_cli

CASES = sorted((Path(__file__).parent / "runtime_cases").glob("*.json"))


def _spec(fields: dict) -> ContainerSpec:
    fields = dict(fields)
    for key in ("mounts", "env_names"):
        fields[key] = tuple(fields.get(key, ()))
    return ContainerSpec(**fields)


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden_argv(path: Path) -> None:
    case = json.loads(path.read_text())
    rt = runtime(case["runtime"])
    spec = _spec(case["spec"])
    got = {
        "run": rt.run_argv(spec, case["argv"]),
        "probe": rt.probe_argv(spec.image),
        "image_id": rt.image_id_argv(spec.image),
        "list": rt.list_argv(spec.job_id),
        "stop": rt.stop_argv(case["ids"], case["grace"]),
        "remove": rt.remove_argv(case["ids"]),
    }
    assert got == case["expected"]


def test_every_runtime_has_a_case() -> None:
    assert {json.loads(p.read_text())["runtime"] for p in CASES} == set(ORDER)


def test_values_never_in_argv() -> None:
    """Env goes by name: a token in the plan's env never shows in ``ps``."""
    spec = ContainerSpec(image="i", job_id="j1", node_rank=0, cwd="/w", env_names=("HF_TOKEN",))
    for name in ORDER:
        argv = runtime(name).run_argv(spec, ["python3", "t.py"])
        assert not any("=" in a and a.startswith("HF_TOKEN") for a in argv), argv


def test_unknown_runtime_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"unknown container runtime 'lxc'.*podman, docker"):
        runtime("lxc")


@pytest.mark.parametrize(("grace", "want"), [(0.0, "0"), (2.0, "2"), (2.1, "3"), (-1.0, "0")])
def test_grace_rounds_up(grace: float, want: str) -> None:
    assert grace_seconds(grace) == want


def _node(name: str, **vars: str) -> Node:
    return Node(name=name, address=f"10.0.0.{name[-1]}", vars=vars)


def test_the_plan_runs_in_the_image_on_its_python() -> None:
    """--image wins over fleetctl_image; the job's python is the image's python3 (or
    fleetctl_image_python), never fleetctl_python, the host's interpreter for the supervisor."""
    nodes = [
        Node(name="n1", address="10.0.0.1", python="/opt/host/py", vars={"fleetctl_image": "a"}),
        _node("n2", fleetctl_image="a", fleetctl_image_python="/opt/conda/bin/python"),
    ]
    spec = JobSpec(script="t.py", job_id="j1", launcher="plain", nproc_per_node=1)
    plan = make_plan(nodes, spec)
    assert [n.container for n in plan.nodes] == [
        {"image": "a", "runtime": None, "gpus": False},
        {"image": "a", "runtime": None, "gpus": False},
    ]
    assert [n.argv[0] for n in plan.nodes] == ["python3", "/opt/conda/bin/python"]
    plan = make_plan(nodes, replace(spec, image="b", container_runtime="docker"))
    assert {n.container["image"] for n in plan.nodes if n.container} == {"b"}
    assert plan.nodes[0].to_dict()["container"]["runtime"] == "docker"
    assert NodePlan.from_dict(plan.nodes[0].to_dict()).container == plan.nodes[0].container
    assert make_plan([_node("n1")], spec).nodes[0].container is None


def test_a_runtime_name_is_checked_naming_the_host() -> None:
    spec = JobSpec(script="t.py", job_id="j1", launcher="plain", nproc_per_node=1)
    with pytest.raises(PlanError, match=r"n1.*unknown container runtime 'lxc'"):
        make_plan([_node("n1", fleetctl_image="a", fleetctl_container_runtime="lxc")], spec)


@pytest.mark.parametrize(
    ("stdout", "want"),
    [
        ("runtime podman\nimage sha256:aa\nprobe 0 \n", ("podman", "sha256:aa", None)),
        ("missing -\n", (None, None, "no container runtime found (podman, docker, apptainer)")),
        ("missing docker\n", (None, None, "container runtime docker not found")),
        ("runtime podman\nimage -\n", ("podman", None, "image img:1 is not present (podman)")),
        (
            "runtime podman\nimage sha256:aa\nprobe 126 Error: runc: no cgroup\n",
            (
                "podman",
                "sha256:aa",
                "podman cannot start a container of img:1: Error: runc: no cgroup",
            ),
        ),
    ],
)
def test_what_a_node_says_about_its_image(stdout: str, want: tuple) -> None:
    got = parse(stdout, "img:1")
    assert (got.runtime, got.image_id, got.problem) == want


def test_the_check_script_runs_in_sh(tmp_path: Path) -> None:
    """The node's side with a fake podman on PATH: the real shell, the real lines."""
    fake = tmp_path / "podman"
    fake.write_text('#!/bin/sh\n[ "$1" = image ] && { echo sha256:ff; exit 0; }\nexit 0\n')
    fake.chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", script("img:1", "podman")],
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        timeout=30,
    )
    assert out.stdout.splitlines() == ["runtime podman", "image sha256:ff", "probe 0 "]


def test_another_build_is_named_with_both_ids() -> None:
    want = {h: ("img:1", None) for h in ("n1", "n2", "n3")} | {"n4": ("other", None)}
    ids = {"n1": "sha256:aa", "n2": "sha256:bb", "n3": "sha256:aa", "n4": "sha256:cc"}
    assert mismatches(want, ids) == [
        "n2: image img:1 is another build: sha256:bb (on n1: sha256:aa)"
    ]
    assert mismatches(want, {**ids, "n2": "sha256:aa"}) == []


def test_run_refuses_an_unknown_runtime_before_anything() -> None:
    r = run_cli("run", "--dry-run", "--container-runtime", "lxc", "--image", "i", "t.py")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "fleetctl: error: unknown container runtime 'lxc' (known: podman, docker, apptainer)"
    ]
