"""``fleetctl run --slurm`` against a real Slurm (lab: munged + slurmctld + one slurmd per host).

The submitter runs here; sbatch starts the batch script on node1, whose fleetctl runs the job
inside the allocation (srun steps). The lab's folders under ``/var/tmp/fleetctl-lab`` are seen
by every lab host, as a cluster's shared home is: the code and the run folder live there.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.lab.core import Lab
from fleetctl.lab.slurm import SlurmLab, installed
from fleetctl.testing.cli_runner import run_cli_process, start_cli_process
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.testing.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
FAIL_SCRIPT = """\
import os, sys, time
print("started", os.environ["RANK"], flush=True)
if os.environ["RANK"] == "1":
    time.sleep(1)
    sys.exit(7)
time.sleep(600)  # fleetctl_slurm_sleeper
"""
#: prints a digest of SECRET_TOKEN (the job sees it), then holds the rank until the test says go
SECRET_SCRIPT = """\
import hashlib, os, sys, time
from pathlib import Path
token = os.environ.get("SECRET_TOKEN", "")
print("SECRET_TOKEN", hashlib.sha256(token.encode()).hexdigest(), flush=True)
gate = Path(sys.argv[1])
(gate / ("ready-" + os.environ["RANK"])).write_text(str(os.getpid()))
deadline = time.monotonic() + 120
while not (gate / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
"""
SLEEP_SCRIPT = """\
import os, time
print("started", os.environ["RANK"], flush=True)
time.sleep(600)  # fleetctl_slurm_sleeper
"""


@pytest.fixture(scope="module")
def slurm(make_lab_module: Callable[..., Lab]) -> Iterator[dict[str, Any]]:
    why = installed()
    if why:
        skip_or_fail(f"Slurm {why} (.ci/run installs slurm-wlm and munge)")
    lab = make_lab_module(3, user=None, shared_home=False)
    s = SlurmLab.start(lab)  # stopped by lab.down (the factory's finally) by PID
    code = lab.dir / "submit-code"
    code.mkdir()
    shutil.copy(ROOT / "examples" / "ddp_train.py", code / "ddp_train.py")
    (code / "fail.py").write_text(FAIL_SCRIPT)
    (code / "sleep.py").write_text(SLEEP_SCRIPT)
    (code / "secret.py").write_text(SECRET_SCRIPT)
    env = {"SLURM_CONF": str(s.conf), "PYTHONPATH": str(ROOT)}
    try:
        yield {"lab": lab, "slurm": s, "code": code, "env": env}
    finally:  # lab.down removes only the lab's own files
        shutil.rmtree(code, ignore_errors=True)
        for runs in lab.dir.glob("runs-*"):
            shutil.rmtree(runs, ignore_errors=True)


@pytest.fixture
def runs(slurm: dict[str, Any], request: pytest.FixtureRequest) -> Path:
    d = slurm["lab"].dir / f"runs-{request.node.name[:40]}"
    d.mkdir()
    return d


def _squeue(slurm: dict[str, Any], *args: str) -> str:
    p = subprocess.run(
        ["squeue", "-h", *args], capture_output=True, text=True, env=slurm["slurm"].env(),
        timeout=10,
    )  # fmt: skip
    return p.stdout.strip()


def _submit(slurm: dict[str, Any], runs: Path, *args: str, timeout: float = 180) -> Any:
    return run_cli_process(
        "run", "--slurm", "--runs-dir", str(runs), *args,
        env=slurm["env"], cwd=slurm["code"], timeout=timeout,
    )  # fmt: skip


def _folder(runs: Path) -> Path:
    folders = [p for p in runs.iterdir() if p.is_dir()]
    assert len(folders) == 1, folders
    return folders[0]


def _slurm_job(folder: Path) -> str:
    return str(json.loads((folder / "slurm.json").read_text())["job_id"])


def _nothing_left(slurm: dict[str, Any], slurm_job: str) -> None:
    """The job and every step gone from the queue; no process of it on any host."""
    assert _squeue(slurm, "-j", slurm_job) == ""
    assert _squeue(slurm, "-s", "-j", slurm_job) == ""
    lab: Lab = slurm["lab"]
    for h in lab.hosts:
        ps = lab.exec(h.name, ["ps", "-eo", "args"], check=True).stdout
        assert "fleetctl_slurm_sleeper" not in ps and "sleep.py" not in ps, (h.name, ps)
        assert "fail.py" not in ps and "ddp_train.py" not in ps, (h.name, ps)


def test_a_torchrun_ddp_job_submitted_with_sbatch_trains_and_every_log_comes_home(
    slurm: dict[str, Any], runs: Path
) -> None:
    res = _submit(
        slurm, runs, "--nodes", "3", "--launcher", "torchrun",
        "ddp_train.py", "--epochs", "1", "--steps", "3",
    )  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "submitted as Slurm job" in res.stderr and "running on node[1-3]" in res.stderr
    for rank in range(3):  # the inside run's live lines, streamed here
        assert f"done rank={rank} world=3" in res.stdout, res.stdout
    folder = _folder(runs)
    job = json.loads((folder / "job.json").read_text())
    sj = _slurm_job(folder)
    assert job["status"] == "succeeded" and job["slurm"] == {"job_id": sj}
    assert "#SBATCH --nodes=3" in (folder / "sbatch.sh").read_text()
    for rank, host in enumerate(("node1", "node2", "node3")):
        node = folder / f"{rank}-{host}"
        assert f"done rank={rank} world=3" in (node / "console.log").read_text()
        assert (node / "torchrun").is_dir()  # the rank logs
    assert json.loads((folder / "slurm.json").read_text())["state"] == "COMPLETED"
    _nothing_left(slurm, sj)
    # `collect` after the allocation ended: its srun steps are refused ("job has expired"),
    # and the logs the run brought home whole stay recorded as complete (exit 0, not 4)
    got = run_cli_process(
        "collect", "--runs-dir", str(runs), folder.name,
        env=slurm["env"], cwd=slurm["code"], timeout=120,
    )  # fmt: skip
    assert got.exit_code == 0, got.stdout + got.stderr
    assert got.stderr.count("whole since the job ended; not reachable now") == 3, got.stderr
    assert "copied now" not in got.stderr, got.stderr
    after = json.loads((folder / "job.json").read_text())
    assert [n["collected"] for n in after["nodes"]] == [True] * 3, after["nodes"]
    assert all(c["complete"] for c in after["collected"]), after["collected"]


def test_a_failing_rank_exits_3_naming_its_host_and_leaves_nothing(
    slurm: dict[str, Any], runs: Path
) -> None:
    res = _submit(slurm, runs, "--nodes", "3", "--launcher", "plain", "fail.py")
    out = res.stdout + res.stderr
    assert res.exit_code == 3, out
    assert "node 1 (node2) failed first" in res.stderr, out
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("fleetctl: error: job ") and "node 1 (node2): exit code 7" in last
    folder = _folder(runs)
    job = json.loads((folder / "job.json").read_text())
    assert (job["first_failure"]["host"], job["first_failure"]["exit_code"]) == ("node2", 7)
    for i, h in enumerate(("node1", "node2", "node3")):
        assert (folder / f"{i}-{h}" / "console.log").is_file()
    sj = _slurm_job(folder)
    wait_for(lambda: _squeue(slurm, "-s", "-j", sj) == "", 15, what="the job's steps gone")
    _nothing_left(slurm, sj)


def test_ctrl_c_cancels_the_slurm_job_verified_and_exits_130(
    slurm: dict[str, Any], runs: Path
) -> None:
    proc = start_cli_process(
        "run", "--slurm", "--nodes", "3", "--runs-dir", str(runs), "--launcher", "plain",
        "sleep.py", env=slurm["env"], cwd=slurm["code"], start_new_session=True,
    )  # fmt: skip
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        wait_for(lambda: sum("started" in ln for ln in out) == 3, 120, what="3 ranks started")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 130, err
    assert "cancelled: gone from the queue, no step left" in err, err
    folder = _folder(runs)
    _nothing_left(slurm, _slurm_job(folder))  # verified before the submitter returned
    job = json.loads((folder / "job.json").read_text())
    assert job["status"] == "interrupted"  # the fleetctl inside tore the job down itself
    for i, h in enumerate(("node1", "node2", "node3")):
        assert (folder / f"{i}-{h}" / "console.log").is_file()


ROLE_SCRIPT = """\
import os
print("ROLE", os.environ["FLEET_ROLE"], os.environ["FLEET_NODE_RANK"], flush=True)
"""
ROLE_JOB = """\
name: two-roles
roles:
  server:
    instances: 1
    script: role.py
  worker:
    instances: 1
    script: role.py
"""


def test_a_role_job_submitted_with_json_prints_the_run_document(
    slurm: dict[str, Any], runs: Path
) -> None:
    """--job without --nodes: two nodes from the roles' instances; --json: stdout is the run's
    document alone (as `run --json` over SSH), naming the Slurm job."""
    code: Path = slurm["code"]
    (code / "role.py").write_text(ROLE_SCRIPT)
    (code / "roles.yml").write_text(ROLE_JOB)
    res = _submit(slurm, runs, "--json", "--job", "roles.yml")
    assert res.exit_code == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)  # nothing else on stdout
    folder = _folder(runs)
    assert doc["slurm"]["job_id"] == _slurm_job(folder) and doc["slurm"]["state"] == "COMPLETED"
    assert (doc["status"], doc["launcher"], doc["job_id"]) == ("succeeded", "roles", folder.name)
    assert [(n["rank"], n["host"], n["exit_code"]) for n in doc["nodes"]] == [
        (0, "node1", 0),
        (1, "node2", 0),
    ]
    assert "#SBATCH --nodes=2" in (folder / "sbatch.sh").read_text()
    assert (folder / "job-file" / "roles.yml").read_text() == ROLE_JOB
    for rank, (host, role) in enumerate((("node1", "server"), ("node2", "worker"))):
        log = (folder / f"{rank}-{host}" / "console.log").read_text()
        assert f"ROLE {role} {rank}" in log, log
    _nothing_left(slurm, _slurm_job(folder))


def test_without_a_shared_filesystem_the_run_folder_is_pulled_home(
    slurm: dict[str, Any], tmp_path: Path
) -> None:
    """--slurm-no-shared-fs with the runs folder under this machine's /tmp, which no lab host
    sees: the output is followed and the run folder pulled through srun steps on the batch
    host, which keeps nothing afterwards."""
    lab: Lab = slurm["lab"]
    (slurm["code"] / "hello.py").write_text(
        "import os\nprint('hello', os.environ['RANK'], flush=True)\n"
    )
    runs = tmp_path / "runs"
    res = run_cli_process(
        "run", "--slurm", "--slurm-no-shared-fs", "--nodes", "3", "--runs-dir", str(runs),
        "--launcher", "plain", "hello.py",
        env=slurm["env"], cwd=slurm["code"], timeout=120,
    )  # fmt: skip
    assert res.exit_code == 0, res.stdout + res.stderr
    for rank in range(3):  # followed live through the batch host
        assert f"hello {rank}" in res.stdout, res.stdout
    assert "run folder pulled from node1" in res.stderr, res.stderr
    folder = _folder(runs)
    job = json.loads((folder / "job.json").read_text())
    assert job["status"] == "succeeded" and job["folder"] == str(folder), job["folder"]
    for rank, host in enumerate(("node1", "node2", "node3")):
        assert f"hello {rank}" in (folder / f"{rank}-{host}" / "console.log").read_text()
    assert "hello 2" in (folder / "slurm.out").read_text()
    assert "job succeeded" in (folder / "slurm.err").read_text()
    left = lab.exec("node1", ["sh", "-c", "ls -d /tmp/fleetctl-slurm-* 2>/dev/null; true"])
    assert left.stdout.strip() == "", left.stdout  # the batch host keeps nothing
    _nothing_left(slurm, _slurm_job(folder))


def test_a_partition_slurm_lacks_is_one_line_exit_2_and_nothing_queued(
    slurm: dict[str, Any], runs: Path
) -> None:
    res = _submit(slurm, runs, "--nodes", "2", "--partition", "nope", "fail.py")
    assert res.exit_code == 2, res.stderr
    assert res.stderr.strip().splitlines() == [
        "fleetctl: error: Slurm refused the job: invalid partition specified: nope; "
        "Invalid partition name specified"
    ]
    assert _squeue(slurm) == "" and list(runs.iterdir()) == []


def test_more_nodes_than_the_partition_has_is_cancelled_exit_2(
    slurm: dict[str, Any], runs: Path
) -> None:
    res = _submit(slurm, runs, "--nodes", "5", "fail.py")
    assert res.exit_code == 2, res.stderr
    # slurmctld says either, by which of its schedulers looked at the job first
    said = re.search(r"can never start as asked \((\w+)\); cancelled", res.stderr)
    assert said and said[1] in ("PartitionConfig", "PartitionNodeLimit"), res.stderr
    assert _squeue(slurm) == ""


def test_a_job_that_waits_past_queue_timeout_is_cancelled_exit_5(
    slurm: dict[str, Any], runs: Path
) -> None:
    s: SlurmLab = slurm["slurm"]
    held, _ = s.allocate(3)  # every node busy: the submitted job must wait
    try:
        t0 = time.monotonic()
        res = _submit(slurm, runs, "--nodes", "3", "--queue-timeout", "3", "fail.py")
        assert res.exit_code == 5, res.stderr
        assert "PENDING (Resources)" in res.stderr or "PENDING (Priority)" in res.stderr
        assert "did not start within --queue-timeout 3s" in res.stderr
        assert time.monotonic() - t0 < 120  # not held by the allocation: it is held forever
        sj = _slurm_job(_folder(runs))
        assert _squeue(slurm, "-j", sj) == ""
        job = json.loads((_folder(runs) / "job.json").read_text())
        assert job["status"] == "cancelled"
    finally:
        s.cancel(held)


def test_detach_then_status_logs_and_stop_reach_the_slurm_job(
    slurm: dict[str, Any], runs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's status, then the library's ``Job.attach`` of the same submitted job: live
    status and lines, and a stop that leaves the queue empty and nothing on the nodes."""
    from fleetctl.api import Job
    from fleetctl.testing.jobs import assert_nothing_left, job_processes_left

    res = _submit(slurm, runs, "--nodes", "3", "--detach", "--launcher", "plain", "sleep.py")
    assert res.exit_code == 0, res.stderr
    sj, job_id = res.stdout.split()
    env, code = slurm["env"], slurm["code"]

    def started() -> bool:
        r = run_cli_process("status", "--runs-dir", str(runs), job_id, env=env, cwd=code)
        return "3 of 3 node(s) running" in r.stdout

    wait_for(started, 120, what="the detached Slurm job running on 3 nodes")
    st = run_cli_process("status", "--runs-dir", str(runs), job_id, env=env, cwd=code)
    assert f"Slurm job {sj}: RUNNING" in st.stdout, st.stdout + st.stderr

    monkeypatch.setenv("SLURM_CONF", env["SLURM_CONF"])  # this process asks Slurm too
    job = Job.attach(job_id[:12], runs)
    assert (job.job_id, job.executor, job.record.executor) == (job_id, "sbatch", "sbatch")
    assert job.submitted is not None and job.submitted.slurm_job_id == sj and not job.done
    report = job.status()
    assert report.slurm is not None and report.slurm["now"].startswith("RUNNING"), report
    assert (report.status, report.running_nodes) == ("running", 3), report.to_dict()
    seen: set[tuple[int, str]] = set()
    lines = job.lines(timeout=60)
    for line in lines:
        if line.text.startswith("started"):
            seen.add((line.node_rank, line.host))
        if len(seen) == 3:
            break
    lines.close()
    assert seen == {(0, "node1"), (1, "node2"), (2, "node3")}
    inventory = slurm["lab"].inventory_path
    assert sorted(job_processes_left(inventory, job_id)) == ["node1", "node2", "node3"]
    stopped = job.stop()
    assert stopped is not None and stopped.verified, stopped
    assert stopped.slurm is not None and stopped.slurm["job_id"] == sj
    assert job.done and job.status().slurm is not None
    _nothing_left(slurm, sj)
    assert_nothing_left(inventory, job_id)
    logs = run_cli_process("logs", "-f", "--runs-dir", str(runs), job_id, env=env, cwd=code)
    assert logs.exit_code == 0 and logs.stdout.count("started") == 3, logs.stdout


def _processes() -> dict[int, tuple[bytes, list[str]]]:
    """Every process this machine's /proc lists: pid → (command line, NSpid). The lab's hosts
    run in pid namespaces below this one, so their processes are here too (under other pids;
    the last NSpid is the pid the process sees itself)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes()
            status = (proc / "status").read_text()
        except OSError:  # ended meanwhile
            continue
        nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
        found[int(proc.name)] = (argv, nspid)
    return found


def _host_cmdlines(lab: Lab, host: str) -> list[str]:
    """Every command line a lab host's own /proc lists (its pid namespace), NULs as spaces;
    the reading shell's own holds no value (it only names /proc)."""
    dump = r"for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $f 2>/dev/null; echo; done"
    return lab.exec(host, ["sh", "-c", dump], check=True).stdout.splitlines()


def test_an_env_var_secret_is_on_no_command_line_of_the_cluster(
    slurm: dict[str, Any], runs: Path
) -> None:
    """``run --slurm --env-var SECRET_TOKEN=…``: while the job runs no process of the
    controller (slurmctld, this machine) or of any lab host (the batch script's fleetctl, srun
    steps, supervisors, ranks; each host's own /proc read too) has the value, or any option,
    on its command line; the run inside got them from run-spec.json (the ``RunSpec`` as JSON:
    the ranks have SECRET_TOKEN, and ``--tail 0`` reached the run inside: one rank's lines in
    slurm.out) (issues 35, 40). The submitter's own command line is the user's, typed on the
    login node: left aside."""
    import hashlib
    import secrets

    lab: Lab = slurm["lab"]
    secret = f"s3cret-{secrets.token_hex(8)}"
    gate = runs / "gate"
    gate.mkdir()
    proc = start_cli_process(
        "run", "--slurm", "--nodes", "2", "--launcher", "plain", "--runs-dir", str(runs),
        "--env-var", f"SECRET_TOKEN={secret}", "--tail", "0", "secret.py", str(gate),
        env=slurm["env"], cwd=slurm["code"],
    )  # fmt: skip
    try:
        wait_for(lambda: len(list(gate.glob("ready-*"))) == 2, 120, what="both ranks running")
        procs = _processes()
        on_hosts = {h.name: _host_cmdlines(lab, h.name) for h in lab.hosts}
        # the scan sees the job's processes: each rank (its pid as its node's namespace shows
        # it) is here, with SECRET_TOKEN in its environment
        for ready in gate.glob("ready-*"):
            ranks = [
                pid
                for pid, (argv, nspid) in procs.items()
                if b"secret.py" in argv and nspid[-1:] == [ready.read_text()]
            ]
            assert len(ranks) == 1, (ready.name, ranks)
            environ = Path(f"/proc/{ranks[0]}/environ").read_bytes().split(b"\0")
            assert f"SECRET_TOKEN={secret}".encode() in environ
        cmdlines = [
            argv.replace(bytes(1), b" ").decode(errors="replace")
            for pid, (argv, _) in procs.items()
            if pid != proc.pid
        ]
        # ... the controller's slurmctld, and each host's slurmd in that host's own /proc, with
        # the job's ranks on its 2 hosts
        assert any("slurmctld -D" in c for c in cmdlines)
        assert all(any("slurmd -D" in c for c in on_hosts[h.name]) for h in lab.hosts)
        assert sum(any("secret.py" in c for c in lines) for lines in on_hosts.values()) == 2
        # (this machine's other processes may be anyone's: the secret alone is this test's)
        holders = [c for c in cmdlines if secret in c]
        holders += [
            c
            for lines in on_hosts.values()
            for c in lines
            if secret in c or "--env-var" in c or "--tail" in c
        ]
        inside = [c for lines in on_hosts.values() for c in lines if " -m fleetctl run " in c]
        (gate / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        (gate / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert holders == [], holders
    (folder,) = (p for p in runs.iterdir() if p.is_dir() and p != gate)
    spec = folder / "run-spec.json"
    assert inside and all(
        c.split()[1:] == ["-m", "fleetctl", "run", f"--spec={spec}"] for c in inside
    ), inside
    assert proc.returncode == 0, out + err
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert out.count(f"SECRET_TOKEN {digest}") == 1, out  # --tail 0: rank 0's lines alone
    logs = [p.read_text() for p in folder.glob("*-node*/console.log")]
    assert sum(f"SECRET_TOKEN {digest}" in t for t in logs) == 2, logs
    doc = json.loads(spec.read_text())
    assert doc["format"] == "fleetctl-run-spec/1" and spec.stat().st_mode & 0o777 == 0o600
    assert doc["spec"]["program"]["env"] == {"SECRET_TOKEN": secret}
