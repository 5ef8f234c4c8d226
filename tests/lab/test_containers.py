"""``fleetctl run --image`` with podman on 3 lab hosts: ranks run in the image, a failing rank
ends every container of the job (verified by label on every node), a host without the image
fails the check before launch.

The image is built from Debian packages, no registry: ``mmdebstrap`` once per machine (the
tarball cached under /var/cache/fleetctl-ci/), then ``podman import``. Lab hosts share this
machine's image store (they are namespaces of one machine: same /var/lib/containers).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli, start_cli_process
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab

IMAGE = "fleetctl-test:py3"
TARBALL = Path("/var/cache/fleetctl-ci/fleetctl-test-py3.tar")

SHOW = """\
import os, sys
print("in-image", os.environ["FLEET_NODE_RANK"], sys.executable,
      open("/etc/os-release").read().split("PRETTY_NAME=")[1].splitlines()[0], flush=True)
"""
# rank 1 (node2) fails; the others ignore SIGTERM: only a kill, or the runtime, ends them
FAIL_ON_1 = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.environ["FLEET_NODE_RANK"] == "1":
    time.sleep(1.0)
    sys.exit(3)
time.sleep(120)
"""
SLEEP = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(120)
"""


def _podman(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> str:
    """The test image in this machine's store: imported from the cached tarball, built first
    when there is none (mmdebstrap from the Debian mirror)."""
    for tool in ("podman", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is not installed (apt-get install podman runc mmdebstrap)")
    if _podman("image", "exists", IMAGE).returncode == 0:
        return IMAGE
    if not TARBALL.exists():
        TARBALL.parent.mkdir(parents=True, exist_ok=True)
        part = TARBALL.with_suffix(".part.tar")
        built = subprocess.run(
            ["mmdebstrap", "--variant=apt", "--include=python3", "bookworm", str(part)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if built.returncode != 0:
            skip_or_fail(f"mmdebstrap could not build the image: {built.stderr.strip()[-300:]}")
        part.rename(TARBALL)
    got = _podman("import", str(TARBALL), IMAGE)
    assert got.returncode == 0, got.stderr
    return IMAGE


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab], image: str) -> Lab:
    return make_lab_module(3)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("code")
    (d / "show.py").write_text(SHOW)
    (d / "fail_on_1.py").write_text(FAIL_ON_1)
    (d / "sleep.py").write_text(SLEEP)
    return d


def run_args(inventory: Path, runs: Path, code: Path, *extra: str) -> list[str]:
    return [
        "run",
        "-i",
        str(inventory),
        "--launcher",
        "plain",
        "--grace",
        "2",
        "--runs-dir",
        str(runs),
        "--code-dir",
        str(code),
        *extra,
    ]


def run(inventory: Path, runs: Path, code: Path, *extra: str) -> CliResult:
    return run_cli(*run_args(inventory, runs, code, *extra), cwd=code)


def only_job(runs: Path) -> tuple[str, dict]:
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return folder.name, json.loads((folder / "job.json").read_text())


def containers_left(lab: Lab, job_id: str) -> dict[str, list[str]]:
    """Every container labelled with the job, as each node's podman lists it."""
    got = run_cli(
        "exec",
        "-i",
        str(lab.inventory_path),
        "--",
        "podman",
        "ps",
        "-a",
        "-q",
        "--filter",
        f"label=fleetctl.job={job_id}",
    )
    assert got.exit_code == 0, got.stderr
    left: dict[str, list[str]] = {}
    for line in got.stdout.splitlines():
        host, _, cid = line.partition(": ")
        if cid.strip():
            left.setdefault(host, []).append(cid.strip())
    return left


def test_ranks_run_in_the_image_on_every_host(lab: Lab, code: Path, tmp_path: Path) -> None:
    r = run(lab.inventory_path, tmp_path, code, "--image", IMAGE, "show.py")
    assert r.exit_code == 0, r.stderr
    job_id, job = only_job(tmp_path)
    assert job["status"] == "succeeded", job
    for rank, host in enumerate(("node1", "node2", "node3")):
        console = (tmp_path / job_id / f"{rank}-{host}" / "console.log").read_text()
        assert f"in-image {rank} /usr/bin/python3 " in console, console
        assert "Debian GNU/Linux 12 (bookworm)" in console, console
    plan = json.loads((tmp_path / job_id / "plan.json").read_text())
    assert {n["container"]["runtime"] for n in plan["nodes"]} == {"podman"}, plan
    assert containers_left(lab, job_id) == {}


def test_a_failing_rank_ends_every_container_of_the_job(
    lab: Lab, code: Path, tmp_path: Path
) -> None:
    r = run(lab.inventory_path, tmp_path, code, "--image", IMAGE, "fail_on_1.py")
    assert r.exit_code != 0
    job_id, job = only_job(tmp_path)
    assert job["status"] == "failed", job
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"], ff["state"], ff["exit_code"]) == (1, "node2", "failed", 3)
    assert [n["state"] for n in job["nodes"]] == ["stopped", "failed", "stopped"], job["nodes"]
    assert job["teardown"]["verified"] is True, job["teardown"]
    assert containers_left(lab, job_id) == {}


def test_a_host_without_the_image_fails_the_check(lab: Lab, code: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["children"]["nodes"]["hosts"]["node3"]["fleetctl_image"] = "fleetctl-test:absent"
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc))
    runs = tmp_path / "runs"
    r = run(inv, runs, code, "show.py")  # node1, node2: no image; node3: one it lacks
    assert r.exit_code == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "fleetctl: error: node3: image fleetctl-test:absent is not present (podman)"
    ), r.stderr
    assert "launching" not in r.stderr


@pytest.mark.parametrize("how", ["fleetctl stop", "ctrl-c"])
def test_a_stopped_run_ends_its_containers(lab: Lab, code: Path, tmp_path: Path, how: str) -> None:
    """Ranks that ignore SIGTERM, in containers, ended by ``fleetctl stop`` from another
    terminal or by Ctrl-C on the run: none of the job's containers is left on any node."""
    runs = tmp_path / "runs"
    proc = start_cli_process(
        *run_args(lab.inventory_path, runs, code, "--image", IMAGE, "sleep.py"),
        cwd=code,
        start_new_session=True,
    )

    def running_everywhere() -> str | None:
        for d in runs.glob("*") if runs.is_dir() else []:
            j = json.loads((d / "job.json").read_text()) if (d / "job.json").is_file() else {}
            if [n.get("state") for n in j.get("nodes", [])] == ["running"] * 3:
                return d.name
        return None

    try:
        job_id = wait_for(running_everywhere, 60, what="job running on all 3 nodes", interval=0.3)
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            stop = run_cli("stop", "--runs-dir", str(runs), job_id, "--grace", "1")
            assert stop.exit_code == 0, stop.stdout + stop.stderr
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode == 130, err
    job = json.loads((runs / job_id / "job.json").read_text())
    assert [n["state"] for n in job["nodes"]] == ["stopped"] * 3, job["nodes"]
    assert containers_left(lab, job_id) == {}
