"""``fleetctl run --image --container-runtime docker`` on 3 lab hosts, with real dockerds.

A lab host is namespaces of this machine, so each host gets a dockerd of its own, started in
that host's network, mount and pid namespaces (``nsenter``): ``--network host`` and ``--pid
host`` containers then share the host's addresses and process table, as on a real node. Its
state lives in the host's private /tmp (socket ``/tmp/d/docker.sock``, ``DOCKER_HOST`` in the
host's shell); no bridge, no iptables, cgroupfs. The image is imported once (node1's daemon)
and ``docker save``/``load``ed into the others, so every node has the same image id.
The tests: a job in the image; a failing rank and a SIGKILLed supervisor (the container
guard) leave no container and no process; ``push --image`` with docker.

Needs docker.io (Debian's dockerd 20.10); every dockerd started here is stopped by its pid.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetctl.errors import LabError
from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import CliResult, run_cli
from fleetctl.testing.containers import (
    JOB_SCRIPTS,
    assert_nothing_left,
    built_or_skip,
    kill_supervisor_for_its_guard,
    run_argv,
)
from fleetctl.testing.files import tree
from fleetctl.testing.images import BASE_IMAGE, BASE_TARBALL, base_tarball
from fleetctl.testing.jobs import only_job, start_running
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab

IMAGE = BASE_IMAGE
TARBALL = BASE_TARBALL
HOSTS = ("node1", "node2", "node3")
SOCK = "/tmp/d/docker.sock"  # in each host's private /tmp
DOCKERD = (
    "mkdir -p /tmp/d && exec dockerd --data-root /tmp/d/root --exec-root /tmp/d/exec "
    f"--pidfile /tmp/d/dockerd.pid -H unix://{SOCK} --iptables=false --ip6tables=false "
    "--ip-masq=false --bridge=none --exec-opt native.cgroupdriver=cgroupfs "
    "--storage-driver overlay2 >/tmp/d/dockerd.log 2>&1"
)


def _docker(lab: Lab, host: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The docker client here, talking to ``host``'s daemon through its socket."""
    sock = lab.host_dir(host) / SOCK.lstrip("/")
    argv = ["docker", "-H", f"unix://{sock}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _stop_dockerd(lab: Lab, host: str, proc: subprocess.Popen) -> None:
    """SIGTERM by the pid dockerd wrote (its containers and containerd end with it)."""
    stop = "test -s /tmp/d/dockerd.pid && kill -TERM $(cat /tmp/d/dockerd.pid)"
    lab.exec(host, ["sh", "-c", stop], timeout=30)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        lab.exec(host, ["sh", "-c", stop.replace("TERM", "KILL")], timeout=30)
        proc.wait(30)


@pytest.fixture(scope="module")
def lab(make_lab_module: Callable[..., Lab]) -> Iterator[Lab]:
    for tool in ("dockerd", "docker", "containerd", "runc"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is not installed (apt-get install docker.io)")
    built_or_skip(base_tarball)  # shared with the podman tests: fleetctl.testing.images
    lab = make_lab_module(3)
    daemons: dict[str, subprocess.Popen] = {}
    saved: dict[str, str] = {}
    try:
        for host in HOSTS:
            hd = lab.host_dir(host)
            if not (hd / "bashrc").is_file():
                skip_or_fail(f"{host} has no .bashrc of its own (the lab keeps the machine's)")
            daemons[host] = subprocess.Popen(
                lab.nsenter_argv(host, ["sh", "-c", DOCKERD]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        for host in HOSTS:
            wait_for(
                lambda h=host: (
                    _docker(lab, h, "info", timeout=10).returncode == 0
                    or daemons[h].poll() is not None
                ),
                60,
                what=f"{host}'s dockerd answering",
                interval=0.3,
            )
            log = lab.host_dir(host) / "tmp" / "d" / "dockerd.log"
            assert daemons[host].poll() is None, log.read_text()[-2000:]
        got = _docker(lab, "node1", "import", str(TARBALL), IMAGE)
        assert got.returncode == 0, got.stderr
        archive = lab.dir / "docker-image.tar"
        got = _docker(lab, "node1", "save", "-o", str(archive), IMAGE)
        assert got.returncode == 0, got.stderr
        for host in HOSTS[1:]:
            got = _docker(lab, host, "load", "-i", str(archive))
            assert got.returncode == 0, got.stderr
        archive.unlink()
        for host in HOSTS:
            bashrc = lab.host_dir(host) / "bashrc"
            saved[host] = bashrc.read_text()
            bashrc.write_text(saved[host] + f"export DOCKER_HOST=unix://{SOCK}\n")
        yield lab
    finally:
        for host, text in saved.items():
            (lab.host_dir(host) / "bashrc").write_text(text)
        for host, proc in daemons.items():  # a host that is gone took its dockerd with it
            with contextlib.suppress(LabError):
                _stop_dockerd(lab, host, proc)


@pytest.fixture(scope="module")
def code(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tree(tmp_path_factory.mktemp("code"), JOB_SCRIPTS)


def run_args(lab: Lab, runs: Path, code: Path, *extra: str) -> list[str]:
    docker = ("--image", IMAGE, "--container-runtime", "docker")
    return run_argv(lab.inventory_path, runs, code, *docker, *extra)


def run(lab: Lab, runs: Path, code: Path, script: str) -> CliResult:
    return run_cli(*run_args(lab, runs, code, script), cwd=code)


def containers_left(lab: Lab, job_id: str) -> dict[str, list[str]]:
    """Every container labelled with the job, as each node's own daemon lists it."""
    left = {}
    for host in HOSTS:
        got = _docker(lab, host, "ps", "-a", "-q", "--filter", f"label=fleetctl.job={job_id}")
        assert got.returncode == 0, got.stderr
        if got.stdout.split():
            left[host] = got.stdout.split()
    return left


def test_ranks_run_in_the_image_with_docker(lab: Lab, code: Path, tmp_path: Path) -> None:
    r = run(lab, tmp_path, code, "show.py")
    assert r.exit_code == 0, r.stderr
    job_id, job = only_job(tmp_path)
    assert job["status"] == "succeeded", job
    for rank, host in enumerate(HOSTS):
        console = (tmp_path / job_id / f"{rank}-{host}" / "console.log").read_text()
        assert f'in-image {rank} /usr/bin/python3 "Debian GNU/Linux 12' in console, console
    plan = json.loads((tmp_path / job_id / "plan.json").read_text())
    assert {n["container"]["runtime"] for n in plan["nodes"]} == {"docker"}, plan
    assert containers_left(lab, job_id) == {}


def test_a_failing_rank_leaves_no_docker_container(lab: Lab, code: Path, tmp_path: Path) -> None:
    """Ranks that ignore SIGTERM on node1 and node3; node2's fails: every node's own daemon
    lists no container of the job after, and no process of it is left."""
    r = run(lab, tmp_path, code, "fail_on_1.py")
    assert r.exit_code != 0
    job_id, job = only_job(tmp_path)
    ff = job["first_failure"]
    assert (ff["rank"], ff["host"], ff["state"], ff["exit_code"]) == (1, "node2", "failed", 3)
    assert [n["state"] for n in job["nodes"]] == ["stopped", "failed", "stopped"], job["nodes"]
    assert job["teardown"]["verified"] is True, job["teardown"]
    for rank, host in enumerate(HOSTS):
        sup = json.loads((tmp_path / job_id / f"{rank}-{host}" / "supervisor.json").read_text())
        assert sup["containers"]["problem"] is None, (host, sup["containers"])
    assert_nothing_left(lab.inventory_path, job_id, containers_left(lab, job_id))


def test_a_killed_supervisor_leaves_no_docker_container(
    lab: Lab, code: Path, tmp_path: Path
) -> None:
    """node2's supervisor SIGKILLed (its container's main process ignores SIGTERM): the
    container guard ends the job's container through node2's dockerd (``DOCKER_HOST`` passed
    on to it); nothing of the job is left anywhere."""
    runs, inv = tmp_path / "runs", lab.inventory_path
    argv = run_args(lab, runs, code, "--lost-timeout", "4", "sleep.py")
    proc, job_id = start_running(argv, runs, 3, cwd=code)
    kill_supervisor_for_its_guard(inv, proc, job_id, 1, "node2")
    assert_nothing_left(inv, job_id, containers_left(lab, job_id))


def test_push_image_with_docker(
    lab: Lab, code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``push --image --container-runtime docker``: this machine's docker (here node1's daemon,
    through its socket) saves it once; node2 and node3, whose daemons lost it, load it (one by
    SFTP, one from that seed); the same id everywhere after, and a run in it works."""
    for host in HOSTS[1:]:
        got = _docker(lab, host, "rmi", "-f", IMAGE)
        assert got.returncode == 0, got.stderr
    ours = _docker(lab, "node1", "image", "inspect", "--format", "{{.Id}}", IMAGE).stdout.strip()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{lab.host_dir('node1') / SOCK.lstrip('/')}")
    inv = str(lab.inventory_path)
    r = run_cli("push", "-i", inv, "--image", IMAGE, "--container-runtime", "docker", "--json")
    assert r.exit_code == 0, r.stderr
    doc = json.loads(r.stdout)
    nodes = doc["nodes"]
    assert nodes["node1"]["status"] == "present", nodes
    assert sorted((nodes[h]["status"], nodes[h]["via"]) for h in HOSTS[1:]) == [
        ("loaded", "peer"),
        ("loaded", "sftp"),
    ], nodes
    assert doc["controller_bytes"] == doc["archive_bytes"] > 0, doc
    ids = {h: _docker(lab, h, "image", "inspect", "--format", "{{.Id}}", IMAGE) for h in HOSTS}
    assert {h: p.stdout.strip() for h, p in ids.items()} == {h: ours for h in HOSTS}
    r = run(lab, tmp_path, code, "show.py")
    assert r.exit_code == 0, r.stderr
