"""A real torch DDP job in a container image on 3 lab hosts (issue 25's "a DDP job in an image"):
torchrun and gloo from the image's own Python and torch (``/usr/bin/python3``, torch in the
image's ``dist-packages``; the hosts' torch is not mounted), and a rank raising mid-training
ends every container and process of the job, blaming the raising rank. The hosts' python is
3.8 without torch (``fleetctl_python``): only the image's has it, and the check asks the image
for torchrun's module, not the host; an image without torch fails that check on every host.

The image is Debian bookworm plus the pinned CPU torch, built from packages
(``fleetctl.testing.images``: ~1 min once per machine, then cached).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli
from fleetctl.testing.containers import assert_nothing_left, built_or_skip, containers_left
from fleetctl.testing.images import BASE_IMAGE, base_image, torch_image
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
    return built_or_skip(torch_image)


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab], image: str) -> Lab:
    return make_lab_module(3)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("code")
    shutil.copy(EXAMPLES / "ddp_train.py", d / "ddp_train.py")
    (d / "in_image.py").write_text(IN_IMAGE)
    return d


@pytest.fixture(scope="module")
def host38(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab's inventory with every host's python the 3.8 one, which has no torch."""
    py38 = os.environ.get("FLEETCTL_PYTHON38", "")
    if not os.access(py38, os.X_OK):
        skip_or_fail(f"FLEETCTL_PYTHON38={py38!r} is not an executable python 3.8")
    doc = yaml.safe_load(lab.inventory_path.read_text())
    for host in doc["all"]["children"]["nodes"]["hosts"].values():
        host["fleetctl_python"] = py38
    inv = tmp_path_factory.mktemp("inv38") / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc))
    return inv


def run(
    lab: Lab, runs: Path, code: Path, image: str, *args: str, inv: Path | None = None
) -> CliResult:
    return run_cli(
        "run", "-i", str(inv or lab.inventory_path), "--launcher", "torchrun", "--image", image,
        "--runs-dir", str(runs), "--code-dir", str(code), "--grace", "2",
        "in_image.py", "--backend", "gloo", "--epochs", "2", "--steps", "4", *args,
        cwd=code,
    )  # fmt: skip


def only_job(runs: Path) -> tuple[Path, dict]:
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return folder, json.loads((folder / "job.json").read_text())


def rank_text(folder: Path, rank: int, host: str) -> str:
    node = folder / f"{rank}-{host}"
    return "\n".join(p.read_text(errors="replace") for p in sorted(node.rglob("*.log")))


def test_ddp_trains_on_the_images_torch_on_every_host(
    lab: Lab, code: Path, image: str, host38: Path, tmp_path: Path
) -> None:
    r = run(lab, tmp_path, code, image, inv=host38)
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
    assert containers_left(lab.inventory_path, folder.name) == {}


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
    assert_nothing_left(lab.inventory_path, folder.name)


def test_an_image_without_torch_fails_the_check_on_every_host(
    lab: Lab, code: Path, host38: Path, tmp_path: Path
) -> None:
    """torchrun in Debian's python3 image (no torch), the hosts' python without torch either:
    the check's one container per host fails the import, exit 3, one line naming each host and
    the image, before any push; no container of the image is left (the check's are ``--rm``)."""
    r = run(lab, tmp_path, code, built_or_skip(base_image), inv=host38)
    assert r.exit_code == 3, r.stderr[-3000:]
    why = f"cannot import torch.distributed.run in image {BASE_IMAGE} (python3): "
    why += "ModuleNotFoundError: No module named 'torch'"
    assert r.stderr.strip().splitlines()[-1] == "fleetctl: error: " + "; ".join(
        f"{h}: {why}" for h in ("node1", "node2", "node3")
    ), r.stderr[-3000:]
    assert "pushing" not in r.stderr and "launching" not in r.stderr, r.stderr[-3000:]
    got = run_cli(
        "exec", "-i", str(lab.inventory_path), "--",
        "podman", "ps", "-a", "-q", "--filter", f"ancestor={BASE_IMAGE}",
    )  # fmt: skip
    assert got.exit_code == 0, got.stderr
    assert [ln for ln in got.stdout.splitlines() if ln.partition(": ")[2].strip()] == []
