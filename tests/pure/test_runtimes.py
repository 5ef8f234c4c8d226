"""Golden argv for the container runtimes: one JSON file per case in runtime_cases/.

Each case names a runtime, a ``ContainerSpec``, the launcher argv, a stop grace and container
ids, and the exact argv expected of every builder (written by hand; ``null`` where the runtime
has no such command).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fleetctl.api.runspec import Container
from fleetctl.errors import PlanError, UsageError
from fleetctl.node import Node
from fleetctl.phases.check.image import (
    ImageWant,
    mismatches,
    parse,
    script,
    uses_gpus,
    wanted,
)
from fleetctl.plan.rankplan import JobSpec, NodeFacts, NodePlan, make_plan
from fleetctl.plan.roles.jobfile import parse_job_file
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
        "probe": rt.probe_argv(spec.image, spec.gpus),  # the launch's GPU flags too
        "image_id": rt.image_id_argv(spec.image),
        "list": rt.list_argv(spec.job_id, spec.node_rank),
        "stop": rt.stop_argv(case["ids"], case["grace"]),
        "remove": rt.remove_argv(case["ids"]),
        "pid": rt.pid_argv(spec.name),
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
    spec = JobSpec(script="t.py", job_id="j1", launcher="plain", procs=1)
    plan = make_plan(nodes, spec)
    assert [n.container for n in plan.nodes] == [
        {"image": "a", "runtime": None, "gpus": False, "timeout": 30.0},
        {"image": "a", "runtime": None, "gpus": False, "timeout": 30.0},
    ]
    assert [n.argv[0] for n in plan.nodes] == ["python3", "/opt/conda/bin/python"]
    plan = make_plan(
        nodes, replace(spec, container=Container(image="b", container_runtime="docker"))
    )
    assert {n.container["image"] for n in plan.nodes if n.container} == {"b"}
    assert plan.nodes[0].to_dict()["container"]["runtime"] == "docker"
    assert NodePlan.from_dict(plan.nodes[0].to_dict()).container == plan.nodes[0].container
    assert make_plan([_node("n1")], spec).nodes[0].container is None


def test_a_runtime_name_is_checked_naming_the_host() -> None:
    spec = JobSpec(script="t.py", job_id="j1", launcher="plain", procs=1)
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
    got = parse(stdout, ImageWant("img:1"))
    assert (got.runtime, got.image_id, got.problem) == want


def test_the_check_script_runs_in_sh(tmp_path: Path) -> None:
    """The node's side with a fake podman on PATH: the real shell, the real lines."""
    fake = tmp_path / "podman"
    fake.write_text('#!/bin/sh\n[ "$1" = image ] && { echo sha256:ff; exit 0; }\nexit 0\n')
    fake.chmod(0o755)
    out = subprocess.run(
        ["sh", "-c", script(ImageWant("img:1", "podman"))],
        capture_output=True,
        text=True,
        env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
        timeout=30,
    )
    assert out.stdout.splitlines() == ["runtime podman", "image sha256:ff", "probe 0 "]


@pytest.mark.parametrize(
    ("hangs_at", "said", "words"),
    [
        ("image", "hung image", "did not say the id of image img:1 within 30 s"),
        ("run", "hung probe", "did not start a container of img:1 within 100 s"),
    ],
)
def test_a_hung_runtime_is_said_in_time_and_its_client_killed(
    tmp_path: Path, hangs_at: str, said: str, words: str
) -> None:
    """A runtime that never answers (a stuck storage lock): the node's script ends at its own
    limit (1 s here), kills the client, and says which call hung; the check names it."""
    fake = tmp_path / "podman"
    fake.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = {hangs_at} ] && {{ echo $$ > {tmp_path}/pid; exec sleep 600; }}\n'
        '[ "$1" = image ] && { echo sha256:ff; exit 0; }\nexit 0\n'
    )
    fake.chmod(0o755)
    t0 = time.monotonic()
    out = subprocess.run(
        ["sh", "-c", script(ImageWant("img:1", "podman"), None, id_timeout=1, container_timeout=1)],
        capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}, timeout=30,
    )  # fmt: skip
    assert time.monotonic() - t0 < 15
    assert out.stdout.splitlines()[-1] == said, out.stdout + out.stderr
    problem = parse(out.stdout, ImageWant("img:1", "podman")).problem
    assert problem is not None and words in problem and "podman" in problem
    pid = int((tmp_path / "pid").read_text())
    assert not Path(f"/proc/{pid}").exists()  # the hung client did not outlive the check


