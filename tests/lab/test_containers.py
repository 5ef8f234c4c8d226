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
import re
import shutil
import signal
import subprocess
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli
from fleetctl.testing.containers import (
    JOB_SCRIPTS,
    assert_nothing_left,
    built_or_skip,
    containers_left,
    kill_supervisor_for_its_guard,
    run_argv,
)
from fleetctl.testing.files import tree
from fleetctl.testing.images import BASE_IMAGE, BASE_TARBALL, base_image
from fleetctl.testing.jobs import (
    job_processes_left,
    killed_at_exit,
    node_record,
    on_node,
    only_job,
    start_running,
    stop_job,
)
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab

IMAGE = BASE_IMAGE
TARBALL = BASE_TARBALL

# show.py, fail_on_1.py, sleep.py: fleetctl.testing.containers.JOB_SCRIPTS (docker's too);
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
    return built_or_skip(base_image)


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab], image: str) -> Lab:
    return make_lab_module(3)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tree(tmp_path_factory.mktemp("code"), {**JOB_SCRIPTS, "hang.py": HANG})


def run(inventory: Path, runs: Path, code: Path, *extra: str) -> CliResult:
    return run_cli(*run_argv(inventory, runs, code, *extra), cwd=code)


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
    assert containers_left(lab.inventory_path, job_id) == {}


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
    assert containers_left(lab.inventory_path, job_id) == {}


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


def start_sleeping_job(lab: Lab, runs: Path, code: Path, *extra: str) -> tuple:
    """(the controller's process, job id) once the SIGTERM-ignoring job runs on all 3 nodes."""
    argv = run_argv(lab.inventory_path, runs, code, "--image", IMAGE, *extra, "sleep.py")
    return start_running(argv, runs, 3, cwd=code)


@pytest.mark.parametrize("how", ["fleetctl stop", "ctrl-c"])
def test_a_stopped_run_ends_its_containers(lab: Lab, code: Path, tmp_path: Path, how: str) -> None:
    """Ranks that ignore SIGTERM, in containers, ended by ``fleetctl stop`` from another
    terminal or by Ctrl-C on the run: none of the job's containers is left on any node."""
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code)
    with killed_at_exit(proc):
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            stop_job(runs, job_id)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    job = json.loads((runs / job_id / "job.json").read_text())
    assert [n["state"] for n in job["nodes"]] == ["stopped"] * 3, job["nodes"]
    assert containers_left(lab.inventory_path, job_id) == {}


def test_a_killed_supervisor_leaves_no_container(lab: Lab, code: Path, tmp_path: Path) -> None:
    """node2's supervisor SIGKILLed mid-run (its container's main process ignores SIGTERM):
    the container guard started with it stops and removes the job's container there; the
    controller loses node2 and tears the others down; nothing of the job is left anywhere."""
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code, "--lost-timeout", "4")
    inv = lab.inventory_path
    kill_supervisor_for_its_guard(inv, proc, job_id, 1, "node2")
    assert_nothing_left(inv, job_id)


def test_a_killed_controller_leaves_no_container(lab: Lab, code: Path, tmp_path: Path) -> None:
    """The controller SIGKILLed: every supervisor's dead-man switch ends its job, container
    (main process ignoring SIGTERM) included; the guards have nothing left to do."""
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)
    inv = lab.inventory_path
    wait_for(lambda: containers_left(inv, job_id) == {}, 60, what="no container of the job")
    wait_for(lambda: job_processes_left(inv, job_id) == {}, 30, what="no process of the job")
    for rank, host in enumerate(("node1", "node2", "node3")):
        state = wait_for(
            lambda r=rank, h=host: (
                node_record(inv, job_id, r, h, "supervisor.json").get("end_time")
                and node_record(inv, job_id, r, h, "supervisor.json")
            ),
            30,
            what=f"{host}'s supervisor ended",
        )
        assert state["containers"]["problem"] is None, state
        assert node_record(inv, job_id, rank, host, "container-guard.json") == {}


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
    assert containers_left(lab.inventory_path, job_id) == {}


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
        import_another = (
            f"export CONTAINERS_STORAGE_CONF={conf}; podman import --message build-2 "
            f"{TARBALL} {IMAGE} >/dev/null && podman image inspect --format '{{{{.Id}}}}' {IMAGE}"
        )
        other = on_node(lab.inventory_path, "node3", import_another).get("node3", "").strip()
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


