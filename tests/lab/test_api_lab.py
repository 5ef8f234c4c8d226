"""fleetctl as a library against the lab, in-process: ``Fleet.run`` and its ``Job`` (lines in
order, the verdict, the first failure, stop, attach by id), the fleet as a Fabric group
through a bastion with fleetctl's host-key rules, and ``run --before`` with a fabfile task."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from fleetctl import Fleet, HostKeyError, Job
from fleetctl.api.group import by_name
from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli
from fleetctl.testing.infra import assert_node_clean, node_host

pytestmark = pytest.mark.lab

JOB = """\
import os, sys, time
rank = int(os.environ["FLEET_NODE_RANK"])
for i in range(3):
    print(f"step {i} of rank {rank}", flush=True)
if rank == int(os.environ.get("FAIL_RANK", "-1")):
    sys.exit(7)
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "job.py").write_text(JOB)
    return folder


def fleet(lab: Lab, tmp_path: Path, **kw: object) -> Fleet:
    return Fleet.from_inventory(lab.inventory_path, runs_dir=tmp_path / "runs", **kw)


def run(f: Fleet, code: Path, **kw: object) -> Job:
    return f.run(str(code / "job.py"), launcher="plain", code=code, **kw)


def test_a_good_run_streams_every_nodes_lines_in_order_and_succeeds(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    events: list[str] = []
    job = run(fleet(lab3, tmp_path), code, on_event=lambda ev: events.append(ev.kind))
    lines = list(job.lines())
    result = job.wait(timeout=120)
    assert result.ok and result.exit_code == 0 and result.status == "succeeded", result
    assert result.first_failure is None and result.run_folder == tmp_path / "runs" / job.job_id
    for rank, h in enumerate(lab3.hosts):
        mine = [str(ln) for ln in lines if ln.node_rank == rank]
        assert mine == [f"[{rank} {h.name}] step {i} of rank {rank}" for i in range(3)]
    assert {"phase", "started", "lines", "exit"} <= set(events)
    assert json.loads((result.run_folder / "job.json").read_text())["status"] == "succeeded"


def test_a_failing_run_names_the_node_that_failed_first(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    f = fleet(lab3, tmp_path)
    job = run(f, code, env={"FAIL_RANK": "1", "SLEEP": "60"})
    result = job.wait(timeout=120)
    assert not result.ok and result.exit_code == 3 and result.status == "failed"
    ff = result.first_failure
    assert ff is not None and (ff.host, ff.node_rank, ff.reason) == ("node2", 1, "exit code 7")
    assert result.reason == "node 1 (node2) failed first: exit code 7"
    assert [r["node_rank"] for r in result.failed_ranks] == [1]
    for n in f.nodes:  # the peers sleeping 60 s were torn down
        assert_node_clean(node_host(n), job.job_id, workdir=n.workdir, python=n.python)


def test_stop_ends_a_running_job_everywhere_as_an_interruption_not_a_failure(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    f = fleet(lab3, tmp_path)
    job = run(f, code, env={"SLEEP": "300"})
    seen = set()
    for ln in job.lines(timeout=60):
        seen.add(ln.node_rank)
        if len(seen) == 3:
            break
    job.stop(grace=1.0)
    result = job.wait(timeout=60)
    # as `fleetctl stop` from another terminal ends an attached `fleetctl run`: exit 130
    assert result.status == "interrupted" and result.exit_code == 130, result
    assert result.first_failure is None and not result.ok
    for n in f.nodes:
        assert_node_clean(node_host(n), job.job_id, workdir=n.workdir, python=n.python)


def test_a_detached_job_is_found_again_by_id_with_its_lines_and_verdict(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    started = run(fleet(lab3, tmp_path), code, detach=True, env={"SLEEP": "1"})
    job = Job.attach(started.job_id[:18], runs_dir=tmp_path / "runs")
    assert job.job_id == started.job_id
    result = job.wait(timeout=90)
    assert result.ok and result.status == "succeeded", result
    lines = [str(ln) for ln in job.lines()]
    for rank, h in enumerate(lab3.hosts):
        assert f"[{rank} {h.name}] step 2 of rank {rank}" in lines
    assert started.done and [str(ln) for ln in started.lines()] == lines


# --------------------------------------------------------------------------------- fabric


def behind_bastion(lab: Lab, tmp_path: Path) -> Path:
    """node2 and node3 by their data addresses, unreachable from here, through node1 (as
    tests/lab/test_jump_host.py lays it out)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    bastion = lab.hosts[0]
    cfg = tmp_path / "ssh_config"
    cfg.write_text(
        f"Host {bastion.mgmt_addr}\n  User root\n  IdentityFile {lab.key_path}\n"
        "  IdentitiesOnly yes\n"
    )
    data = yaml.safe_load(lab.inventory_path.read_text())
    hosts = data["all"]["children"]["nodes"]["hosts"]
    for h in lab.hosts[1:]:
        hosts[h.name]["ansible_host"] = h.data_addr
        hosts[h.name]["ansible_ssh_common_args"] = (
            f"-F {cfg} -o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes "
            f"-o ProxyJump=root@{bastion.mgmt_addr}"
        )
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_fabric_group_reaches_every_host_through_the_bastion_in_rank_order(
    lab3: Lab, tmp_path: Path
) -> None:
    f = Fleet.from_inventory(behind_bastion(lab3, tmp_path))
    group = f.group()
    try:
        assert [c.host for c in group] == [lab3.hosts[0].mgmt_addr] + [
            h.data_addr for h in lab3.hosts[1:]
        ]
        assert [getattr(c.gateway, "host", None) for c in group] == [None] + [
            lab3.hosts[0].mgmt_addr
        ] * 2
        results = group.run("echo $(hostname) ${SSH_CONNECTION%% *}", hide=True, in_stream=False)
        by_host = {c.host: r.stdout.split() for c, r in results.items()}
        names = [by_host[c.host][0] for c in group]
        assert names == [h.name for h in lab3.hosts]
        # the results by inventory name, not by address
        assert [c.inventory_name for c in group] == [h.name for h in lab3.hosts]
        named = by_name(results)
        assert list(named) == [h.name for h in lab3.hosts]
        assert [r.stdout.split()[0] for r in named.values()] == names
        # node3 saw its SSH connection come from the bastion's data address: through it
        assert by_host[lab3.hosts[2].data_addr][1] == lab3.hosts[0].data_addr
    finally:
        group.close()


def test_the_fabric_group_refuses_a_changed_host_key(lab3: Lab, tmp_path: Path) -> None:
    from fabric.exceptions import GroupException

    inv = behind_bastion(lab3, tmp_path)
    node2, node3 = lab3.hosts[1].data_addr, lab3.hosts[2].data_addr
    lines = lab3.known_hosts.read_text().splitlines()

    def names(line: str) -> list[str]:
        return line.split()[0].split(",")

    node3_key = next(ln.split(None, 1)[1] for ln in lines if node3 in names(ln))
    wrong = tmp_path / "known_hosts"  # node2's address pinned to node3's key: "changed"
    wrong.write_text(
        "\n".join(f"{node2} {node3_key}" if node2 in names(ln) else ln for ln in lines) + "\n"
    )
    group = Fleet.from_inventory(inv, known_hosts=str(wrong)).group()
    try:
        with pytest.raises(GroupException) as ei:
            group.run("hostname", hide=True, in_stream=False)
        outcome = {c.host: r for c, r in ei.value.result.items()}
        assert isinstance(outcome[node2], HostKeyError)
        assert "CHANGED" in str(outcome[node2]) and f"-R '{node2}'" in str(outcome[node2])
        assert outcome[node3].stdout.strip() == "node3"  # the others are not held back
    finally:
        group.close()


# ------------------------------------------------------------------------ run --before


FABFILE = """\
from fabric import task

@task
def prepare(c):
    c.run("echo prepared-by-fabfile > /tmp/fleetctl-before-mark", hide=True)
    if c.run("hostname", hide=True).stdout.strip() == "{fail_on}":
        c.run("echo disk not ready >&2; exit 4", hide=True)
"""


def test_run_before_runs_the_fabfile_task_on_every_node_before_the_launch(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    fab = tmp_path / "fabfile.py"
    fab.write_text(FABFILE.format(fail_on="none"))
    (code / "job.py").write_text("print(open('/tmp/fleetctl-before-mark').read().strip())\n")
    r = run_cli(
        "run", "-i", str(lab3.inventory_path), "--launcher", "plain",
        "--runs-dir", str(tmp_path / "runs"), "--before", f"{fab}:prepare",
        "--code", str(code), str(code / "job.py"),
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr + r.stdout
    for rank, h in enumerate(lab3.hosts):
        assert f"[{rank} {h.name}] prepared-by-fabfile" in r.stdout


def test_run_before_failing_on_one_node_stops_the_run_before_launch_naming_it(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    fab = tmp_path / "fabfile.py"
    fab.write_text(FABFILE.format(fail_on="node2"))
    runs = tmp_path / "runs"
    r = run_cli(
        "run", "-i", str(lab3.inventory_path), "--launcher", "plain", "--runs-dir", str(runs),
        "--before", f"{fab}:prepare", "--code", str(code), str(code / "job.py"),
    )  # fmt: skip
    assert r.exit_code == 3, r.stderr + r.stdout
    assert "--before" in r.stderr and "failed on 1 of 3 node(s): node2" in r.stderr
    assert "exited 4: disk not ready" in r.stderr
    (folder,) = runs.iterdir()
    job = json.loads((folder / "job.json").read_text())
    assert job["status"] == "error" and not (folder / "plan.json").exists()
    assert all(n["start_time"] is None for n in job["nodes"])  # nothing launched


HANGING_FABFILE = """\
from fabric import task

@task
def prepare(c):
    marks = "{marks}"
    if c.run("hostname", hide=True).stdout.strip() == "{fail_on}":
        # fails once the other nodes' commands are running (/var/tmp: every lab host's)
        c.run(f"while [ $(ls {{marks}} | wc -l) -lt 2 ]; do sleep 0.2; done; "
              "echo no scratch space >&2; exit 5", hide=True)
    # its own session, detached from the channel (fabric prefixes `export … &&`); then a
    # command with no pty: closing the channel would not end it
    c.run("sh -c 'setsid sleep 311 < /dev/null > /dev/null 2>&1 &'; "
          f"touch {{marks}}/$(hostname); sleep 312", hide=True)
"""


# the task's sleep processes on a host (its own pid namespace): comm "sleep", argument 311/312
SLEEPS = "ps -eo comm=,args= | awk '$1 == \"sleep\" && $3 ~ /^31[12]$/' | wc -l"


def test_run_before_failing_on_one_node_stops_what_the_others_started(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """node2's task fails; node1's and node3's are in a 312 s command and have left a
    311 s one in its own session: both are stopped on every node, the run ends at once
    naming node2 alone, and nothing the task started is left anywhere."""
    fab = tmp_path / "fabfile.py"
    marks = Path(tempfile.mkdtemp(prefix="fleetctl-test-", dir="/var/tmp"))
    fab.write_text(HANGING_FABFILE.format(marks=marks, fail_on="node2"))
    t0 = time.monotonic()
    r = run_cli(
        "run", "-i", str(lab3.inventory_path), "--launcher", "plain",
        "--runs-dir", str(tmp_path / "runs"), "--before", f"{fab}:prepare",
        "--code", str(code), str(code / "job.py"),
    )  # fmt: skip
    took = time.monotonic() - t0
    shutil.rmtree(marks, ignore_errors=True)
    assert r.exit_code == 3, r.stderr + r.stdout
    assert "failed on 1 of 3 node(s): node2" in r.stderr and "exited 5" in r.stderr, r.stderr
    assert "stopped on the 2 other node(s)" in r.stderr, r.stderr
    assert took < 120, took  # not the 312 s the others' commands would take
    for h in lab3.hosts:
        assert lab3.exec(h.name, ["sh", "-c", SLEEPS]).stdout.strip() == "0", h.name


def test_run_before_interrupted_stops_what_the_task_started_on_every_node(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    """Ctrl-C while every node's task is in a long command: the run exits 130 and nothing
    the task started (in the command, or on its own session) is left on any node."""
    fab = tmp_path / "fabfile.py"
    marks = Path(tempfile.mkdtemp(prefix="fleetctl-test-", dir="/var/tmp"))
    fab.write_text(HANGING_FABFILE.format(marks=marks, fail_on="none"))
    argv = [
        sys.executable, "-m", "fleetctl", "run", "-i", str(lab3.inventory_path),
        "--launcher", "plain", "--runs-dir", str(tmp_path / "runs"),
        "--before", f"{fab}:prepare", "--code", str(code), str(code / "job.py"),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    count = SLEEPS
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # both commands running on every node
            if all(
                lab3.exec(h.name, ["sh", "-c", count]).stdout.strip() == "2" for h in lab3.hosts
            ):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("the task's commands did not start on every node")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    shutil.rmtree(marks, ignore_errors=True)
    assert proc.returncode == 130, proc.stderr.read() if proc.stderr else ""
    for h in lab3.hosts:
        assert lab3.exec(h.name, ["sh", "-c", count]).stdout.strip() == "0", h.name


LOUD_FABFILE = """\
from fabric import task

@task
def prepare(c):
    print("task starts on", c.host)
    c.run("echo fetched by $(hostname); echo careful on $(hostname) >&2")
"""


def test_run_before_output_is_prefixed_with_its_node_and_kept_in_the_run_folder(
    lab3: Lab, tmp_path: Path, code: Path
) -> None:
    fab = tmp_path / "fabfile.py"
    fab.write_text(LOUD_FABFILE)
    (code / "job.py").write_text("print('job ran')\n")
    runs = tmp_path / "runs"
    r = run_cli(
        "run", "-i", str(lab3.inventory_path), "--launcher", "plain", "--runs-dir", str(runs),
        "--before", f"{fab}:prepare", "--code", str(code), str(code / "job.py"),
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr + r.stdout
    (folder,) = runs.iterdir()
    for rank, h in enumerate(lab3.hosts):
        lines = [f"fetched by {h.name}", f"careful on {h.name}"]
        for line in lines:
            assert f"[{rank} {h.name}] {line}\n" in r.stdout, r.stdout
        log = (folder / f"{rank}-{h.name}" / "before.log").read_text().splitlines()
        assert sorted(log)[:2] == sorted(lines) and log[0].startswith("task starts on "), log
        assert len(log) == 3 and f"[{rank} {h.name}] {log[0]}\n" in r.stdout  # its print too
    raw = [x for x in (r.stdout + r.stderr).splitlines() if x.startswith(("fetched", "careful"))]
    assert raw == [], raw  # nothing reaches the terminal without its node