def test_an_image_id_that_started_here_is_not_probed_again(tmp_path: Path) -> None:
    """The trivial container costs a whole start: once one of this id started with this
    runtime, the node's marker skips it (a failed start leaves none; another id is probed)."""
    from fleetctl.phases.check.image import shell_dir

    fake = tmp_path / "bin" / "podman"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1" = image ] && { cat "$FAKE_ID"; exit 0; }\n'
        'echo run >>"$FAKE_LOG"; exit "$(cat "$FAKE_RC")"\n'
    )
    fake.chmod(0o755)
    home, log, rc, fid = tmp_path / "home", tmp_path / "log", tmp_path / "rc", tmp_path / "id"
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "HOME": str(home), "FAKE_LOG": str(log)}
    env |= {"FAKE_RC": str(rc), "FAKE_ID": str(fid)}
    marks = shell_dir("~/.fleetctl/containers/started")

    def check(image_id: str, code: int) -> list[str]:
        fid.write_text(image_id + "\n")
        rc.write_text(str(code))
        out = subprocess.run(
            ["sh", "-c", script(ImageWant("img:1", "podman"), marks)],
            capture_output=True, text=True, env=env, timeout=30,
        )  # fmt: skip
        return out.stdout.splitlines()[2:]

    assert check("sha256:aa", 125) == ["probe 125 "]  # failed: no marker
    assert check("sha256:aa", 0) == ["probe 0 "]
    assert check("sha256:aa", 125) == ["probe 0 cached"]  # not started again
    assert check("sha256:bb", 0) == ["probe 0 "]  # another build: probed
    assert log.read_text().splitlines() == ["run"] * 3  # the start probes, no more
    started = home / ".fleetctl" / "containers" / "started"
    assert sorted(p.name for p in started.iterdir()) == ["podman-sha256_aa", "podman-sha256_bb"]
    assert (
        parse("runtime podman\nimage sha256:aa\nprobe 0 cached\n", ImageWant("img:1")).problem
        is None
    )


def test_another_build_is_named_with_both_ids() -> None:
    want = {h: ImageWant("img:1") for h in ("n1", "n2", "n3")} | {"n4": ImageWant("other")}
    ids = {"n1": "sha256:aa", "n2": "sha256:bb", "n3": "sha256:aa", "n4": "sha256:cc"}
    assert mismatches(want, ids) == [
        "n2: image img:1 is another build: sha256:bb (on n1: sha256:aa)"
    ]
    assert mismatches(want, {**ids, "n2": "sha256:aa"}) == []


def test_run_refuses_an_unknown_runtime_before_anything() -> None:
    r = run_cli("run", "--dry-run", "--container-runtime", "lxc", "--image", "i", "t.py")
    assert r.exit_code == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "fleetctl: error: Invalid value for '--container-runtime': unknown container runtime "
        "'lxc' (known: podman, docker, apptainer)"
    ]


ROLE_JOB = (
    "image: reg.example/train:a\ncontainer_runtime: docker\n"
    "roles:\n  server: {command: python3 s.py, instances: 1}\n  worker: {script: w.py}\n"
)


