"""A real torch DDP job in a container image on 3 lab hosts (issue 25's "a DDP job in an image"):
torchrun and gloo from the image's own Python and torch (``/usr/bin/python3``, torch in the
image's ``dist-packages``; the hosts' torch is not mounted), and a rank raising mid-training
ends every container and process of the job, blaming the raising rank.

The image is Debian bookworm plus the pinned CPU torch, built from packages
(``fleetctl.testing.images``: ~1 min once per machine, then cached).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import CliResult, run_cli
from fleetctl.testing.images import ImageUnavailable, torch_image
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.testing.pytest_plugin import skip_or_fail

pytestmark = pytest.mark.lab

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# says whose torch and python run the rank, then trains as examples/ddp_train.py
IN_IMAGE = """\
import runpy, sys
import torch
print(f"torch-from {torch.__file__} {torch.__version__} {sys.executable}", flush=True)
sys.argv = ["ddp_train.py", *sys.argv[1:]]
runpy.run_path("ddp_train.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def image() -> str:
    try:
        return torch_image()
    except ImageUnavailable as e:
        skip_or_fail(str(e))


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab], image: str) -> Lab:
    return make_lab_module(3)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("code")
    shutil.copy(EXAMPLES / "ddp_train.py", d / "ddp_train.py")
    (d / "in_image.py").write_text(IN_IMAGE)
    return d


def run(lab: Lab, runs: Path, code: Path, image: str, *args: str) -> CliResult:
    return run_cli(
        "run", "-i", str(lab.inventory_path), "--launcher", "torchrun", "--image", image,
        "--runs-dir", str(runs), "--code-dir", str(code), "--grace", "2",
        "in_image.py", "--backend", "gloo", "--epochs", "2", "--steps", "4", *args,
        cwd=code,
    )  # fmt: skip


def only_job(runs: Path) -> tuple[Path, dict]:
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return folder, json.loads((folder / "job.json").read_text())


def job_containers(lab: Lab, job_id: str) -> list[str]:
    """The job's containers, by label, as each node's podman lists them (a lab host keeps its
    runtime state in its own namespaces: this machine's podman would not see them)."""
    got = run_cli(
        "exec", "-i", str(lab.inventory_path), "--",
        "podman", "ps", "-a", "-q", "--filter", f"label=fleetctl.job={job_id}",
    )  # fmt: skip
    assert got.exit_code == 0, got.stderr
    return [line for line in got.stdout.splitlines() if line.partition(": ")[2].strip()]


def rank_text(folder: Path, rank: int, host: str) -> str:
    node = folder / f"{rank}-{host}"
    return "\n".join(p.read_text(errors="replace") for p in sorted(node.rglob("*.log")))


def test_ddp_trains_on_the_images_torch_on_every_host(
    lab: Lab, code: Path, image: str, tmp_path: Path
) -> None:
    r = run(lab, tmp_path, code, image)
    assert r.exit_code == 0, r.stderr[-3000:]
    folder, job = only_job(tmp_path)
    assert job["status"] == "succeeded", job
    for rank, host in enumerate(("node1", "node2", "node3")):
        text = rank_text(folder, rank, host)
        where = "/usr/local/lib/python3.11/dist-packages/torch/__init__.py 2.13.0+cpu"
        assert f"torch-from {where} /usr/bin/python3" in text, text[-2000:]
        assert f"done rank={rank} world=3 " in text, text[-2000:]
    plan = json.loads((folder / "plan.json").read_text())
    assert {n["container"]["image"] for n in plan["nodes"]} == {image}, plan["nodes"]
    assert job_containers(lab, folder.name) == []


def test_a_rank_raising_in_ddp_ends_every_container_and_is_blamed(
    lab: Lab, code: Path, image: str, tmp_path: Path
) -> None:
    r = run(lab, tmp_path, code, image, "--fail-rank", "1", "--fail-step", "2")
    assert r.exit_code == 3, r.stderr[-3000:]
    folder, job = only_job(tmp_path)
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"]) == (1, "node2"), ff
    assert "intentional failure at rank 1 step 2" in r.stderr, r.stderr[-3000:]
    assert job["teardown"]["verified"] is True, job["teardown"]
    assert job_containers(lab, folder.name) == []
    for node in load_inventory(str(lab.inventory_path)).nodes:
        left = node_leftovers(
            node_host(node), folder.name, workdir=node.workdir, python=node.python
        )
        assert not left.processes, left.describe()