def _gpus_on_node2(lab: Lab, tmp_path: Path) -> Path:
    doc = yaml.safe_load(lab.inventory_path.read_text())
    doc["all"]["children"]["nodes"]["hosts"]["node2"]["fleetctl_gpus"] = 2
    inv = tmp_path / "hosts.yml"
    inv.write_text(yaml.safe_dump(doc))
    return inv


# A CDI spec whose "GPU" is one variable: podman then starts a container with the launch's
# ``--device nvidia.com/gpu=all`` (the lab's hosts share /run, so every host has it)
CDI_DIR = Path("/run/cdi")
CDI_SPEC = (
    'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n- name: all\n'
    '  containerEdits:\n    env: ["FLEETCTL_LAB_GPU=all"]\n'
)


@pytest.fixture
def cdi_spec() -> object:
    made = not CDI_DIR.exists()
    CDI_DIR.mkdir(exist_ok=True)
    spec = CDI_DIR / f"fleetctl-lab-{os.getpid()}.yaml"
    spec.write_text(CDI_SPEC)
    try:
        yield spec
    finally:
        spec.unlink()
        if made:
            CDI_DIR.rmdir()


def test_an_image_without_nccl_fails_the_check_where_the_job_uses_gpus(
    lab: Lab, code: Path, tmp_path: Path, cdi_spec: Path
) -> None:
    """node2 has GPUs (``fleetctl_gpus: 2``) and a CDI spec for them: the check looks for
    NCCL inside the image there (the test image has none) and stops the run, exit 3, naming
    node2 and the image and what to do; the nodes without GPUs are not asked."""
    inv = _gpus_on_node2(lab, tmp_path)
    runs = tmp_path / "runs"
    r = run(inv, runs, code, "--no-check", "--image", IMAGE, "show.py")
    assert r.exit_code == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"fleetctl: error: node2: image {IMAGE} has no NCCL (no libnccl in it; the job uses "
        "GPUs): use an image with NCCL (torch's CUDA wheels carry it), or --backend gloo"
    ), r.stderr
    assert "launching" not in r.stderr


def test_gpus_the_runtime_cannot_hand_over_fail_the_check_not_the_launch(
    lab: Lab, code: Path, tmp_path: Path
) -> None:
    """No CDI spec on node2: its trial container has the launch's GPU flags, so podman's
    refusal is the check's one line with what to do (it was exit 126 on every rank at launch),
    and a gloo job, whose container gets the GPUs all the same, is refused alike."""
    if CDI_DIR.exists() and any(CDI_DIR.iterdir()):
        skip_or_fail(f"{CDI_DIR} has CDI specs on this machine: podman would resolve the GPUs")
    inv = _gpus_on_node2(lab, tmp_path)
    for extra in ((), ("--backend", "gloo")):
        runs = tmp_path / f"runs{len(extra)}"
        r = run(inv, runs, code, "--no-check", "--image", IMAGE, *extra, "show.py")
        assert r.exit_code == 3, r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"fleetctl: error: node2: podman cannot start a container of {IMAGE}"
        )
        assert (
            "unresolvable CDI devices nvidia.com/gpu=all (no CDI spec for the node's GPUs: " in last
        )
        assert "nvidia-ctk cdi generate" in last and "launching" not in r.stderr
        assert containers_left(inv, only_job(runs)[0]) == {}


# A runtime that hangs at teardown, for node3's job containers only: runc, but ``kill`` and
# ``delete`` (a stop's signal, the removal) of a container with the job's env (FLEET_JOB_ID
# in its OCI config; not the check's trial container) wait while the flag file is there.
# node3's shell gets a containers.conf naming it (``CONTAINERS_CONF`` in its .bashrc), so its
# podman (the job's client, the supervisor's ps/stop/rm, conmon's cleanup) runs it; removing
# the flag lets every hung call finish as runc would.
HUNG_DIR = "/tmp/fleetctl-hung-runtime"  # node3's /tmp: its folder lab.host_dir/tmp here
HUNG_RUNC = f"""\
#!/bin/sh
store=/var/lib/containers/storage/overlay-containers
case " $* " in *" kill "*|*" delete "*)
  for a in "$@"; do
    if grep -qs FLEET_JOB_ID "$store/$a/userdata/config.json"
    then while [ -e {HUNG_DIR}/hang ]; do sleep 0.1; done; fi
  done ;;
esac
exec {{runc}} "$@"
"""
HUNG_CONF = f"""\
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "hangrunc"
[engine.runtimes]
hangrunc = ["{HUNG_DIR}/hang-runc"]
"""
RUNTIME_COMMS = {"conmon", "podman", "runc", "sh", "sleep"}  # the runtime's, not fleetctl's