def _role_dry_run(tmp_path: Path, text: str, *extra: str) -> list[dict]:
    """The containers of a role job's dry-run plan, node by node."""
    (tmp_path / "w.py").write_text("")
    (tmp_path / "job.yml").write_text(text)
    inv = tmp_path / "hosts.ini"
    inv.write_text("[all]\nn1 ansible_host=10.0.0.1\nn2 ansible_host=10.0.0.2\n")
    r = run_cli(
        "run", "-i", str(inv), "--job", "job.yml", "--dry-run", "--json", "--full", *extra,
        cwd=tmp_path,
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    return [n.get("container") for n in json.loads(r.stdout)["nodes"]]


def test_a_role_job_runs_in_its_job_files_image(tmp_path: Path) -> None:
    """``image:`` and ``container_runtime:`` of the job file: every role's nodes in it (each
    runtime call at teardown bounded by ``--runtime-timeout``'s default)."""
    want = {"image": "reg.example/train:a", "runtime": "docker", "gpus": False, "timeout": 30.0}
    assert _role_dry_run(tmp_path, ROLE_JOB) == [want, want]


def test_the_command_line_wins_over_the_job_files_image(tmp_path: Path) -> None:
    extra = ("--image", "mine:b", "--container-runtime", "podman", "--runtime-timeout", "7")
    got = _role_dry_run(tmp_path, ROLE_JOB, *extra)
    assert got == [{"image": "mine:b", "runtime": "podman", "gpus": False, "timeout": 7.0}] * 2


def test_a_role_job_without_an_image_runs_on_the_hosts(tmp_path: Path) -> None:
    text = "roles:\n  server: {command: python3 s.py, instances: 1}\n  worker: {script: w.py}\n"
    assert _role_dry_run(tmp_path, text) == [None, None]


def test_an_unknown_runtime_in_the_job_file_is_named_with_its_line() -> None:
    with pytest.raises(UsageError, match=r"^job.yml:2: unknown container runtime 'lxc' \(known: "):
        parse_job_file("image: x\ncontainer_runtime: lxc\nroles:\n  w: {script: w.py}\n")


@pytest.mark.parametrize(
    ("gpu_ids", "facts", "backend", "want"),
    [
        ((), None, None, False),  # no GPU anywhere
        (("0", "1"), None, None, True),  # the inventory lists GPUs (fleetctl_gpus)
        ((), NodeFacts(gpu_count=8), None, True),  # the check found some
        ((), NodeFacts(gpu_count=0), "nccl", False),
        (("0",), None, "gloo", False),  # a gloo job needs no NCCL
    ],
)
def test_nccl_is_looked_for_in_the_image_only_where_the_job_uses_gpus(
    gpu_ids: tuple, facts: NodeFacts | None, backend: str | None, want: bool
) -> None:
    n = replace(
        _node("n1", fleetctl_image="img:1", fleetctl_image_python="/opt/py/bin/python3"),
        gpu_ids=gpu_ids,
    )
    assert uses_gpus(n, facts, backend) is want
    spec = JobSpec(script="t.py", job_id="j1", backend=backend)
    got = wanted([n], spec, {"n1": facts} if facts else None)
    py = "/opt/py/bin/python3" if want else None
    has_gpus = bool(gpu_ids) or bool(facts and facts.gpu_count)  # the trial gets them anyway
    assert got == {"n1": ImageWant("img:1", None, py, None, want, has_gpus)}


def test_push_image_takes_the_container_group_and_refuses_before_any_host(tmp_path: Path) -> None:
    """``Fleet.push_image`` takes RunSpec's ``Container`` group (its image, its runtime) or, as
    before, a name with ``container_runtime=``; ``push --image`` builds the group from its
    options. A bad call is one UsageError before any host is dialled (192.0.2.1: TEST-NET)."""
    from fleetctl.api.fleet import Fleet

    inv = tmp_path / "hosts.ini"
    inv.write_text("[all]\nn1 ansible_host=192.0.2.1\n")
    fleet = Fleet.from_inventory(str(inv))
    with pytest.raises(UsageError, match="names no image"):
        fleet.push_image(Container(container_runtime="docker"))
    with pytest.raises(UsageError, match="carries its runtime"):
        fleet.push_image(Container(image="x:1"), container_runtime="docker")
    cannot = r"^--image push: apptainer images cannot be saved and loaded"
    for call in (
        lambda: fleet.push_image("x:1", container_runtime="apptainer"),
        lambda: fleet.push_image(Container(image="x:1", container_runtime="apptainer")),
    ):
        with pytest.raises(UsageError, match=cannot):
            call()
    with pytest.raises(UsageError, match=r"^Invalid value for '--image'"):
        fleet.push_image("-x")
    r = run_cli("push", "-i", str(inv), "--image", "fleetctl-none:absent", "--container-runtime",
                "docker")  # fmt: skip
    assert r.exit_code == 2, r.stderr
    assert re.search(r"docker( is not installed|\)$)", r.stderr.strip()), r.stderr
    r = run_cli("push", "-i", str(inv), "--image", "x:1", "--container-runtime", "apptainer")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "apptainer images cannot be saved and loaded" in r.stderr


def test_push_image_options_are_runs_the_container_groups() -> None:
    """``push --image``/``--container-runtime`` are made from RunSpec's Container fields, as
    ``run``'s are: the same flags, help, metavar and check."""
    from fleetctl.cli import cli

    def options(command: str) -> dict[str, tuple]:
        params = cli.commands[command].params  # type: ignore[attr-defined]
        return {
            p.name: (p.opts, p.help, p.metavar, type(p.type).__name__)
            for p in params
            if p.name in ("image", "container_runtime")
        }

    assert options("push") == options("run") and len(options("push")) == 2


def test_a_nodes_runtime_is_the_groups_else_its_inventorys() -> None:
    """``Container.runtime_for``: what the plan, the image check and ``push --image`` ask."""
    box = Container(image="x:1")
    docker = _node("n1", fleetctl_container_runtime="docker")
    assert box.runtime_for(docker) == "docker"
    assert replace(box, container_runtime="podman").runtime_for(docker) == "podman"
    assert box.runtime_for(_node("n2")) is None
