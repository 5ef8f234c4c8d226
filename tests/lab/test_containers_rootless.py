"""``fleetctl run --image`` as a plain login user: podman rootless on 2 lab hosts (the non-root
pass of .ci/run, ``FLEETCTL_LAB_USER=fleetci``; the root pass skips this file and runs
tests/lab/test_containers.py).

Each host keeps the image in the login user's own store: ``~/.config/containers/storage.conf``
picks the overlay driver (native rootless overlay, kernel >= 5.13; vfs copies the whole image
for every container), and with a shared home (``FLEETCTL_LAB_SHARED_HOME=1``) a graphroot in
the host's own /tmp, as an NFS home needs a local one. The image gets there by ``fleetctl push
--image`` from this machine's root store. podman runs rootless through the user's subordinate
ids (the lab gives the user ranges; newuidmap/newgidmap from package uidmap), runc and
cgroupfs (/etc/containers/containers.conf, as for root), ``/dev/mqueue`` mounted on each host
(``--ipc host`` binds it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import CliResult, run_cli, start_cli_process
from fleetctl.testing.images import BASE_IMAGE, ImageUnavailable, base_image
from fleetctl.testing.infra import node_host, node_leftovers
from fleetctl.testing.pytest_plugin import lab_login, skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab

IMAGE = BASE_IMAGE
HOSTS = ("node1", "node2")

SHOW = """\
import os
path = os.path.join(os.environ["FLEET_RUN_DIR"], "made-in-image.txt")
with open(path, "w") as f:
    f.write("x")
print("in-image", os.environ["FLEET_NODE_RANK"], "uid", os.getuid(), flush=True)
"""
# rank 1 (node2) fails once rank 0 ignores SIGTERM (it connects to rank 0's port: a stop that
# came before the handler would end rank 0 by SIGTERM, proving nothing); rank 0 then waits
FAIL_ON_1 = """\
import os, signal, socket, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
port = int(os.environ["MASTER_PORT"])
if os.environ["FLEET_NODE_RANK"] == "0":
    srv = socket.create_server(("", port))
    srv.accept()
    time.sleep(120)
deadline = time.monotonic() + 60
while True:
    try:
        socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=1).close()
        sys.exit(3)
    except OSError:
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.1)
"""
# ignores SIGTERM, then says so in its node run folder (the test stops it only after that)
SLEEP = """\
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(os.environ["FLEET_RUN_DIR"], "ready"), "w") as f:
    f.write("1")
time.sleep(120)
"""


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab]) -> Lab:
    login = lab_login()
    if not login:  # the premise, not a missing tool: the root pass has test_containers.py
        pytest.skip("needs a plain login user (FLEETCTL_LAB_USER): podman rootless")
    for tool in ("podman", "runc", "newuidmap", "newgidmap"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is not installed (apt-get install podman runc uidmap)")
    try:
        base_image()  # root's store: the tests push it to the user from there
    except ImageUnavailable as e:
        skip_or_fail(str(e))
    lab = make_lab_module(2)
    store = '[storage]\ndriver = "overlay"\n'
    if login.get("shared_home"):  # one home for all hosts: each host's store on its own /tmp
        store += 'graphroot = "/tmp/fleetctl-containers/storage"\n'
    on_node(
        lab,
        None,
        f"mkdir -p ~/.config/containers && printf '{store}' > ~/.config/containers/storage.conf",
    )
    return lab


@pytest.fixture(scope="module")
def pushed(lab: Lab) -> dict:
    """``fleetctl push --image`` as the login user: the image in each host's user store."""
    got = run_cli("push", "-i", str(lab.inventory_path), "--image", IMAGE, "--json")
    assert got.exit_code == 0, got.stdout + got.stderr
    return json.loads(got.stdout)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("code")
    (d / "show.py").write_text(SHOW)
    (d / "fail_on_1.py").write_text(FAIL_ON_1)
    (d / "sleep.py").write_text(SLEEP)
    return d


def run_args(lab: Lab, runs: Path, code: Path, *extra: str) -> list[str]:
    inv, common = str(lab.inventory_path), ("--launcher", "plain", "--grace", "2")
    return ["run", "-i", inv, *common, "--runs-dir", str(runs), "--code-dir", str(code), *extra]


def run(lab: Lab, runs: Path, code: Path, *extra: str) -> CliResult:
    return run_cli(*run_args(lab, runs, code, "--image", IMAGE, *extra), cwd=code)


def only_job(runs: Path) -> tuple[str, dict]:
    (folder,) = [p for p in runs.iterdir() if p.is_dir()]
    return folder.name, json.loads((folder / "job.json").read_text())


def on_node(lab: Lab, host: str | None, script: str) -> dict[str, str]:
    """``sh -c script`` as the login user on one lab host (every host: None): host -> output."""
    limit = ("--limit", host) if host else ()
    inv = str(lab.inventory_path)
    got = run_cli("exec", "-i", inv, *limit, "--", "sh", "-c", script)
    assert got.exit_code == 0, got.stdout + got.stderr
    out: dict[str, str] = {}
    for line in got.stdout.splitlines():
        name, _, text = line.partition(": ")
        out[name] = (out[name] + "\n" + text) if name in out else text
    return out


def containers_left(lab: Lab, job_id: str) -> dict[str, str]:
    """host -> ids of the job's containers still in the login user's store (by label)."""
    said = on_node(lab, None, f"podman ps -a -q --filter label=fleetctl.job={job_id}")
    return {h: ids.strip() for h, ids in said.items() if ids.strip()}