def _ours_left(job_id: str) -> list[str]:
    """Processes of this machine (lab hosts are its pid namespaces' children) that are
    fleetctl's for the job: its id in their argv or a file of its run folders open; and ssh
    clients of this (the controller's) process. The runtime's own are not counted."""
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            comm = (d / "comm").read_text().strip()
            argv = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            fds = [os.readlink(f) for f in (d / "fd").iterdir()]
        except (OSError, ValueError):
            continue
        if comm in RUNTIME_COMMS:
            continue
        if (
            job_id in argv
            or any(job_id in f for f in fds)
            or (comm == "ssh" and ppid == os.getpid())
        ):
            left.append(f"{d.name} {comm}: {argv[:120]}")
    return left


def test_a_runtime_that_hangs_at_teardown_is_cut_and_named(
    lab: Lab, code: Path, tmp_path: Path
) -> None:
    """node3's container runtime never answers a stop or a removal (runc's ``kill`` and
    ``delete`` hang) when node2's rank fails: the teardown still ends within its bound
    (``--runtime-timeout``: one cut call, not one per call), says in one line which host and
    which runtime call hung and which container may be left, exits 3, keeps every node's
    log, and leaves no process of fleetctl's on any host; the container is the operator's to
    remove (this test does, once the runtime answers again). A podman stop here takes ~8 s
    when nothing hangs (node1's): the bound leaves it room."""
    hd = lab.host_dir("node3")
    bashrc = hd / "bashrc"
    if not bashrc.is_file():
        skip_or_fail("node3 has no .bashrc of its own (the lab keeps the machine's)")
    folder = hd / "tmp" / Path(HUNG_DIR).name
    folder.mkdir()
    (folder / "hang-runc").write_text(HUNG_RUNC.format(runc=shutil.which("runc") or "runc"))
    (folder / "hang-runc").chmod(0o755)
    (folder / "containers.conf").write_text(HUNG_CONF)
    (folder / "hang").touch()
    original = bashrc.read_text()
    job_id, bound, grace = None, 15, 2
    try:
        bashrc.write_text(original + f"export CONTAINERS_CONF={HUNG_DIR}/containers.conf\n")
        r = run(
            lab.inventory_path, tmp_path, code,
            "--image", IMAGE, "--runtime-timeout", str(bound), "fail_on_1.py",
        )  # fmt: skip
        job_id, job = only_job(tmp_path)
        ours = wait_for(lambda: not _ours_left(job_id), 10, what="no fleetctl process left",
                        detail=lambda: str(_ours_left(str(job_id))))  # fmt: skip
    finally:
        (folder / "hang").unlink()  # every hung runtime call goes on, as runc's
        if job_id is not None:
            on_node(lab.inventory_path, "node3", f"podman rm -f --ignore fleet-{job_id}-2")
        bashrc.write_text(original)
        shutil.rmtree(folder, ignore_errors=True)
    assert ours
    name = f"fleet-{job_id}-2"
    assert r.exit_code == 3, r.stderr
    assert job["status"] == "failed" and job["teardown"]["verified"] is False, job["teardown"]
    [line] = [s for s in r.stderr.splitlines() if s.startswith("error: node3: teardown: ")]
    assert re.fullmatch(
        rf"error: node3: teardown: container not verified gone: podman (ps|stop|rm): no answer "
        rf"within \d+s \(the container runtime hangs\); {name} \(label fleetctl\.job={job_id}\) "
        rf"may be left: remove it with `podman rm -f {name}`",
        line,
    ), line
    assert [n["host"] for n in job["teardown"]["nodes"] if n["error"]] == ["node3"], job
    # bounded: from the stop to the end, the grace and one cut call (the stop's: grace + bound)
    events = (tmp_path / job_id / "events.log").read_text().splitlines()
    at = [datetime.fromisoformat(e.split()[0].replace("Z", "+00:00")) for e in events]
    stop = next(t for t, e in zip(at, events, strict=True) if " teardown stopping " in e)
    took = (at[-1] - stop).total_seconds()
    assert took < grace + (grace + bound) + 8, f"the teardown took {took:.1f}s"
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert (tmp_path / job_id / f"{rank}-{host}" / "console.log").is_file(), (rank, host)
    sup = json.loads((tmp_path / job_id / "2-node3" / "supervisor.json").read_text())
    assert sup["containers"]["hung"] and sup["containers"]["remaining"], sup["containers"]
    assert_nothing_left(lab.inventory_path, job_id)
