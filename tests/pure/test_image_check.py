"""Issue 25: with ``--image`` the launcher runs on the image's python, so the check asks the
image, not the host. The host probe imports no launcher module and looks up no torch on an
image node (its python only runs the supervisor); ONE throwaway container runs the image's
python with ``remote/programs/image_probe.py`` (the launcher imported for real, torch's version,
NCCL where the job uses GPUs), its passing answer kept on the node per runtime, image id, python
and module, never a failure. Here: what is asked, the node's script under ``sh`` with a fake
podman that runs the real program, what each answer means, and the facts the plan gets."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fleetctl.api.runspec import Container
from fleetctl.node import Node
from fleetctl.phases.check.image import (
    ImageFacts,
    ImageWant,
    entry,
    parse,
    script,
    shell_dir,
    wanted,
    with_image_torch,
)
from fleetctl.phases.check.preflight import CheckOptions, probe_args
from fleetctl.plan.rankplan import JobSpec, NodeFacts, make_plan

IMG = "img:1"
BOX = Container(image=IMG)


def _node(name: str, **vars: object) -> Node:
    return Node(name=name, address=f"10.0.0.{name[-1]}", vars=vars)


TR = "torch.distributed.run"


@pytest.mark.parametrize(
    ("launcher", "script_", "gpus", "want"),
    [
        ("torchrun", "t.py", 0, ImageWant(IMG, None, "python3", TR)),
        ("deepspeed", "t.py", 0, ImageWant(IMG, None, "python3", "deepspeed.launcher.runner")),
        ("plain", "t.py", 0, ImageWant(IMG, None, "python3")),  # the python must exist
        ("plain", "run.sh", 0, ImageWant(IMG)),  # `bash run.sh`: no python, a `true` start
        ("plain", "run.sh", 2, ImageWant(IMG, None, "python3", None, True, True)),  # NCCL
        ("torchrun", "t.py", 2, ImageWant(IMG, None, "python3", TR, True, True)),
    ],
)
def test_the_image_check_asks_what_the_launcher_needs(
    launcher: str, script_: str, gpus: int, want: ImageWant
) -> None:
    spec = JobSpec(script=script_, job_id="j1", launcher=launcher, container=BOX, backend="nccl")
    module, python = entry(spec)
    node = Node(name="n1", address="10.0.0.1", gpus=gpus, vars={"fleetctl_image_python": "py"})
    got = wanted([node, _node("n2")], spec, module=module, python=python)
    assert got["n2"] == want if not gpus else got["n2"] == ImageWant(IMG, None, *_host(want))
    assert got["n1"] == (replace(want, python="py") if want.python else want)


def test_a_gloo_job_on_gpu_nodes_gets_the_gpus_in_the_trial_but_asks_no_nccl() -> None:
    """The trial container has the launch's GPU flags wherever the plan hands the node's GPUs
    to the container (a gloo job's too); NCCL is looked for only where the collectives use it."""
    spec = JobSpec(script="run.sh", job_id="j1", launcher="plain", container=BOX, backend="gloo")
    module, python = entry(spec)
    node = Node(name="n1", address="10.0.0.1", gpus=2)
    got = wanted([node], spec, module=module, python=python)
    assert got["n1"] == ImageWant(IMG, None, None, None, False, True)
    assert "--device nvidia.com/gpu=all" in script(ImageWant(IMG, "podman", gpus=True))
    assert "nvidia.com/gpu" not in script(ImageWant(IMG, "podman"))
    assert ImageWant(IMG, gpus=True).key() != ImageWant(IMG).key()


def _host(want: ImageWant) -> tuple:
    """What a node without GPUs asks of the same job: no NCCL, a python only for a module."""
    return ("python3" if want.module else None, want.module, False)


def test_the_host_probe_of_an_image_node_imports_no_launcher() -> None:
    """The host's python (3.8, no torch) only runs the supervisor on an image node: the probe
    neither imports torchrun's module nor looks up torch there; a host node still does."""
    opts = CheckOptions(
        launcher_module="torch.distributed.run", torch_version=True, container_hosts=("n1",)
    )

    def args(name: str) -> tuple:
        a = probe_args(
            _node(name), is_master=False, options=opts, mesh=False, allow_loopback=True,
            mesh_wait=1.0,
        )  # fmt: skip
        return a["launcher_module"], a["torch_version"]

    assert args("n1") == (None, False)
    assert args("n2") == ("torch.distributed.run", True)


def _frame(**data: object) -> str:
    return "D " + json.dumps(data, sort_keys=True)


TORCHRUN = ImageWant(IMG, "podman", "python3", "torch.distributed.run")
ON_GPUS = ImageWant(IMG, "podman", "python3", "torch.distributed.run", True, True)
NO_NCCL = (
    f"image {IMG} has no NCCL (no libnccl in it; the job uses GPUs): use an image with NCCL "
    "(torch's CUDA wheels carry it), or --backend gloo"
)
NO_CDI = "Error: setting up CDI devices: unresolvable CDI devices nvidia.com/gpu=all"
NO_MODULE = "ModuleNotFoundError: No module named 'torch'"


@pytest.mark.parametrize(
    ("want", "probe", "problem", "torch"),
    [
        (TORCHRUN, _frame(module="torch.distributed.run", version="2.13.0", torch="2.13.0"),
         None, "2.13.0"),
        (TORCHRUN, "3 " + _frame(module="torch.distributed.run", error=NO_MODULE, torch=""),
         f"cannot import torch.distributed.run in image {IMG} (python3): {NO_MODULE}", None),
        (ON_GPUS, _frame(module="m", version="", torch="2.13.0", nccl="/usr/lib/libnccl.so.2"),
         None, "2.13.0"),
        (ON_GPUS, "3 " + _frame(module="m", version="", torch="2.13.0", nccl="-"), NO_NCCL, None),
        (ON_GPUS, f"126 {NO_CDI}",
         f"podman cannot start a container of {IMG} (python3): {NO_CDI} (no CDI spec for the "
         "node's GPUs: on the node, `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` "
         "from the NVIDIA Container Toolkit; or --backend gloo and no GPUs)", None),
        (replace(ON_GPUS, runtime="docker"),
         "125 docker: Error response from daemon: could not select device driver \"\" with "
         "capabilities: [[gpu]].",
         f"docker cannot start a container of {IMG} (python3): docker: Error response from "
         "daemon: could not select device driver \"\" with capabilities: [[gpu]]. (the runtime "
         "has no NVIDIA hook: install the NVIDIA Container Toolkit and run `nvidia-ctk runtime "
         "configure` on the node)", None),
        (TORCHRUN, f"126 {NO_CDI}",  # no GPUs asked: no hint (the runtime's words only)
         f"podman cannot start a container of {IMG} (python3): {NO_CDI}", None),
        (TORCHRUN, "127 Error: executable file `python3` not found in $PATH",
         f"podman cannot start a container of {IMG} (python3): Error: executable file "
         "`python3` not found in $PATH", None),
        (TORCHRUN, "0 ", f"podman cannot start a container of {IMG} (python3)", None),
        (ImageWant(IMG, "podman"), "0 cached", None, None),  # `true`: nothing to tell
    ],
)  # fmt: skip
def test_what_the_image_probe_says(
    want: ImageWant, probe: str, problem: str | None, torch: str | None
) -> None:
    if probe.startswith("D "):
        probe = "0 " + probe
    got = parse(f"runtime {want.runtime}\nimage sha256:aa\nprobe {probe}\n", want)
    assert (got.image_id, got.problem) == ("sha256:aa", problem)
    if problem is None:
        assert got.torch == torch


# `podman run --rm --network host IMAGE ARGV...`: counts the start, then runs ARGV here
FAKE_PODMAN = (
    "#!/bin/sh\n"
    '[ "$1" = image ] && { echo sha256:aa; exit 0; }\n'
    'echo run >>"$FAKE_LOG"\n'
    "shift 5\n"
    'exec "$@"\n'
)


@pytest.fixture
def node_sh(tmp_path: Path):
    fake = tmp_path / "bin" / "podman"
    fake.parent.mkdir()
    fake.write_text(FAKE_PODMAN)
    fake.chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin", "HOME": str(tmp_path), "FAKE_LOG": str(log)}

    def run(want: ImageWant, marks: str | None, extra: dict | None = None) -> tuple[str, int]:
        before = len(log.read_text().splitlines()) if log.exists() else 0
        out = subprocess.run(
            ["sh", "-c", script(want, marks)], capture_output=True, text=True,
            env={**env, **(extra or {})}, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        started = len(log.read_text().splitlines()) - before if log.exists() else 0
        return out.stdout, started

    return run


def test_one_container_runs_the_launcher_import_and_a_pass_is_kept(node_sh, tmp_path: Path) -> None:
    """One container per check, the real program in it; a passing answer is kept on the node
    (the next check starts none), a failing one never; another module, python or ``--recheck``
    asks again."""
    marks = shell_dir("~/.fleetctl/containers/started")
    py = sys.executable  # the "image's" python
    ok = ImageWant(IMG, "podman", py, "json.decoder")
    out, started = node_sh(ok, marks)
    assert started == 1
    assert parse(out, ok) == ImageFacts("podman", "sha256:aa", None, parse(out, ok).torch)
    assert node_sh(ok, marks) == (out, 0)  # kept: no container
    assert node_sh(ok, None)[1] == 1  # --recheck

    bad = ImageWant(IMG, "podman", py, "no_such_pkg_25.run")
    for _ in range(2):  # a failure is not kept
        out, started = node_sh(bad, marks)
        assert started == 1
        assert parse(out, bad).problem == (
            f"cannot import no_such_pkg_25.run in image {IMG} ({py}): "
            "ModuleNotFoundError: No module named 'no_such_pkg_25'"
        )
    kept = sorted(p.name for p in (tmp_path / ".fleetctl/containers/started").iterdir())
    assert kept == [f"podman-sha256_aa-{ok.key()}"]
    assert ok.key() != bad.key() != ImageWant(IMG, "podman", "python3", "json.decoder").key()


def test_nccl_is_looked_for_in_the_same_container(node_sh, tmp_path: Path) -> None:
    """pip's ``nvidia/nccl/lib`` on the image python's path: found, in the one container; an
    image without it fails the check, and that is not kept either."""
    lib = tmp_path / "site" / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    want = ImageWant(IMG, "podman", sys.executable, None, True)
    marks = shell_dir("~/.fleetctl/containers/started")
    out, started = node_sh(want, marks, {"PYTHONPATH": str(tmp_path / "site")})
    assert (started, parse(out, want).problem) == (1, None)
    assert f'"nccl": "{lib / "libnccl.so.2"}"' in out
    (lib / "libnccl.so.2").unlink()
    out, started = node_sh(want, None, {"LD_LIBRARY_PATH": ""})
    if parse(out, want).problem is not None:  # this machine's loader may know a libnccl
        assert parse(out, want).problem == (NO_NCCL)


def test_the_program_is_sent_once_whichever_runtime_runs_it() -> None:
    text = script(TORCHRUN)
    assert text.count("fleetctl-image_probe.py") == 1
    assert text.count('python3 -c "$src" ') == 3  # podman, docker, apptainer


def test_a_job_without_python_starts_only_true() -> None:
    text = script(ImageWant(IMG, "podman"))
    assert "probe() { b 100 podman run --rm --network host img:1 true; }" in text
    assert "image_probe" not in text and " -c " not in text


def test_image_nodes_get_the_images_torch_for_the_plan() -> None:
    """The host's python has torch 2.6 (old flight-recorder name) but the job runs on the
    image's 2.13: the plan names the variable by the image's."""
    nodes = [Node(name=f"g{i}", address=f"10.0.0.{i}", gpus=2) for i in (1, 2)]
    host = {n.name: NodeFacts(gpu_count=2, torch="2.6.0") for n in nodes}
    found = {"g1": ImageFacts("podman", "sha256:aa", torch="2.13.0")}
    facts = with_image_torch(host, found)
    assert (facts["g1"].torch, facts["g1"].gpu_count, facts["g2"].torch) == ("2.13.0", 2, "2.6.0")
    spec = JobSpec(script="t.py", job_id="j1", launcher="plain", backend="nccl")
    plan = make_plan(nodes, spec, facts=facts)
    assert "TORCH_FR_BUFFER_SIZE" in plan.nodes[0].env
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in plan.nodes[1].env
    assert with_image_torch({}, {"g1": ImageFacts("podman", "sha256:aa")}) == {}
