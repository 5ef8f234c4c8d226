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
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import CliResult, run_cli, start_cli_process
from fleetctl.testing.images import BASE_IMAGE, BASE_TARBALL, ImageUnavailable, base_image
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab

IMAGE = BASE_IMAGE
TARBALL = BASE_TARBALL

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

# hangs where a stack dump must find it; a handler, not SIG_IGN (a job that ignores the stop)
HANG = """\
import os, signal, time
print(f"hanging rank={os.environ['FLEET_NODE_RANK']}", flush=True)
def silently_waiting():
    time.sleep(600)
silently_waiting()
"""


def _podman(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def image() -> str:
    """The test image in this machine's store: imported from the cached tarball, built first
    when there is none (mmdebstrap from the Debian mirror)."""
    try:
        return base_image()
    except ImageUnavailable as e:
        skip_or_fail(str(e))


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab], image: str) -> Lab:
    return make_lab_module(3)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("code")
    (d / "show.py").write_text(SHOW)
    (d / "fail_on_1.py").write_text(FAIL_ON_1)
    (d / "sleep.py").write_text(SLEEP)
    (d / "hang.py").write_text(HANG)
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


def on_node(lab: Lab, host: str, script: str) -> str:
    """``sh -c script`` on one lab host (``fleetctl exec --limit``): its output, host prefix off."""
    got = run_cli("exec", "-i", str(lab.inventory_path), "--limit", host, "--", "sh", "-c", script)
    assert got.exit_code == 0, got.stdout + got.stderr
    return "\n".join(line.partition(": ")[2] for line in got.stdout.splitlines())


def node_record(lab: Lab, job_id: str, rank: int, host: str, name: str) -> dict:
    """A JSON file of the job's node run folder on ``host`` ({} while there is none)."""
    (node,) = [n for n in load_inventory(str(lab.inventory_path)).nodes if n.name == host]
    path = f"{node.workdir.rstrip('/')}/runs/{job_id}/{rank}-{host}/{name}"
    return json.loads(on_node(lab, host, f"cat {path} 2>/dev/null || echo '{{}}'"))


def job_processes_left(lab: Lab, job_id: str) -> dict:
    """host -> processes of the job still alive (found by their env tag, container or not)."""
    out = {}
    for node in load_inventory(str(lab.inventory_path)).nodes:
        left = node_leftovers(node_host(node), job_id, workdir=node.workdir, python=node.python)
        if left.processes:
            out[node.name] = left.processes
    return out


def running_everywhere(runs: Path) -> str | None:
    """The job id once job.json says it runs on all 3 nodes."""
    for d in runs.glob("*") if runs.is_dir() else []:
        j = json.loads((d / "job.json").read_text()) if (d / "job.json").is_file() else {}
        if [n.get("state") for n in j.get("nodes", [])] == ["running"] * 3:
            return d.name
    return None


def start_sleeping_job(lab: Lab, runs: Path, code: Path, *extra: str) -> tuple:
    """(the controller's process, job id) once the SIGTERM-ignoring job runs on all 3 nodes."""
    proc = start_cli_process(
        *run_args(lab.inventory_path, runs, code, "--image", IMAGE, *extra),
        "sleep.py",
        cwd=code,
        start_new_session=True,
    )
    try:
        job_id = wait_for(
            lambda: running_everywhere(runs) or proc.poll() is not None,
            60,
            what="job running on all 3 nodes",
            interval=0.3,
        )
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        raise
    if proc.poll() is not None:
        raise AssertionError(proc.communicate())
    return proc, job_id


def test_a_killed_supervisor_leaves_no_container(lab: Lab, code: Path, tmp_path: Path) -> None:
    """node2's supervisor SIGKILLed mid-run (its container's main process ignores SIGTERM):
    the container guard started with it stops and removes the job's container there; the
    controller loses node2 and tears the others down; nothing of the job is left anywhere."""
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code, "--lost-timeout", "4")
    try:
        pid = node_record(lab, job_id, 1, "node2", "supervisor.json")["supervisor_pid"]
        on_node(lab, "node2", f"kill -KILL {int(pid)}")
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode != 0, err
    guard = wait_for(
        lambda: node_record(lab, job_id, 1, "node2", "container-guard.json"),
        30,
        what="node2's container guard ended the job's container",
    )
    assert len(guard["containers"]["found"]) == 1, guard
    assert guard["containers"]["problem"] is None, guard
    assert containers_left(lab, job_id) == {}
    assert job_processes_left(lab, job_id) == {}


