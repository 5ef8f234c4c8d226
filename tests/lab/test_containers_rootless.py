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
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli
from fleetctl.testing.containers import (
    assert_nothing_left,
    built_or_skip,
    containers_left,
    kill_supervisor_for_its_guard,
    run_argv,
)
from fleetctl.testing.files import tree
from fleetctl.testing.images import BASE_IMAGE, base_image
from fleetctl.testing.jobs import (
    kill_if_running,
    killed_at_exit,
    node_file,
    on_node,
    only_job,
    start_running,
    stop_job,
)
from fleetctl.testing.pytest_plugin import lab_login, skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.login]

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
    built_or_skip(base_image)  # root's store: the tests push it to the user from there
    lab = make_lab_module(2)
    store = '[storage]\ndriver = "overlay"\n'
    if login.get("shared_home"):  # one home for all hosts: each host's store on its own /tmp
        store += 'graphroot = "/tmp/fleetctl-containers/storage"\n'
    on_node(
        lab.inventory_path,
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
    return tree(
        tmp_path_factory.mktemp("code"),
        {"show.py": SHOW, "fail_on_1.py": FAIL_ON_1, "sleep.py": SLEEP},
    )


def run(lab: Lab, runs: Path, code: Path, *extra: str) -> CliResult:
    return run_cli(*run_argv(lab.inventory_path, runs, code, "--image", IMAGE, *extra), cwd=code)


def start_sleeping_job(lab: Lab, runs: Path, code: Path, *extra: str) -> tuple:
    """(the controller's process, job id) once the SIGTERM-ignoring job runs on both hosts
    and both ranks said they ignore SIGTERM."""
    inv = lab.inventory_path
    argv = run_argv(inv, runs, code, "--image", IMAGE, *extra, "sleep.py")
    proc, job_id = start_running(argv, runs, len(HOSTS), cwd=code)
    try:
        wait_for(
            lambda: all(node_file(inv, job_id, r, h, "ready") == "1" for r, h in enumerate(HOSTS)),
            60,
            what="both ranks ignore SIGTERM",
            interval=0.3,
        )
    except BaseException:
        kill_if_running(proc)
        raise
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
            lab.inventory_path,
            host,
            f"stat -c %U ~/.fleetctl/runs/{job_id}/{rank}-{host}/made-in-image.txt; "
            "podman info --format '{{.Host.Security.Rootless}} {{.Store.GraphDriverName}}'",
        )
        assert said == {host: f"{user}\ntrue overlay"}, said
    assert containers_left(lab.inventory_path, job_id) == {}


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
    assert_nothing_left(lab.inventory_path, job_id)


def test_fleetctl_stop_ends_the_containers(
    lab: Lab, pushed: dict, code: Path, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code)
    with killed_at_exit(proc):
        stop_job(runs, job_id)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    job = json.loads((runs / job_id / "job.json").read_text())
    assert [n["state"] for n in job["nodes"]] == ["stopped"] * 2, job["nodes"]
    assert_nothing_left(lab.inventory_path, job_id)


def test_a_killed_supervisor_leaves_no_container(
    lab: Lab, pushed: dict, code: Path, tmp_path: Path
) -> None:
    """node2's supervisor SIGKILLed: the container guard ends the container in the user's
    store (its main process ignores SIGTERM); nothing of the job is left on either host."""
    runs = tmp_path / "runs"
    proc, job_id = start_sleeping_job(lab, runs, code, "--lost-timeout", "4")
    inv = lab.inventory_path
    kill_supervisor_for_its_guard(inv, proc, job_id, 1, "node2")
    assert_nothing_left(inv, job_id)