def job_processes_left(lab: Lab, job_id: str) -> dict:
    """host -> processes of the job still alive (by their env tag, in a container or not)."""
    out = {}
    for node in load_inventory(str(lab.inventory_path)).nodes:
        left = node_leftovers(node_host(node), job_id, workdir=node.workdir, python=node.python)
        if left.processes:
            out[node.name] = left.processes
    return out


def node_file(lab: Lab, job_id: str, rank: int, host: str, name: str) -> str:
    (node,) = [n for n in load_inventory(str(lab.inventory_path)).nodes if n.name == host]
    path = f"{node.workdir.rstrip('/')}/runs/{job_id}/{rank}-{host}/{name}"
    return on_node(lab, host, f"cat {path} 2>/dev/null || echo '{{}}'").get(host, "")


def running_everywhere(runs: Path) -> str | None:
    for d in runs.glob("*") if runs.is_dir() else []:
        j = json.loads((d / "job.json").read_text()) if (d / "job.json").is_file() else {}
        if [n.get("state") for n in j.get("nodes", [])] == ["running"] * len(HOSTS):
            return d.name
    return None


def start_sleeping_job(lab: Lab, runs: Path, code: Path, *extra: str) -> tuple:
    """(the controller's process, job id) once the SIGTERM-ignoring job runs on both hosts."""
    argv = run_args(lab, runs, code, "--image", IMAGE, *extra, "sleep.py")
    proc = start_cli_process(*argv, cwd=code, start_new_session=True)
    try:
        job_id = wait_for(
            lambda: running_everywhere(runs) or proc.poll() is not None,
            60,
            what="job running on both hosts",
            interval=0.3,
        )
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        raise
    if proc.poll() is not None:
        raise AssertionError(proc.communicate())
    wait_for(
        lambda: all(node_file(lab, job_id, r, h, "ready") == "1" for r, h in enumerate(HOSTS)),
        60,
        what="both ranks ignore SIGTERM",
        interval=0.3,
    )
    return proc, job_id


def test_push_then_run_in_the_login_users_store(
    lab: Lab, pushed: dict, code: Path, tmp_path: Path
) -> None:
    """The image reaches each host's user store by push; the ranks run in it (uid 0 inside is
    the login user outside), and what they write in the run folder is the user's."""
    user = lab_login()["user"]
    assert {h: n["status"] for h, n in pushed["nodes"].items()} == dict.fromkeys(HOSTS, "loaded")
    r = run(lab, tmp_path, code, "show.py")
    assert r.exit_code == 0, r.stderr
    job_id, job = only_job(tmp_path)
    assert job["status"] == "succeeded", job
    for rank, host in enumerate(HOSTS):
        console = (tmp_path / job_id / f"{rank}-{host}" / "console.log").read_text()
        assert f"in-image {rank} uid 0" in console, console
        assert (tmp_path / job_id / f"{rank}-{host}" / "made-in-image.txt").read_text() == "x"
    for rank, host in enumerate(HOSTS):  # the host's own file (a shared home holds both)
        said = on_node(
            lab,
            host,
            f"stat -c %U ~/.fleetctl/runs/{job_id}/{rank}-{host}/made-in-image.txt; "
            "podman info --format '{{.Host.Security.Rootless}} {{.Store.GraphDriverName}}'",
        )
        assert said == {host: f"{user}\ntrue overlay"}, said
    assert containers_left(lab, job_id) == {}


def test_a_failing_rank_ends_every_container_of_the_job(
    lab: Lab, pushed: dict, code: Path, tmp_path: Path
) -> None:
    """node2 fails first; node1's rank ignores SIGTERM. node1 counts as stopped, not succeeded
    (rootless podman's client exits 0 on SIGTERM while its other half still waits for the
    container: the supervisor takes that half's status), and nothing of the job is left."""
    r = run(lab, tmp_path, code, "fail_on_1.py")
    assert r.exit_code != 0
    job_id, job = only_job(tmp_path)
    assert job["status"] == "failed", job
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"], ff["exit_code"]) == (1, "node2", 3), ff
    assert [n["state"] for n in job["nodes"]] == ["stopped", "failed"], job["nodes"]
    assert job["teardown"]["verified"] is True, job["teardown"]
    assert containers_left(lab, job_id) == {}
    assert job_processes_left(lab, job_id) == {}


def test_fleetctl_stop_ends_the_containers(
    lab: Lab, pushed: dict, code: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code)
    try:
        stop = run_cli("stop", "--runs-dir", str(runs), job_id, "--grace", "1")
        assert stop.exit_code == 0, stop.stdout + stop.stderr
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode == 130, err
    job = json.loads((runs / job_id / "job.json").read_text())
    assert [n["state"] for n in job["nodes"]] == ["stopped"] * 2, job["nodes"]
    assert containers_left(lab, job_id) == {}
    assert job_processes_left(lab, job_id) == {}


def test_a_killed_supervisor_leaves_no_container(
    lab: Lab, pushed: dict, code: Path, tmp_path: Path
) -> None:
    """node2's supervisor SIGKILLed: the container guard ends the container in the user's
    store (its main process ignores SIGTERM); nothing of the job is left on either host."""
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code, "--lost-timeout", "4")
    try:
        pid = json.loads(node_file(lab, job_id, 1, "node2", "supervisor.json"))["supervisor_pid"]
        on_node(lab, "node2", f"kill -KILL {int(pid)}")
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    assert proc.returncode != 0, err
    guard = wait_for(
        lambda: json.loads(node_file(lab, job_id, 1, "node2", "container-guard.json")),
        30,
        what="node2's container guard ended the job's container",
    )
    assert len(guard["containers"]["found"]) == 1, guard
    assert guard["containers"]["problem"] is None, guard
    assert containers_left(lab, job_id) == {}
    assert job_processes_left(lab, job_id) == {}