def test_a_killed_controller_leaves_no_container(lab: Lab, code: Path, tmp_path: Path) -> None:
    """The controller SIGKILLed: every supervisor's dead-man switch ends its job, container
    (main process ignoring SIGTERM) included; the guards have nothing left to do."""
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)
    wait_for(lambda: containers_left(lab, job_id) == {}, 60, what="no container of the job")
    wait_for(lambda: job_processes_left(lab, job_id) == {}, 30, what="no process of the job")
    for rank, host in enumerate(("node1", "node2", "node3")):
        state = wait_for(
            lambda r=rank, h=host: (
                node_record(lab, job_id, r, h, "supervisor.json").get("end_time")
                and node_record(lab, job_id, r, h, "supervisor.json")
            ),
            30,
            what=f"{host}'s supervisor ended",
        )
        assert state["containers"]["problem"] is None, state
        assert node_record(lab, job_id, rank, host, "container-guard.json") == {}


def test_a_stalled_job_in_containers_gets_every_ranks_stack(
    lab: Lab, code: Path, tmp_path: Path
) -> None:
    """``--stall-timeout``: the ranks hang inside their containers (pids of the host, children
    of conmon, not of the supervisor): py-spy on the host dumps each one before the teardown,
    and ``ranks.json`` names each rank's pid."""
    r = run(lab.inventory_path, tmp_path, code, "--image", IMAGE, "--stall-timeout", "4", "hang.py")
    assert r.exit_code != 0
    job_id, job = only_job(tmp_path)
    assert job["verdict"].startswith("stalled: no progress on any node for "), job["verdict"]
    [group] = job["stacks"]
    assert group["ranks"] == [0, 1, 2], job["stacks"]
    assert group["frame"].startswith("silently_waiting (hang.py:"), group
    assert [n["methods"] for n in job["stack_nodes"]] == [{"py-spy": 1}] * 3
    # each rank's pid: found under its container's main process (conmon's child, not ours)
    ranks = json.loads((tmp_path / job_id / "ranks.json").read_text())["ranks"]
    assert [(r["rank"], r["node"]) for r in ranks] == [(0, "node1"), (1, "node2"), (2, "node3")]
    for r in ranks:  # the very process py-spy dumped (stacks/<pid>.txt), not podman's client
        dumped = [
            p.stem for p in (tmp_path / job_id / f"{r['rank']}-{r['node']}" / "stacks").iterdir()
        ]
        assert dumped == [str(r["pid"])] and "pids" not in r, (dumped, r)
    assert containers_left(lab, job_id) == {}


def test_a_node_with_another_build_of_the_image_fails_the_check(
    lab: Lab, code: Path, tmp_path: Path
) -> None:
    """node3 gets an image store of its own (``CONTAINERS_STORAGE_CONF`` in its shell) with
    another build under the same tag: the check names node3 with both ids, exit 3, before
    any launch."""
    hd = lab.host_dir("node3")
    bashrc = hd / "bashrc"
    if not bashrc.is_file():
        skip_or_fail("node3 has no .bashrc of its own (the lab keeps the machine's)")
    conf = "/tmp/other-storage.conf"  # node3's private /tmp is hd/tmp here
    (hd / "tmp" / "other-storage.conf").write_text(
        '[storage]\ndriver = "vfs"\n'
        'graphroot = "/tmp/other-store/graph"\nrunroot = "/tmp/other-store/run"\n'
    )
    original = bashrc.read_text()
    try:
        other = on_node(
            lab,
            "node3",
            f"export CONTAINERS_STORAGE_CONF={conf}; podman import --message build-2 "
            f"{TARBALL} {IMAGE} >/dev/null && podman image inspect --format '{{{{.Id}}}}' {IMAGE}",
        ).strip()
        bashrc.write_text(original + f"export CONTAINERS_STORAGE_CONF={conf}\n")
        r = run(lab.inventory_path, tmp_path, code, "--image", IMAGE, "show.py")
    finally:
        bashrc.write_text(original)
        shutil.rmtree(hd / "tmp" / "other-store", ignore_errors=True)
    ours = _podman("image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    assert other and ours and other != ours
    assert r.exit_code == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"fleetctl: error: node3: image {IMAGE} is another build: {other} (on node1: {ours})"
    ), r.stderr
    assert "launching" not in r.stderr


def test_an_image_without_nccl_fails_the_check_where_the_job_uses_gpus(
    lab: Lab, code: Path, tmp_path: Path
) -> None:
    """node2 has GPUs (``fleetctl_gpus: 2``): the check looks for NCCL inside the image there
    (the test image has none) and stops the run, exit 3, naming node2 and the image; the
    nodes without GPUs are not asked."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["children"]["nodes"]["hosts"]["node2"]["fleetctl_gpus"] = 2
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc))
    runs = tmp_path / "runs"
    r = run(inv, runs, code, "--no-check", "--image", IMAGE, "show.py")
    assert r.exit_code == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"fleetctl: error: node2: image {IMAGE} has no NCCL (no libnccl in it; the job uses GPUs)"
    ), r.stderr
    assert "launching" not in r.stderr
