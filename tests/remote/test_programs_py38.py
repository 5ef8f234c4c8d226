"""Every node program, run by Python 3.8 with real processes, sockets and files on this machine.

Each program is shipped as a node gets it (``python -c SOURCE`` or installed by the loader) and
answers in the one framing (``<tag> <payload>``), read back with the controller's decoder.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import io
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import node_tree

from fleetctl import remote
from fleetctl.node import Node
from fleetctl.phases.check.preflight import probe_command
from fleetctl.phases.check.report import HeldProbe
from fleetctl.phases.frames import (
    PROBE_KINDS,
    PUSH_KINDS,
    STACK_KINDS,
    FrameReader,
    decode,
    last_data,
)
from fleetctl.phases.launch import (
    LOADER,
    NodeRun,
    start_node,
    supervisor_path,
    supervisor_source,
)
from fleetctl.plan.launchers import LAUNCHERS
from fleetctl.remote.kit.wire import HEARTBEAT_FILE
from fleetctl.remote.programs.supervisor import (
    TAR_MARKER,
    find_job_processes,
    proc_stat,
    stop_processes,
)
from fleetctl.testing.envbuild import build_fake_nccl
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.transport.connection import LocalConnection

#: Job ids are unique per test process: stopping finds a job's processes machine-wide by its
#: id, and a test run of another checkout on the same machine must never stop ours.
RUN_TOKEN = str(os.getpid())


def jid(name: str) -> str:
    return f"{name}-{RUN_TOKEN}"


#: Every node module, by its path under fleetctl/remote/ (the installer's __init__ aside).
MODULES = sorted(
    str(p.relative_to(remote.HERE)) for p in remote.HERE.rglob("*.py") if p.name != "__init__.py"
)
#: Where the programs are, under fleetctl/remote/ (the names the installer takes).
PROGRAM_FOLDER = "".join(f"{p}/" for p in remote.PROGRAMS.split(".")[1:])
#: The node programs: the names the installer takes (``"supervisor.py"``).
SHIPPED = [n[len(PROGRAM_FOLDER) :] for n in MODULES if n.startswith(PROGRAM_FOLDER)]
ENTRY = "test_the_supervisor_installed_by_the_loader_runs_and_stops_a_real_job"
#: Which Python 3.8 test under tests/remote exercises each node module (program or shared
#: module): a new module without one fails the guard. Adding a program is one line here.
EXERCISED = {
    "kit/atomic.py": ENTRY,
    "programs/bootstrap.py": "test_the_check_probe_reports_facts_and_takes_part_in_a_mesh",
    "programs/collective.py": "test_the_collective_program_imports_without_torch_and_reads_ib_"
    "ports",
    "kit/container_guard.py": "test_the_container_guard_ends_the_containers_when_its_supervisor_"
    "dies",
    "kit/containers.py": "test_the_node_ends_every_container_of_the_job_by_label",
    "programs/envinfo.py": "test_envinfo_reads_the_nccl_version_and_imports_of_an_env",
    "programs/image_load.py": "test_the_image_loader_queries_loads_and_leaves_no_archive",
    "programs/image_probe.py": "test_the_image_probe_imports_the_launcher_and_finds_nccl",
    "programs/exec_timeout.py": "test_exec_timeout_stops_the_command_and_a_setsid_child_at_the_"
    "limit",
    "kit/facts.py": "test_the_check_probe_reports_facts_and_takes_part_in_a_mesh",
    "kit/finalize.py": "test_the_push_helper_probes_finalizes_and_verifies_an_env",
    "kit/framing.py": "test_python_3_8_writes_frames_as_json_would",
    "kit/health.py": "test_the_health_sources_are_read_under_3_8_from_a_lab_hosts_fakes",
    "kit/icmp.py": "test_the_probe_echoes_icmp_in_process_without_a_ping_binary",
    "kit/jobprocs.py": "test_the_job_scan_reads_no_kernel_threads_environment",
    "kit/keyscan.py": "test_rank_0s_new_files_are_packed_and_land_in_a_fresh_nodes_seeded_work_"
    "folder",
    "kit/modes.py": "test_a_closed_channel_is_not_the_end_a_reattach_resumes_the_stream_and_relays_"
    "the_stop",
    "kit/output.py": ENTRY,
    "kit/pace.py": "test_the_pace_sampler_tells_a_computing_rank_from_a_waiting_one",
    "kit/pack.py": "test_the_supervisors_tar_stream_reads_back_with_tarfile",
    "programs/port_probe.py": "test_the_port_probe_skips_a_port_that_is_in_use",
    "kit/portclaims.py": "test_a_claim_folder_name_taken_by_a_link_or_a_file_is_passed_over",
    "programs/probe.py": "test_the_check_probe_reports_facts_and_takes_part_in_a_mesh",
    "kit/progress.py": "test_python_3_8_reads_the_markers_of_every_shape_as_the_controller_does",
    "kit/procfs.py": "test_the_job_scan_reads_no_kernel_threads_environment",
    "programs/push_helper.py": "test_the_push_helper_probes_finalizes_and_verifies_an_env",
    "kit/pushbase.py": "test_the_push_helper_probes_finalizes_and_verifies_an_env",
    "kit/ranks.py": "test_the_supervisor_says_once_when_every_rank_ended_before_its_launcher",
    "kit/ranktail.py": "test_the_job_begins_at_a_ranks_first_line_not_at_its_launchers",
    "kit/rankwatch.py": "test_the_supervisor_says_once_when_every_rank_ended_before_its_launcher",
    "kit/records.py": "test_python_3_8_reads_every_record_case_as_the_controller_does",
    "kit/relay.py": "test_rank_0s_new_files_are_packed_and_land_in_a_fresh_nodes_seeded_work_"
    "folder",
    "kit/spec.py": ENTRY,
    "programs/stacks.py": "test_stacks_dumps_a_rank_with_py_spy_and_falls_back_to_faulthandler",
    "programs/stacksample.py": "test_stacksample_tallies_a_ranks_samples_and_says_when_py_spy_is_"
    "absent",
    "kit/supervision.py": ENTRY,
    "programs/supervisor.py": ENTRY,
    "kit/waits.py": "test_the_check_probe_reports_facts_and_takes_part_in_a_mesh",
    "kit/wire.py": ENTRY,
    "kit/workdirs.py": "test_the_probe_and_the_push_helper_install_themselves_then_run_from_cached_"
    "bytecode",
}
Run = Callable[..., subprocess.CompletedProcess[bytes]]
JOB = "setsid sleep 300 & sleep 300 & echo up; wait"


def wait_for(what: str, check: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


def test_every_module_in_fleetctl_remote_has_a_python_3_8_test() -> None:
    """The guard: every node module names a test of this tier that exists, and that test
    runs code of the module (its program's bundle holds it, or it is the program)."""
    assert sorted(EXERCISED) == MODULES, "a node module without a Python 3.8 test"
    here = Path(__file__).parent
    defined = set()
    for f in here.glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_\w+)\(", f.read_text(), re.M))
    assert {m: t for m, t in EXERCISED.items() if t not in defined} == {}
    shipped = {"/".join(m.split(".")[1:]) + ".py" for name in SHIPPED for m in remote.modules(name)}
    assert shipped == set(MODULES)


@pytest.mark.parametrize("name", SHIPPED)
def test_every_program_fits_in_one_argument_each_way_it_is_shipped(name: str) -> None:
    """argv stays under Linux's 128 KiB per argument (``remote.argument_sizes``: inline, the
    argv entrance's code and bundle, the stdin entrance; tests/pure keeps a margin)."""
    sizes = remote.argument_sizes(name)
    assert max(sizes.values()) < remote.MAX_ARG_STRLEN, sizes


@pytest.mark.parametrize("name", [*MODULES, "__init__.py"])
def test_every_file_compiles_under_python_3_8(py38: str, name: str) -> None:
    path = remote.HERE / name
    res = subprocess.run(
        [py38, "-c", "import sys; compile(open(sys.argv[1]).read(), sys.argv[1], 'exec')", path],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr


# ------------------------------------------------------------------------------- supervisor


class Jobs:
    """Jobs under a Python 3.8 supervisor in a temp workdir; stops what is left at the end."""

    def __init__(self, root: Path, python: str) -> None:
        self.root, self.python = root, python
        self.node = Node.localhost(workdir=str(root / "w"), python=python)
        self.conn = LocalConnection(self.node)
        self.ids: list[str] = []

    def run_dir(self, job_id: str) -> str:
        return str(self.root / "w" / "runs" / job_id)

    def start(
        self, job_id: str, argv: list[str], held: HeldProbe | None = None, **spec: object
    ) -> NodeRun:
        """Start a job; ``held``: through that check probe still on its channel."""
        self.ids.append(job_id)
        full = {
            "job_id": job_id,
            "node_rank": 0,
            "argv": argv,
            "env": {},
            "cwd": str(self.root),
            "run_dir": self.run_dir(job_id),
            "deadman": 10,
            "grace": 1,
            "heartbeat": 0.5,
            **spec,
        }
        return start_node(self.node, self.conn, full, python=self.python, held=held)

    def mode(self, *args: str, stdin: bytes | None = None) -> bytes:
        """A one-shot mode of the installed supervisor; its whole stdout."""
        sup = supervisor_path(str(self.root / "w"))
        res = subprocess.run(
            remote.file_argv(self.python, sup, *args),
            capture_output=True,
            timeout=60,
            **({"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}),
        )
        assert res.returncode == 0, res.stderr
        return res.stdout

    def close(self) -> None:
        for j in self.ids:
            stop_processes(j, None, None, None, 0.0)


@pytest.fixture
def jobs(tmp_path: Path, py38: str) -> Iterator[Jobs]:
    j = Jobs(tmp_path, py38)
    try:
        yield j
    finally:
        j.close()


def drain(run: NodeRun, timeout: float = 60.0) -> list[tuple[str, str]]:
    """Every frame until the stream ends, heartbeating; says goodbye once ``X`` arrived. The
    limit only ends a hang: a supervisor started afresh (a Python 3.8 start, its bundle, the
    job) took over 20 s at load ~25."""
    frames = [(f.kind, f.text) for f in run.pending]
    reader: FrameReader = run.reader
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            run.stream.send(b"h")
        data = run.stream.recv(0.3)
        if data is None:
            continue
        for f in reader.feed(data) if data else reader.flush():
            frames.append((f.kind, f.text))
            if f.kind == "X":
                with contextlib.suppress(OSError, EOFError):
                    run.stream.close_stdin()
        if not data:
            return frames
    raise AssertionError(f"supervisor did not end within {timeout}s: {frames[-5:]}")


def test_the_supervisor_installed_by_the_loader_runs_and_stops_a_real_job(jobs: Jobs) -> None:
    run = jobs.start(jid("p-run"), ["sh", "-c", "echo $FLEET_JOB_ID; kill -9 $$"])
    assert run.uploaded  # the loader (Python 3.8) installed it
    frames = drain(run)
    assert ("L", jid("p-run")) in frames and frames[-1][0] == "X"
    assert frames[-1][1].split(" ", 1)[0] == "-9"

    run = jobs.start(jid("p-stop"), ["sh", "-c", JOB])
    assert not run.uploaded
    wait_for("the job's processes", lambda: len(find_job_processes(jid("p-stop"), 0)) >= 3)
    status = last_data(jobs.mode("status", "--run-dir", jobs.run_dir(jid("p-stop"))))
    assert status["state"] == "running" and status["supervisor_alive"]
    assert len(status["processes"]) >= 3
    out = jobs.mode(
        "stop",
        "--job-id",
        jid("p-stop"),
        "--run-dir",
        jobs.run_dir(jid("p-stop")),
        "--grace",
        "0.5",
    )
    [frame] = decode(out)
    assert frame.kind == "D"
    stopped = frame.data()
    assert stopped["remaining"] == [] and len(stopped["found"]) >= 3
    assert find_job_processes(jid("p-stop"), None) == []
    assert drain(run)[-1][0] == "X"


# --image's runtime client, faked: ``two`` is rootless podman's (a parent that SIGTERM ends with
# 0, a half that ignores it and waits for the container), ``one`` a client that SIGTERM ends
# with 0 before its container ran (podman caught early), ``seen`` one that does so after the
# runtime wrote the container's main pid (itself here; podman racing its signal proxy). It
# says it is ready in the run folder.
FAKE_CLIENT = """\
import os, signal, sys, time
if sys.argv[1] == "seen" and "LOCAL_RANK" not in os.environ:  # a rank to the supervisor's scan
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "LOCAL_RANK": "0"})
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] == "two" and os.fork() == 0:
    time.sleep(60)
    os._exit(5)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
run_dir = os.environ["FLEET_RUN_DIR"]
if sys.argv[1] == "seen":
    open(os.path.join(run_dir, "container.pid"), "w").write(str(os.getpid()))
    while not os.path.exists(os.path.join(run_dir, "rank_pids.json")):  # the scan saw it
        time.sleep(0.05)
open(os.path.join(run_dir, "ready"), "w").close()
time.sleep(60)
"""


@pytest.mark.parametrize(("kind", "code"), [("two", "-9"), ("one", "-15"), ("seen", "-15")])
def test_a_runtime_client_that_a_stop_ends_with_0_is_no_success(
    jobs: Jobs, tmp_path: Path, py38: str, kind: str, code: str
) -> None:
    """A stop's SIGTERM ends the client with 0: the node's code is the half's that still waited
    for the container (killed by the stop after the grace), or SIGTERM's where no container ran
    (its main pid never found) or where nothing shows the container had ended before the stop
    (its main pid seen) — never a 0 that would count the node as succeeded."""
    job = jid(f"p-client-{kind}")
    fake = tmp_path / "client.py"
    fake.write_text(FAKE_CLIENT)
    container = {"list": ["true"], "stop": ["true"], "remove": ["true"], "pid": ["echo", "0"]}
    if kind == "seen":
        container["pidfile"] = str(Path(jobs.run_dir(job)) / "container.pid")
    run = jobs.start(job, [py38, str(fake), kind], container=container)
    ready = Path(jobs.run_dir(job)) / "ready"
    wait_for("the client ready", ready.exists)
    where = ("--job-id", job, "--run-dir", jobs.run_dir(job))
    jobs.mode("mark-stop", *where, "--reason", "stopped by fleetctl stop")  # as `fleetctl stop`
    jobs.mode("stop", *where, "--grace", "0.5")
    frames = drain(run)
    assert frames[-1][0] == "X" and frames[-1][1].split(" ", 1)[0] == code, frames[-3:]


def _alive_with_cmdline(cmdline: bytes) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{name}/cmdline").read_bytes() == cmdline:
                    st = proc_stat(int(name))
                    if st is not None and st[0] not in ("Z", "X"):
                        out.append(int(name))
    return out


def test_a_descendant_that_leaves_session_group_and_env_is_still_stopped(jobs: Jobs) -> None:
    """``setsid env -i sleep …`` in a subshell that exits at once: no job env tag, another
    session and group, and orphaned — the supervisor, its subreaper, still owns it."""
    marker = f"4{RUN_TOKEN}"
    escapee = b"sleep\0" + marker.encode() + b"\0"
    job = jid("p-escape")
    run = jobs.start(job, ["sh", "-c", f"(setsid env -i sleep {marker} &); echo up; sleep 300"])
    wait_for("the escapee", lambda: _alive_with_cmdline(escapee))
    [pid] = _alive_with_cmdline(escapee)
    status = last_data(jobs.mode("status", "--run-dir", jobs.run_dir(job)))
    st = proc_stat(pid)
    assert st is not None and st[1] == status["supervisor_pid"]  # re-parented to the subreaper
    assert st[2] != status["pgid"] and pid not in find_job_processes(job, None, status["pgid"])
    out = jobs.mode("stop", "--job-id", job, "--run-dir", jobs.run_dir(job), "--grace", "0.5")
    stopped = last_data(out)
    assert pid in stopped["found"] and stopped["remaining"] == []
    assert _alive_with_cmdline(escapee) == []
    assert drain(run)[-1][0] == "X"


def test_the_supervisor_says_when_the_job_touches_its_progress_file(jobs: Jobs) -> None:
    run = jobs.start(
        jid("p-progress"),
        ["sh", "-c", 'sleep 0.5; touch "$FLEET_PROGRESS_FILE"; echo touched; sleep 300'],
    )
    seen: list[str] = []
    deadline = time.monotonic() + 20
    while "P" not in seen and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            run.stream.send(b"h")
        data = run.stream.recv(0.3)
        seen += [f.kind for f in run.reader.feed(data or b"")]
    assert "P" in seen, seen
    progress = Path(jobs.run_dir(jid("p-progress"))) / "progress"
    assert progress.is_file()  # FLEET_PROGRESS_FILE is in the node run folder
    run.stream.send(b"k")
    assert drain(run)[-1][0] == "X"


def test_the_supervisor_modes_mark_follow_clean_and_pack_a_run_folder(jobs: Jobs) -> None:
    run = jobs.start(jid("p-modes"), ["sh", "-c", "echo one; echo two; sleep 300"])
    run_dir = jobs.run_dir(jid("p-modes"))
    wait_for("the job's output", lambda: "two" in Path(run_dir, "console.log").read_text())

    clean = last_data(
        jobs.mode("clean", "--workdir", str(jobs.root / "w"), "--job-id", jid("p-modes"))
    )
    assert {p["job_id"] for p in clean["processes"]} == {jid("p-modes")}
    assert len(clean["processes"]) >= 2 and clean["temp_files"] == []

    marked = jobs.mode(
        "mark-stop", "--run-dir", run_dir, "--job-id", jid("p-modes"), "--reason", "r"
    )
    assert last_data(marked) == {"marked": True}
    request = json.loads(Path(run_dir, "stop-request.json").read_text())
    assert request["job_id"] == jid("p-modes") and request["reason"] == "r"
    nowhere = str(jobs.root / "nowhere")
    assert last_data(jobs.mode("mark-stop", "--run-dir", nowhere, "--job-id", "x")) == {
        "marked": False
    }

    tail = decode(jobs.mode("follow", "--run-dir", run_dir, "--follow", "0", "--last", "1"))
    assert [(f.kind, f.text) for f in tail] == [("L", "two")]

    run.stream.send(b"t")
    frames = drain(run)
    assert any(k == "E" and "stopping job" in t for k, t in frames), frames
    # Following a finished job reads it to the end and stops by itself.
    whole = decode(jobs.mode("follow", "--run-dir", run_dir, "--follow", "1", "--last", "-1"))
    assert [(f.kind, f.text) for f in whole] == [("L", "one"), ("L", "two")]
    missing = decode(jobs.mode("follow", "--run-dir", nowhere, "--follow", "0", "--last", "-1"))
    assert [f.kind for f in missing] == ["E"]

    Path(jobs.root / "w" / "code").mkdir(parents=True)
    Path(jobs.root / "w" / "code" / ".tmp-left").mkdir()
    clean = last_data(
        jobs.mode("clean", "--workdir", str(jobs.root / "w"), "--job-id", jid("p-modes"))
    )
    assert clean["processes"] == []
    assert clean["temp_files"] == [str(jobs.root / "w" / "code" / ".tmp-left")]

    packed = jobs.mode("pack", "--run-dir", run_dir)
    assert packed.startswith(TAR_MARKER)
    with tarfile.open(fileobj=io.BytesIO(packed[len(TAR_MARKER) :]), mode="r|") as tar:
        names = {m.name for m in tar}
    assert {"console.log", "supervisor.json", "stop-request.json"} <= names

    # told on stdin what is home and what to leave: the manifest first, then only the rest
    Path(run_dir, "model.pt").write_bytes(b"x" * 5000)
    home = os.stat(Path(run_dir, "console.log"))
    opts = {
        "max": 4000,
        "exclude": ["stop-*"],
        "have": {"console.log": [home.st_size, int(home.st_mtime)]},
    }
    packed = jobs.mode(
        "pack", "--run-dir", run_dir, "--stdin", "1", stdin=json.dumps(opts).encode()
    )
    assert packed.startswith(TAR_MARKER)
    with tarfile.open(fileobj=io.BytesIO(packed[len(TAR_MARKER) :]), mode="r|") as tar:
        members = [(m.name, tar.extractfile(m).read() if m.isfile() else b"") for m in tar]
    names = [n for n, _ in members]
    assert names[0] == ".fleetctl-collect.json" and "supervisor.json" in names
    assert not {"console.log", "model.pt", "stop-request.json"} & set(names)
    reasons = {f["path"]: f.get("reason") for f in json.loads(members[0][1])["files"]}
    assert reasons["console.log"] == "home" and reasons["model.pt"] == "over cap"
    assert reasons["stop-request.json"] == "excluded" and reasons["supervisor.json"] is None


# ------------------------------------------------------------------------------------ probe


def fake_env(root: Path, python: str) -> Path:
    """An env folder whose ``bin/python`` is ``python`` and whose NCCL is a gcc-built stand-in."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(python)
    build_fake_nccl(root / "lib" / "libnccl.so.2", "2.21.5")
    return root


def env_archive(tmp_path: Path, python: str) -> tuple[bytes, str]:
    """A conda-pack-like archive of a fake env, and its sha256."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(fake_env(tmp_path / "src-env", python), arcname=".")
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def test_envinfo_reads_the_nccl_version_and_imports_of_an_env(run38: Run, tmp_path: Path) -> None:
    env = fake_env(tmp_path / "env", "/bin/false")
    query = json.dumps({"prefix": str(env), "imports": ["json", "no_such_mod"], "torch": True})
    res = run38("envinfo.py", [query])
    info = last_data(res.stdout)
    assert info["python"].startswith("3.8.")
    assert info["nccl"] == "2.21.5" and info["nccl_code"] == 22105
    assert info["nccl_path"] == str(env / "lib" / "libnccl.so.2") and "nccl_error" not in info
    assert not info["imports"]["json"].startswith("error")
    assert info["imports"]["no_such_mod"].startswith("error: ModuleNotFoundError")
    assert "torch_error" in info  # no torch in a bare 3.8


def test_the_check_probe_reports_facts_and_takes_part_in_a_mesh(py38: str, tmp_path: Path) -> None:
    env = fake_env(tmp_path / "w" / "envs" / "e1", py38)
    args = {
        "address": "127.0.0.1",
        "nic": "lo",
        "train_addr": "127.0.0.1",
        "workdir": str(tmp_path / "w"),
        "ports": [],
        "allow_loopback": True,
        "env_dir": str(env),
        "env_imports": ["json"],
        "envinfo": remote.inline("envinfo.py"),
        "code_dir": "code/abc",
        "mesh": True,
        "mesh_port": 42000 + os.getpid() % 2000,
        "mesh_span": 64,
        "avoid_ports": [],
        "peer_wait": 30,
        "mesh_timeout": 2,
        "linger": 30,
        "launcher_module": "json.decoder",
    }
    proc = subprocess.Popen(
        probe_command(py38, args),
        shell=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdin is not None and proc.stdout is not None
    reader = FrameReader(kinds=PROBE_KINDS)
    got: dict = {}
    try:
        while "R" not in got:
            line = proc.stdout.readline()
            assert line, f"probe ended early: {got}"
            for fr in reader.feed(line):
                got[fr.kind] = fr.data()
        facts, port = got["D"], got["R"]
        assert facts["python"]["version"].startswith("3.8.")
        assert facts["nic"]["name"] == "lo" and facts["nic"]["addr"] == "127.0.0.1"
        assert facts["code_present"] is False and facts["disk"]["free"] > 0
        assert facts["env"]["present"] and facts["env"]["nccl"] == "2.21.5", facts["env"]
        assert not facts["env"]["imports"]["json"].startswith("error")
        assert facts["launcher"] == {"module": "json.decoder", "version": "2.0.9"}
        peers = {"peers": [{"name": "self", "addr": "127.0.0.1", "port": port}]}
        proc.stdin.write(json.dumps(peers).encode() + b"\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        [mesh] = reader.feed(line)
        assert mesh.kind == "M"
        assert mesh.data()["peers"]["self"]["tcp"] == "ok"
        # ICMP from inside the probe (a raw or datagram socket), no ping process per peer
        assert mesh.data()["peers"]["self"]["ping"] == "ok"
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        assert proc.wait(30) == 0


def test_the_probe_echoes_icmp_in_process_without_a_ping_binary(py38: str, tmp_path: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from remote.programs import probe; "
        "print(probe.icmp_echo('127.0.0.1', '127.0.0.1', 2.0))"
    )
    env = {**os.environ, "PATH": str(tmp_path)}  # no `ping` to fall back on
    out = subprocess.run(
        [py38, "-c", code, node_tree()],
        capture_output=True, text=True, timeout=30, env=env, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "ok", out.stderr


def test_the_check_probe_names_the_launcher_module_its_python_cannot_import(
    py38: str, tmp_path: Path
) -> None:
    args = {
        "address": "127.0.0.1",
        "nic": "lo",
        "workdir": str(tmp_path / "w"),
        "allow_loopback": True,
        "launcher_module": "torch.distributed.run",
    }
    out = subprocess.run(
        probe_command(py38, args), shell=True, capture_output=True, timeout=120, check=True
    )
    facts = last_data(out.stdout.decode())
    assert facts["launcher"] == {
        "module": "torch.distributed.run",
        "error": "ModuleNotFoundError: No module named 'torch'",
    }


# ------------------------------------------------------------------------------- push helper


def test_the_push_helper_sweeps_dead_pushes_and_two_pushes_of_one_snapshot_both_land(
    run38, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    w = tmp_path / "w"
    code = w / "code"

    def helper(mode: str, cfg: dict) -> dict:
        res = run38("push_helper.py", [mode], stdin=json.dumps(cfg).encode() + b"\n")
        frames = decode(res.stdout, PUSH_KINDS)
        assert [f.kind for f in frames] == ["D"], res
        return frames[0].data()

    helper("probe", {"workdir": str(w), "digest": "d0"})  # lays out the workdir
    # a push killed 20 min ago (nothing written since) and one writing right now
    dead, live = code / ".tmp-d9-dead", code / ".tmp-d9-live"
    for d in (dead, live):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f.py").write_text("x")
    old = time.time() - 1200
    for p in (dead / "sub" / "f.py", dead / "sub", dead):
        os.utime(p, (old, old))
    helper("probe", {"workdir": str(w), "digest": "d1"})
    assert not dead.exists() and live.exists()
    # two pushes of one snapshot, each in its own temp dir: both succeed, one folder results
    for tmp in (".tmp-d2-a", ".tmp-d2-b"):
        (code / tmp).mkdir()
        (code / tmp / "train.py").write_text("print(1)\n")
        out = helper("finalize", {"workdir": str(w), "code": {
            "digest": "d2", "tmp": tmp, "manifest": {"train.py": ["f", "0", 420]}}})  # fmt: skip
        assert out["code_dir"] == str(code / "d2")
    assert sorted(p.name for p in code.iterdir() if p.name.startswith(".tmp-d2")) == []
    assert (code / "d2" / "train.py").read_text() == "print(1)\n"


def test_a_finalized_code_snapshot_is_flushed_to_disk_before_it_counts(
    py38: str, tmp_path: Path
) -> None:
    """A VM reset right after a push left its script 0 bytes, and the retry ran it: the new
    files, their folder and the rename are fsynced (strace sees it); a file linked from the
    previous snapshot is not flushed again."""
    if shutil.which("strace") is None:
        skip_or_fail("needs strace (apt-get install strace)")
    code = tmp_path / "w" / "code"
    tmp = code / ".tmp-d3-a"
    tmp.mkdir(parents=True)
    (tmp / "train.py").write_text("print(1)\n")
    (code / "d2").mkdir()
    (code / "d2" / "old.py").write_text("x\n")
    os.link(code / "d2" / "old.py", tmp / "old.py")
    cfg = {"workdir": str(tmp_path / "w"), "code": {"digest": "d3", "tmp": tmp.name, "manifest": {
        "train.py": ["f", "0", 420], "old.py": ["f", "0", 420]}}}  # fmt: skip
    res = subprocess.run(
        ["strace", "-f", "-y", "-e", "trace=fsync", py38, remote.NO_SITE, "-c",
         remote.inline("push_helper.py"), "finalize"],
        input=json.dumps(cfg).encode() + b"\n", capture_output=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    synced = re.findall(r"fsync\(\d+<([^>]*)>\) = 0", res.stderr.decode())
    assert str(tmp / "train.py") in synced and str(tmp) in synced, synced
    assert str(code) in synced and str(tmp / "old.py") not in synced, synced
    assert (code / "d3" / "train.py").read_text() == "print(1)\n"


def traced_flushes(argv: list[str], stdin: bytes = b"") -> list[tuple[str, ...]]:
    """``argv`` run under strace: its fsyncs ``("fsync", path)`` and renames ``("rename", from,
    to)`` in the order they happened (a flush before a rename is what makes it durable)."""
    if shutil.which("strace") is None:
        skip_or_fail("needs strace (apt-get install strace)")
    res = subprocess.run(
        ["strace", "-f", "-y", "-e", "trace=fsync,rename,renameat,renameat2", *argv],
        input=stdin, capture_output=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return [
        ("fsync", m[0]) if m[0] else ("rename", m[1], m[2])
        for m in re.findall(
            r'(?:fsync\(\d+<([^>]*)>\)|rename\w*\([^"]*"([^"]*)", [^"]*"([^"]*)"[^)]*\)) = 0',
            res.stderr.decode(),
        )
    ]


def test_a_code_snapshots_manifest_is_flushed_before_and_after_its_rename(
    py38: str, tmp_path: Path
) -> None:
    """The manifest says what the next push may link from this snapshot: its file is fsynced
    before the rename that makes it count, and its folder after, as the snapshot's are
    (strace sees it), so a reset never leaves an empty manifest behind a whole snapshot."""
    code = tmp_path / "w" / "code"
    tmp = code / ".tmp-d4-a"
    tmp.mkdir(parents=True)
    (tmp / "train.py").write_text("print(1)\n")
    cfg = {"workdir": str(tmp_path / "w"), "code": {
        "digest": "d4", "tmp": tmp.name, "manifest": {"train.py": ["f", "0", 420]}}}  # fmt: skip
    argv = [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "finalize"]
    calls = traced_flushes(argv, json.dumps(cfg).encode() + b"\n")
    manifest = code / ".manifests" / "d4.json"
    [moved] = [i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == str(manifest)]
    assert ("fsync", calls[moved][1]) in calls[:moved], calls
    assert ("fsync", str(code / ".manifests")) in calls[moved + 1 :], calls
    assert json.loads(manifest.read_text()) == {"train.py": ["f", "0", 420]}


def test_an_unpacked_env_is_flushed_to_disk_before_its_folder_counts_as_present(
    py38: str, tmp_path: Path
) -> None:
    """The env's folder is the mark that it is present: every file unpacked (also the ones the
    archive links among its own), every folder, then the rename and the envs folder are
    fsynced, in that order (strace sees it), so a reset never leaves an env of empty files."""
    src = tmp_path / "src"
    (src / "lib" / "sub").mkdir(parents=True)
    (src / "lib" / "a.py").write_text("A = 1\n")
    os.link(src / "lib" / "a.py", src / "lib" / "sub" / "b.py")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(src, arcname=".")
    data = buf.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    envs = tmp_path / "w" / "envs"
    envs.mkdir(parents=True)
    (envs / "upload.tar.gz").write_bytes(data)
    cfg = {"workdir": str(tmp_path / "w"), "env": {"sha": sha, "archive": "upload.tar.gz"}}
    argv = [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "finalize"]
    calls = traced_flushes(argv, json.dumps(cfg).encode() + b"\n")
    [moved] = [i for i, c in enumerate(calls) if c[0] == "rename" and c[2] == str(envs / sha)]
    tmp = calls[moved][1]
    before = {c[1] for c in calls[:moved] if c[0] == "fsync"}
    assert {f"{tmp}/lib/a.py", f"{tmp}/lib/sub/b.py", f"{tmp}/lib/sub", tmp} <= before, calls
    assert ("fsync", str(envs)) in calls[moved + 1 :], calls
    assert (envs / sha / "lib" / "sub" / "b.py").read_text() == "A = 1\n"


def test_the_push_helper_probes_finalizes_and_verifies_an_env(
    run38, py38: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    w = tmp_path / "w"
    envinfo = remote.inline("envinfo.py")

    def helper(mode: str, cfg: dict) -> dict:
        res = run38("push_helper.py", [mode], stdin=json.dumps(cfg).encode() + b"\n")
        frames = decode(res.stdout, PUSH_KINDS)
        assert [f.kind for f in frames] == ["D"], res
        return frames[0].data()

    probe = helper("probe", {"workdir": str(w), "digest": "d1", "env_sha": "0" * 64})
    assert probe["code_present"] is False and probe["env_present"] is False
    assert probe["free"] > 0 and probe["workdir"] == str(w)

    data, sha = env_archive(tmp_path, py38)
    (w / "envs" / "upload.tar.gz").write_bytes(data)
    cfg = {
        "workdir": str(w),
        "envinfo": envinfo,
        "env": {"sha": sha, "archive": "upload.tar.gz", "size": len(data)},
    }
    done = helper("finalize", cfg)
    assert done["env_dir"] == str(w / "envs" / sha)
    assert done["verify"]["nccl_code"] == 22105, done
    assert done["verify"]["python"].startswith("3.8.")
    assert not (w / "envs" / "upload.tar.gz").exists()
    again = helper("probe", {"workdir": str(w), "env_sha": sha, "envinfo": envinfo})
    assert again["env_present"] and again["verify"]["nccl_code"] == 22105

    served = w / "envs" / "serve.bin"
    served.write_bytes(b"payload")
    serve_cfg = {"path": str(served), "sha": "s1", "token": "t0k", "bind": "127.0.0.1"}
    proc = subprocess.Popen(
        [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(serve_cfg).encode() + b"\n")
        proc.stdin.flush()
        [addr] = FrameReader(kinds=PUSH_KINDS).feed(proc.stdout.readline())
        assert addr.kind == "A"
        conn = http.client.HTTPConnection("127.0.0.1", addr.data()["port"], timeout=10)
        conn.request("GET", "/s1", headers={"Authorization": "Bearer t0k"})
        assert conn.getresponse().read() == b"payload"
        conn.close()
    finally:
        proc.stdin.close()
    assert last_data(proc.stdout.read()) == {"served": 1}
    assert proc.wait(30) == 0


# -------------------------------------------------------------------------------- port probe


def test_the_port_probe_skips_a_port_that_is_in_use(run38: Run) -> None:
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    busy_port = busy.getsockname()[1]
    free = socket.socket()
    free.bind(("0.0.0.0", 0))
    free_port = free.getsockname()[1]
    free.close()
    try:
        res = run38(
            "port_probe.py",
            [json.dumps({"candidates": [busy_port, free_port], "need": 1})],
        )
    finally:
        busy.close()
    assert last_data(res.stdout) == {"free": [free_port], "busy": {str(busy_port): "in use"}}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("0.0.0.0", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_a_port_claimed_for_one_job_is_skipped_by_another_until_its_owner_is_gone(
    run38: Run, tmp_path: Path
) -> None:
    env = {**os.environ, "FLEETCTL_PORT_CLAIMS": str(tmp_path / "claims")}
    p1, p2, p3 = _free_ports(3)

    def claim(job: str, cands: list[int]) -> dict:
        arg = json.dumps({"candidates": cands, "need": 1, "claim": {"job": job}})
        return last_data(run38("port_probe.py", [arg], env=env).stdout)

    assert claim("A", [p1, p2]) == {"free": [p1], "busy": {}}
    assert json.loads((tmp_path / "claims" / str(p1)).read_text())["job"] == "A"
    assert claim("A", [p1]) == {"free": [p1], "busy": {}}  # its own claim: still its own
    assert claim("B", [p1, p2]) == {"free": [p2], "busy": {str(p1): "reserved by fleetctl job A"}}
    # A's supervisor adopted the claim and is gone (a dead pid): the claim is stale, B takes it.
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "claims" / str(p1)).write_text(json.dumps({"job": "A", "pid": dead.pid}))
    assert claim("C", [p1]) == {"free": [p1], "busy": {}}
    # ... while a live owner (this test process, its start time recorded) keeps it.
    stat = Path(f"/proc/{os.getpid()}/stat").read_bytes()
    start = int(stat[stat.rindex(b")") + 2 :].split()[19])
    (tmp_path / "claims" / str(p1)).write_text(
        json.dumps({"job": "D", "pid": os.getpid(), "start": start})
    )
    assert claim("E", [p1]) == {"free": [], "busy": {str(p1): "reserved by fleetctl job D"}}
    # a job gives back what it claimed (paddle's span taken elsewhere): only its own claims
    assert claim("F", [p3]) == {"free": [p3], "busy": {}}
    gone = json.dumps({"unclaim": {"job": "F", "ports": [p1, p3]}})
    assert last_data(run38("port_probe.py", [gone], env=env).stdout) == {"unclaimed": 2}
    assert not (tmp_path / "claims" / str(p3)).exists()
    assert json.loads((tmp_path / "claims" / str(p1)).read_text())["job"] == "D"  # not F's


# ----------------------------------------------------------------------------------- stacks

STUCK = """\
import time
def waiting_in_a_collective():
    time.sleep(300)
print("up", flush=True)
waiting_in_a_collective()
"""


@contextlib.contextmanager
def stuck_rank(py38: str, job: str, rank: int) -> Iterator[subprocess.Popen[bytes]]:
    """A Python 3.8 "rank" of ``job`` asleep in a function, up before the body runs; killed
    after it."""
    env = {**os.environ, "FLEET_JOB_ID": job, "RANK": str(rank)}
    child = subprocess.Popen([py38, "-c", STUCK], env=env, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        yield child
    finally:
        child.kill()
        child.wait(10)


def test_stacks_dumps_a_rank_with_py_spy_and_falls_back_to_faulthandler(
    py38: str, run38: Run, tmp_path: Path
) -> None:
    from fleetctl.phases.stacks import local_py_spy

    py_spy = local_py_spy()
    assert py_spy is not None, "py-spy comes with the test extras (pip install -e '.[test]')"
    job = jid("t-stacks")
    env = {**os.environ, "FLEET_JOB_ID": job, "RANK": "3", "PYTHONFAULTHANDLER": "1"}
    err = tmp_path / "stderr"
    with err.open("wb") as f:
        child = subprocess.Popen([py38, "-c", STUCK], env=env, stdout=subprocess.PIPE, stderr=f)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"up\n"
        args = {"job_id": job, "run_dir": str(tmp_path / "run"), "py_spy": str(py_spy)}
        res = run38("stacks.py", [json.dumps({**args, "abort": False})])
        assert res.returncode == 0, res.stderr
        frames = decode(res.stdout, STACK_KINDS)
        [proc] = [f.data() for f in frames if f.kind == "K"]
        assert proc["pid"] == child.pid and proc["rank"] == 3 and proc["method"] == "py-spy"
        assert "waiting_in_a_collective" in proc["text"]
        saved = tmp_path / "run" / "stacks" / f"{child.pid}.txt"
        assert saved.read_text() == proc["text"] and saved.stat().st_mode & 0o077 == 0
        assert child.poll() is None  # py-spy reads the stack; the job goes on

        # No py-spy that works: with abort the process dies printing every thread itself.
        res = run38("stacks.py", [json.dumps({**args, "py_spy": "/nonexistent", "abort": True})])
        assert res.returncode == 0, res.stderr
        [proc] = [f.data() for f in decode(res.stdout, STACK_KINDS) if f.kind == "K"]
        assert proc["method"] == "faulthandler" and "py-spy" in proc["error"]
        assert child.wait(30) == -6  # SIGABRT
        assert "in waiting_in_a_collective" in err.read_text()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def test_stacksample_tallies_a_ranks_samples_and_says_when_py_spy_is_absent(
    py38: str, run38: Run
) -> None:
    from fleetctl.phases.stacks import local_py_spy

    py_spy = local_py_spy()
    assert py_spy is not None, "py-spy comes with the test extras (pip install -e '.[test]')"
    job = jid("t-sample")
    with stuck_rank(py38, job, 5) as child:
        args = {"job_id": job, "py_spy": str(py_spy), "samples": 3, "window": 30}
        res = run38("stacksample.py", [json.dumps(args)])
        assert res.returncode == 0, res.stderr
        frames = decode(res.stdout, STACK_KINDS)
        [row] = [f.data() for f in frames if f.kind == "K"]
        assert (row["pid"], row["rank"], row["unknown"], row["error"]) == (child.pid, 5, 0, None)
        assert row["idle"] + row["compute"] == 3 and row["wait"] == 0  # no collective in it
        assert frames[-1].data() == {"samples": 3, "error": None}
        assert child.poll() is None  # sampled without pausing it for good

        gone = run38("stacksample.py", [json.dumps({**args, "py_spy": "/nonexistent"})])
        [done] = [f.data() for f in decode(gone.stdout, STACK_KINDS)]
        assert gone.returncode == 0 and done["samples"] == 0 and "py-spy" in done["error"]


RACY_PY_SPY = """#!/bin/sh
# a py-spy whose first non-blocking read races the rank, as the real one does at times
n=$(cat "$0.count" 2>/dev/null || echo 0); echo $((n + 1)) > "$0.count"
if [ "$n" = 0 ]; then echo "Error: Bad address (os error 14)" >&2; exit 1; fi
cat "$0.dump"
"""


def test_stacksample_counts_a_raced_read_as_unknown_and_keeps_no_error_for_a_read_rank(
    py38: str, run38: Run, tmp_path: Path
) -> None:
    """One failed ``--nonblocking`` read among good ones is one ``unknown`` sample, not the
    rank's error (the verdict's note is for a rank py-spy could not read at all)."""
    fake = tmp_path / "py-spy"
    fake.write_text(RACY_PY_SPY)
    fake.chmod(0o755)
    dump = Path(__file__).parents[1] / "pure" / "pyspy_dumps" / "peer_idle_all_reduce.txt"
    (tmp_path / "py-spy.dump").write_text(dump.read_text())
    job = jid("t-racy")
    with stuck_rank(py38, job, 1):
        args = {"job_id": job, "py_spy": str(fake), "samples": 3, "window": 30}
        res = run38("stacksample.py", [json.dumps(args)])
        assert res.returncode == 0, res.stderr
        [row] = [f.data() for f in decode(res.stdout, STACK_KINDS) if f.kind == "K"]
        assert (row["unknown"], row["wait"] + row["idle"] + row["compute"]) == (1, 2), row
        assert row["error"] is None, row


# ------------------------------------------------------------------------------ exec timeout


def test_exec_timeout_stops_the_command_and_a_setsid_child_at_the_limit(run38: Run) -> None:
    secs = f"{200 + os.getpid() % 1000 / 1000:.3f}"
    cmd = f"echo up; setsid sleep {secs} & sleep {secs}; wait"
    res = run38("exec_timeout.py", ["0.5", "1", jid("x-timeout"), cmd])
    assert res.returncode == 124
    assert res.stdout == b"up\n"
    last = res.stderr.decode().splitlines()[-1]
    assert last.startswith("fleetctl: exec timed out after 0.5s: ") and "still running" not in last
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True)
    assert f"sleep {secs}" not in ps.stdout

    ok = run38("exec_timeout.py", ["30", "1", jid("x-ok"), "echo fine; exit 7"])
    assert ok.returncode == 7 and ok.stdout == b"fine\n" and ok.stderr == b""

    # --sweep, after coreutils timeout: a 124 before the limit is the command's own ...
    own = run38("exec_timeout.py", ["--sweep", "30", "1", jid("x-own"), "124"])
    assert own.returncode == 124 and own.stderr == b""
    # ... at the limit, the tagged process outside timeout's group is stopped too
    tag = jid("x-sweep")
    env = dict(os.environ, FLEET_EXEC_ID=tag)
    escapee = subprocess.Popen(["sleep", secs], env=env, start_new_session=True)
    try:
        res = run38("exec_timeout.py", ["--sweep", "0", "1", tag, "124"])
        assert res.returncode == 124
        last = res.stderr.decode().splitlines()[-1]
        assert last.startswith("fleetctl: exec timed out after 0s: its process group stopped")
        assert last.endswith("1 more process(es) stopped with SIGTERM"), last
        assert escapee.wait(10) == -signal.SIGTERM
    finally:
        escapee.kill()
        escapee.wait(10)


# A paddle-like launcher: each local rank writes its workerlog, and the launcher copies
# workerlog.0 to its stdout (torn reads included) next to its own "LAUNCH" lines.
FAKE_PADDLE = r"""
import os, subprocess, sys, time
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
kids = [subprocess.Popen([sys.executable, "-c",
        "import os, sys, time\n"
        "r = os.environ['PADDLE_LOCAL_RANK']\n"
        f"f = open('{d}/workerlog.' + r, 'a', buffering=1)\n"
        "time.sleep(0.5)\n"
        "for i in range(5):\n"
        "    f.write(f'w{r} i={i} '); f.flush(); time.sleep(0.02); f.write('end\\n')\n"],
        env={**os.environ, "PADDLE_LOCAL_RANK": str(r)}) for r in (0, 1)]
print("LAUNCH INFO started", flush=True)
src, done = open(d + "/workerlog.0", "a+"), False
src.seek(0)
while not done:
    done = all(k.poll() is not None for k in kids)
    sys.stdout.write(src.read()); sys.stdout.flush()
    time.sleep(0.05)
print("LAUNCH INFO done", flush=True)
"""


def test_the_supervisor_seeds_the_work_folder_tails_paddle_ranks_once_and_records_pids(
    jobs: Jobs, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    (code / "data" / "x.txt").write_text("x")
    (code / "fake_paddle.py").write_text(FAKE_PADDLE)
    work = tmp_path / "w" / "work" / "job"
    job = jid("p-paddle")
    run_dir = Path(jobs.run_dir(job))
    argv = [jobs.python, "fake_paddle.py", str(run_dir / "log")]
    spec = {"cwd": str(work), "work_seed": str(code), "env": {"FLEET_LAUNCHER": "paddle"}}
    spec["rank_logs"] = {**LAUNCHERS["paddle"].rank_logs(1, 2), "dir": "log"}  # node 1: base 2
    run = jobs.start(job, argv, **spec)
    lines = [text for kind, text in drain(run) if kind == "L"]
    assert (work / "data" / "x.txt").read_text() == "x"  # the copy of the code
    assert not (code / "log").exists()  # the snapshot never sees what the job writes
    ranks = sorted(x for x in lines if "i=" in x)
    assert ranks == sorted(
        [f"[rank 2] w0 i={i} end" for i in range(5)] + [f"[rank 3] w1 i={i} end" for i in range(5)]
    ), lines  # paddle's copy of workerlog.0 dropped, every rank's line once and whole
    assert "LAUNCH INFO started" in lines and "LAUNCH INFO done" in lines
    pids = json.loads((run_dir / "rank_pids.json").read_text())
    assert sorted(pids) == ["0", "1"] and all(len(v) == 1 for v in pids.values())


# torchrun's part: its own chatter on stdout at once, a rank's first line in its own file
# (``--redirects``) only once the test says go, then the end once it says so.
FAKE_TORCHRUN = """\
import os, sys, time
def wait(name):
    while not os.path.exists(name):
        time.sleep(0.05)
print("launcher chatter before the ranks run", flush=True)
wait("go")
d = os.path.join(os.environ["FLEET_RUN_DIR"], "torchrun", "j", "attempt_0", "0")
os.makedirs(d)
with open(os.path.join(d, "stdout.log"), "w") as f:
    f.write("first step\\n")
wait("end")
"""


def test_the_job_begins_at_a_ranks_first_line_not_at_its_launchers(
    jobs: Jobs, tmp_path: Path
) -> None:
    """``--stall-timeout`` counts from a node's begin: the supervisor sends ``P`` and makes the
    progress file (what ``status`` reports as ``begun``, for a detached job's monitor) at the
    first line a rank writes; a launcher's own lines, with ranks writing files of their own,
    do not begin the job. Without rank files the child's first line does."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "fake_torchrun.py").write_text(FAKE_TORCHRUN)
    job = jid("p-begin")
    run_dir = Path(jobs.run_dir(job))
    spec = {"cwd": str(code), "rank_logs": LAUNCHERS["torchrun"].rank_logs(0, 1)}
    run = jobs.start(job, [jobs.python, "fake_torchrun.py"], **spec)

    def status() -> dict:
        return last_data(jobs.mode("status", "--run-dir", str(run_dir)))

    wait_for("the launcher's line", lambda: b"chatter" in (run_dir / "console.log").read_bytes())
    assert status()["begun"] is False and not (run_dir / "progress").exists()
    (code / "go").touch()
    wait_for("the job began", lambda: status()["begun"])
    (code / "end").touch()
    # heartbeats come from their own thread, between any two frames: the order of the rest counts
    frames = [f for f in drain(run) if f[0] != "H"]
    first_p = next(i for i, (k, _) in enumerate(frames) if k == "P")
    rank_line = frames.index(("L", "[rank 0] first step"))
    assert frames.index(("L", "launcher chatter before the ranks run")) < rank_line, frames
    assert abs(first_p - rank_line) <= 1, frames  # P came with the rank's line, not before
    assert frames[-1][0] == "X"

    plain = jid("p-begin-plain")
    run = jobs.start(plain, ["sh", "-c", "sleep 1; echo up; sleep 0.5"])
    frames = [f for f in drain(run) if f[0] != "H"]
    assert frames.index(("L", "up")) + 1 == next(i for i, (k, _) in enumerate(frames) if k == "P")
    assert last_data(jobs.mode("status", "--run-dir", jobs.run_dir(plain)))["begun"] is True


def test_a_one_process_spec_makes_the_supervisors_child_local_rank_0(jobs: Jobs) -> None:
    """No launcher between (plain, a role's command: the spec's ``one_process``): the child
    is the node's only rank, whatever its env says; without it no process claims a rank."""
    for one in (True, False):
        job = jid(f"p-one-{one}")
        extra = {"one_process": True} if one else {}
        run = jobs.start(job, ["sh", "-c", "echo up; sleep 0.5"], **extra)
        assert [t for k, t in drain(run) if k == "L"] == ["up"]
        pids = Path(jobs.run_dir(job)) / "rank_pids.json"
        if one:
            assert json.loads(pids.read_text()) == {"0": [run.info["pid"]]}
        else:
            assert not pids.exists()


def beat_until(back: threading.Event, run_dir: str) -> None:
    """The controller's heartbeats through the heartbeat file, from the old channel's close
    until the reattach's first frame (its own first heartbeat came before it): a controller
    that came back at once. Without it the dead-man window timed the test's own start of
    the reattach's Python, which CI's load once stretched past 8 s."""
    hb = Path(run_dir) / HEARTBEAT_FILE
    while not back.wait(0.5):
        hb.touch()


def test_a_closed_channel_is_not_the_end_a_reattach_resumes_the_stream_and_relays_the_stop(
    jobs: Jobs,
) -> None:
    """The controller's channel closes mid-job (a blip broke it): the job runs on, fed by
    heartbeats a ``reattach`` over a new channel relays, which replays console.log from the
    first line the controller missed, relays the stop, and ends with the exit report."""
    job = jid("p-reattach")
    script = "i=0; while [ $i -lt 600 ]; do echo line-$i; i=$((i+1)); sleep 0.02; done"
    run = jobs.start(job, ["sh", "-c", script], deadman=3, reattach=True)
    got = 0
    deadline = time.monotonic() + 10
    while got < 5 and time.monotonic() < deadline:  # a few lines on the first channel
        data = run.stream.recv(0.3)
        got += sum(1 for f in run.reader.feed(data or b"") if f.kind == "L")
    back = threading.Event()  # the controller's heartbeats until the reattach speaks (below)
    beats = threading.Thread(target=beat_until, args=(back, jobs.run_dir(job)))
    beats.start()
    run.stream.close()
    closed = time.monotonic()
    time.sleep(1.0)  # the job runs on, channel or not
    sup = supervisor_path(str(jobs.root / "w"))
    p = subprocess.Popen(
        remote.file_argv(
            jobs.python, sup, "reattach", "--run-dir", jobs.run_dir(job), "--skip", "3"
        ),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    assert p.stdin is not None and p.stdout is not None
    with contextlib.suppress(OSError):
        os.set_blocking(p.stdout.fileno(), False)
    frames: list[tuple[str, str]] = []
    reader = FrameReader()
    deadline = time.monotonic() + 30
    stopped = False
    while time.monotonic() < deadline and not any(k == "X" for k, _ in frames):
        p.stdin.write(b"h")
        p.stdin.flush()
        # well past the dead-man window since the close: only the relayed heartbeats count
        if not stopped and time.monotonic() - closed > 6:
            p.stdin.write(b"t")  # the controller's stop, over the new channel
            p.stdin.flush()
            stopped = True
        time.sleep(0.2)
        with contextlib.suppress(BlockingIOError, TypeError):
            frames += [(f.kind, f.text) for f in reader.feed(p.stdout.read() or b"")]
        if frames:
            back.set()
    back.set()
    beats.join()
    p.stdin.close()
    p.wait(10)
    assert frames[0][0] == "S" and json.loads(frames[0][1])["alive"] is True
    lines = [t for k, t in frames if k == "L"]
    assert lines[0] == "line-3" and lines == [f"line-{i}" for i in range(3, 3 + len(lines))]
    assert len(lines) > 100  # it ran on long after the channel closed
    kind, text = frames[-1]
    assert kind == "X" and json.loads(text.split(" ", 1)[1])["stop_asked"] is True
    state = json.loads((Path(jobs.run_dir(job)) / "supervisor.json").read_text())
    assert state["stop_reason"] == "stop requested by the controller"
    assert find_job_processes(job, None) == []


def test_a_reattach_after_the_ranks_ended_says_so_again_the_old_channel_took_the_a_frame(
    jobs: Jobs,
) -> None:
    """The channel closes, then the job's only rank ends: the supervisor's ``A`` went into the
    closed channel, so ``reattach`` says it again from ranks_ended.json, and heartbeats through
    the launcher's quiet shut-down until its exit."""
    job = jid("p-reattach-a")
    done = jobs.root / "launcher-may-end"
    # the rank ends 1.5 s after its supervisor found it (rank_pids.json lists local rank 0): one
    # that ends before a scan sees it stays unknown, and a loaded machine delays the scan
    pids = Path(jobs.run_dir(job)) / "rank_pids.json"
    seen = f"until [ -s {pids} ]; do sleep 0.05; done"  # written once a rank is found
    rank = f"env LOCAL_RANK=0 sh -c 'echo one; {seen}; sleep 1.5; echo two'"
    launcher = f"{rank}; while [ ! -e {done} ]; do sleep 0.1; done"  # and it lingers
    run = jobs.start(job, ["sh", "-c", launcher], deadman=10, reattach=True)
    deadline = time.monotonic() + 60
    got: list[str] = []
    while "one" not in got:
        assert time.monotonic() < deadline, got
        run.stream.send(b"h")
        got += [f.text for f in run.reader.feed(run.stream.recv(0.3) or b"") if f.kind == "L"]
    back = threading.Event()  # the controller's heartbeats until the reattach speaks
    beats = threading.Thread(target=beat_until, args=(back, jobs.run_dir(job)))
    beats.start()
    run.stream.close()
    ended = Path(jobs.run_dir(job)) / "ranks_ended.json"
    wait_for("the rank's end", ended.exists, timeout=60)
    argv = ["reattach", "--run-dir", jobs.run_dir(job), "--skip", "1"]
    sup = supervisor_path(str(jobs.root / "w"))
    p = subprocess.Popen(
        remote.file_argv(jobs.python, sup, *argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert p.stdin is not None and p.stdout is not None
    timer = threading.Timer(30, p.kill)  # the channel stays open: it ends after ``X``
    timer.start()
    frames: list[tuple[str, str]] = []
    reader = FrameReader()
    try:
        for line in p.stdout:  # one frame a line
            frames += [(f.kind, f.text) for f in reader.feed(line)]
            back.set()  # the reattach heartbeats from here on (``S`` came after its first)
            with contextlib.suppress(OSError):
                p.stdin.write(b"h")  # the controller's heartbeats: the dead-man switch counts
                p.stdin.flush()
            if frames[-1:] == [("H", "")]:  # heartbeats through the quiet shut-down: end it
                done.touch()
    finally:
        back.set()
        beats.join()
        timer.cancel()
        with contextlib.suppress(OSError):  # it ended after its X
            p.stdin.close()
        p.wait(10)
    kinds = [k for k, _ in frames if k in "SLAX"]
    assert kinds == ["S", "L", "A", "X"] and frames[1] == ("L", "two"), frames
    # the launcher's quiet shut-down: heartbeats, or the watcher takes the channel for dead
    assert done.exists(), frames
    said = json.loads(next(t for k, t in frames if k == "A"))
    assert said == json.loads(ended.read_text()) and (said["ranks"], said["failed"]) == (1, 0)


def test_two_nodes_on_one_shared_home_unpack_an_env_once(py38: str, tmp_path: Path) -> None:
    """Two push helpers finalize the same env in one workdir at once (nodes on an NFS home):
    the unpack lock lets one unpack it; the other waits, then finds it there."""
    w = tmp_path / "w"
    (w / "envs").mkdir(parents=True)
    data, sha = env_archive(tmp_path, py38)
    procs = []
    for i in range(2):
        (w / "envs" / f"up{i}.tar.gz").write_bytes(data)  # each node's own upload
        cfg = {
            "workdir": str(w),
            "env": {"sha": sha, "archive": f"up{i}.tar.gz", "size": len(data)},
        }
        p = subprocess.Popen(
            [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "finalize"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        assert p.stdin is not None
        p.stdin.write(json.dumps(cfg).encode() + b"\n")
        p.stdin.close()
        procs.append(p)
    outs = []
    for p in procs:
        assert p.stdout is not None
        outs.append(last_data(p.stdout.read()))
        assert p.wait(60) == 0
    assert [o["env_dir"] for o in outs] == [str(w / "envs" / sha)] * 2
    assert sum("prefixes_rewritten" in o for o in outs) == 1, outs  # unpacked once
    assert sorted(p.name for p in (w / "envs").iterdir()) == [sha]


def test_the_supervisor_reads_how_an_unreaped_rank_ended(py38: str) -> None:
    """A rank that ended is a zombie until its launcher reaps it (deepspeed looks once a
    second): its exit status is still in /proc, which is how a failed rank is named."""
    code = (
        "import os, signal, sys, time; sys.path.insert(0, sys.argv[1]); "
        "from remote.kit import procfs, ranks\n"
        "kids = []\n"
        "for how in ('exit', 'kill'):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(3) if how == 'exit' else os.kill(os.getpid(), signal.SIGKILL)\n"
        "    kids.append(pid)\n"
        "time.sleep(0.5)\n"
        "assert ranks.rank_processes(os.getpid()) == []\n"
        "print([procfs.zombie_exit(p) for p in kids], procfs.zombie_exit(os.getpid()))\n"
    )
    out = subprocess.run(
        [py38, "-c", code, node_tree()],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert out.stdout.strip() == "[3, -9] None", out.stderr


def test_push_and_check_read_one_workdir_id_so_a_shared_home_is_pushed_once(
    py38: str, tmp_path: Path
) -> None:
    """The push helper's probe makes (or reads) the id the check's probe reads: both programs
    run alone on the node, so they must agree on one folder, whichever came first."""
    w = tmp_path / "w"

    def push_probe() -> str:
        p = subprocess.run(
            [py38, remote.NO_SITE, "-c", remote.inline("push_helper.py"), "probe"],
            input=json.dumps({"workdir": str(w)}).encode() + b"\n",
            capture_output=True, timeout=60, check=True,
        )  # fmt: skip
        return last_data(p.stdout)["workdir_id"]

    def check_probe() -> str:
        code = (
            "import sys; sys.path.insert(0, sys.argv[1]); "
            "from remote.kit import facts\n"
            "print(facts.workdir_id(sys.argv[2]))\n"
        )
        out = subprocess.run(
            [py38, "-c", code, node_tree(), str(w)],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        return out.stdout.strip()

    first = push_probe()
    assert len(first) == 16 and first == check_probe() == push_probe()
    (w / ".fleetctl-id").unlink()
    made_by_check = check_probe()
    assert made_by_check != first and push_probe() == made_by_check


FAKE_LAUNCHER = """
import json, os, subprocess, sys, time
body = "import sys, time; time.sleep(float(sys.argv[1])); sys.exit(int(sys.argv[2]))"
rank = [sys.executable, "-c", body]
r1 = subprocess.Popen(rank + ["1.0", "3"], env=dict(os.environ, LOCAL_RANK="1"))
r0 = subprocess.Popen(rank + ["2.0", "0"], env=dict(os.environ, LOCAL_RANK="0"))
print(json.dumps({"r1": r1.wait(), "reaped": time.time()}), flush=True)  # at once: no zombie
r0.wait()
"""


def test_the_supervisor_times_a_rank_end_its_launcher_reaps_at_once(
    jobs: Jobs, tmp_path: Path
) -> None:
    """Which rank failed first is decided by when each ended, on every node: a pidfd wakes the
    supervisor as the rank ends, even when its launcher reaps it at once (no zombie to see)."""
    (tmp_path / "launcher.py").write_text(FAKE_LAUNCHER)
    job = jid("p-exits")
    spec = {"cwd": str(tmp_path), "env": {"FLEET_LAUNCHER": "torchrun"}}
    run = jobs.start(job, [jobs.python, str(tmp_path / "launcher.py")], **spec)
    said = [json.loads(t) for k, t in drain(run) if k == "L" and t.startswith("{")]
    assert said and said[0]["r1"] == 3, said
    exits = json.loads((Path(jobs.run_dir(job)) / "rank_exits.json").read_text())["exits"]
    by_local = {e["local"]: e for e in exits}
    assert sorted(by_local) == [0, 1], exits
    assert by_local[1]["code"] in (3, None)  # read only if still a zombie when we looked
    assert by_local[1]["at"] <= said[0]["reaped"] + 0.5 < by_local[0]["at"], exits


STOPPED_LAUNCHER = """
import os, subprocess, sys
# r1 ends 2 s after the supervisor found it (rank_pids.json in the run folder, argv[1], lists
# local rank 1; the watcher then holds a pidfd for it): a rank that ends before a scan sees it
# stays unknown, and a fixed life (it was 3 s) did not cover a loaded machine's start of it
body = '''
import json, os, sys, time
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        with open(os.path.join(sys.argv[1], "rank_pids.json")) as f:
            if "1" in json.load(f):
                break
    except (OSError, ValueError):
        pass
    time.sleep(0.05)
time.sleep(2.0)
sys.exit(3)
'''
env = dict(os.environ, LOCAL_RANK="1")
r1 = subprocess.Popen([sys.executable, "-c", body, sys.argv[1]], env=env)
r0 = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(600)"], env=dict(os.environ, LOCAL_RANK="0")
)
print("r1 ended", r1.wait(), flush=True)
r0.wait()
"""


def _ended(exits_file: Path, local: int) -> bool:
    """Whether the node's rank_exits.json already holds local rank ``local``'s end."""
    try:
        return any(e["local"] == local for e in json.loads(exits_file.read_text())["exits"])
    except (OSError, ValueError, KeyError):
        return False


def test_a_rank_that_ended_after_the_stop_reached_its_node_is_marked_so(
    jobs: Jobs, tmp_path: Path
) -> None:
    """Only a rank that ended on its own can be a first failure: one that ended after our stop
    reached the node (torchrun turns our SIGTERM into exit code 1) is marked ``after_stop``."""
    (tmp_path / "launcher.py").write_text(STOPPED_LAUNCHER)
    job = jid("p-after-stop")
    spec = {"cwd": str(tmp_path), "env": {"FLEET_LAUNCHER": "torchrun"}}
    argv = [jobs.python, str(tmp_path / "launcher.py"), jobs.run_dir(job)]
    run = jobs.start(job, argv, **spec)
    seen = [f.text for f in run.pending]
    deadline = time.monotonic() + 150
    exits_file = Path(jobs.run_dir(job)) / "rank_exits.json"
    # the stop once rank 1's end is the node's record (its watcher may run late on a loaded
    # machine: what is proven is how an end before the stop and one after it are marked)
    while not (any(t.startswith("r1 ended") for t in seen) and _ended(exits_file, 1)):
        assert time.monotonic() < deadline, seen
        run.stream.send(b"h")
        data = run.stream.recv(0.3)
        seen += [f.text for f in run.reader.feed(data or b"")]
    run.stream.send(b"t")  # the stop: rank 0 ends by it
    drain(run)
    exits = json.loads((Path(jobs.run_dir(job)) / "rank_exits.json").read_text())["exits"]
    by_local = {e["local"]: e for e in exits}
    assert sorted(by_local) == [0, 1], exits
    assert "after_stop" not in by_local[1] and by_local[0]["after_stop"] is True, exits


LINGERING_LAUNCHER = """
import os, subprocess, sys, time
body = "import sys, time; time.sleep(float(sys.argv[1]))"
rank = [sys.executable, "-c", body]
r1 = subprocess.Popen(rank + ["0.3"], env=dict(os.environ, LOCAL_RANK="1"))
r0 = subprocess.Popen(rank + ["1.0"], env=dict(os.environ, LOCAL_RANK="0"))
r1.wait(), r0.wait()
print("ranks done", flush=True)
time.sleep(float(sys.argv[1]))  # its shut-down: torchrun's exit barrier, a slow teardown
"""


def test_the_supervisor_says_once_when_every_rank_ended_before_its_launcher(
    jobs: Jobs, tmp_path: Path
) -> None:
    """``A`` once, as the last of the node's ranks (FLEET_NPROC_PER_NODE) ends, while the
    launcher still shuts down: the controller's stall clock counts it as the node's end; a
    detached job's ``status`` reads it from ranks_ended.json."""
    (tmp_path / "launcher.py").write_text(LINGERING_LAUNCHER)
    job = jid("p-ranks-ended")
    env = {"FLEET_LAUNCHER": "torchrun", "FLEET_NPROC_PER_NODE": "2"}
    run = jobs.start(
        job, [jobs.python, str(tmp_path / "launcher.py"), "3"], cwd=str(tmp_path), env=env
    )
    got: list[tuple[str, str, float]] = [(f.kind, f.text, time.monotonic()) for f in run.pending]
    status = None
    deadline = time.monotonic() + 30
    while not got or got[-1][0] != "X":
        assert time.monotonic() < deadline, got[-5:]
        run.stream.send(b"h")
        data = run.stream.recv(0.2)
        got += [(f.kind, f.text, time.monotonic()) for f in run.reader.feed(data or b"")]
        if status is None and any(k == "A" for k, _, _ in got):  # the launcher still sleeps
            status = last_data(jobs.mode("status", "--run-dir", jobs.run_dir(job)))
    with contextlib.suppress(OSError, EOFError):
        run.stream.close_stdin()  # the goodbye after X, as drain says it
    drain(run)
    [(said, at)] = [(json.loads(t), at) for k, t, at in got if k == "A"]
    assert (said["ranks"], said["failed"]) == (2, 0) and isinstance(said["at"], float), said
    done = next(at for k, t, at in got if t == "ranks done")
    assert at <= done + 0.5 and got[-1][2] - at > 2.0, got  # at the ranks' end, not the exit
    assert status is not None and status["state"] == "running", status
    assert status["ranks_ended"] == said, status


SHADOWED = ("json", "base64", "zlib", "socket", "hashlib", "subprocess", "queue")


def test_node_programs_never_import_the_users_modules_from_the_login_folder(
    py38: str, run38: Run, tmp_path: Path
) -> None:
    """A node program starts in the login's home; a user's ~/json.py must not replace the
    stdlib's (``python -c`` puts the current folder first on sys.path)."""
    home = tmp_path / "home"
    home.mkdir()
    for mod in SHADOWED:
        (home / f"{mod}.py").write_text(f"raise SystemExit('shadowed {mod}')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["SHELL"] = "/usr/bin/fish"  # as sshd sets it: the probe reports the login shell
    port_args = json.dumps({"candidates": [], "need": 0})
    # what a plain ``python -c SOURCE`` does there: the user's module wins
    raw = subprocess.run(
        [py38, "-S", "-c", remote.source("port_probe.py").decode(), port_args],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert raw.returncode != 0 and "shadowed" in raw.stderr
    # every program as fleetctl ships it with -c
    res = run38("port_probe.py", [port_args], cwd=home, env=env)
    assert res.returncode == 0 and b"D " in res.stdout, res.stderr
    # the check's bootstrap (base64, zlib), the probe (json, socket) and its launcher import
    args = {"address": "127.0.0.1", "workdir": str(tmp_path / "w"), "ports": []}
    args["launcher_module"] = "json.decoder"
    probe = subprocess.run(
        probe_command(py38, args),
        shell=True,
        cwd=home,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        env=env,
    )
    assert probe.returncode == 0, probe.stdout[-600:] + probe.stderr[-600:]
    facts = next(f.data() for f in decode(probe.stdout, PROBE_KINDS) if f.kind == "D")
    assert facts["launcher"] == {"module": "json.decoder", "version": "2.0.9"}
    assert facts["login_shell"] == "/usr/bin/fish"
    # the supervisor, installed by the loader and then run from its file: its folder, not the
    # current one, is searched, and its bytecode is cached there for the next start
    src, _sha = supervisor_source()
    sup = supervisor_path(str(tmp_path / "w"))
    clean = ["clean", "--job-id", jid("p-shadow"), "--workdir", str(tmp_path / "w")]
    loaded = subprocess.run(
        [py38, remote.NO_SITE, "-c", LOADER, sup, *clean],
        input=b"%d\n" % len(src) + src,
        cwd=home,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert loaded.returncode == 0 and loaded.stdout.startswith(b"U\nD "), loaded.stderr
    again = subprocess.run(
        remote.file_argv(py38, sup, *clean), cwd=home, env=env, capture_output=True, timeout=60
    )
    assert again.returncode == 0 and again.stdout.startswith(b"D "), again.stderr
    program = Path(sup) / remote.node_file("supervisor.py")
    cached = list((program.parent / "__pycache__").glob("supervisor.cpython-38*.pyc"))
    assert len(cached) == 1


WORKDIR_ID = """
import os, sys, threading, time
sys.path.insert(0, sys.argv[1])
import remote.{module} as m
w = sys.argv[2]
os.makedirs(w)
# many nodes of one shared home at once: one id for all of them
got = []
ts = [threading.Thread(target=lambda: got.append(m.workdir_id(w))) for _ in range(8)]
[t.start() for t in ts]
[t.join(30) for t in ts]
print(len(set(got)), None in got, sorted(os.listdir(w)))
# a node that made the file but has not written it yet: the reader waits, not None
os.remove(os.path.join(w, ".fleetctl-id"))
open(os.path.join(w, ".fleetctl-id"), "w").close()
def late():
    time.sleep(0.3)
    with open(os.path.join(w, ".fleetctl-id"), "w") as f:
        f.write("abc\\n")
threading.Thread(target=late).start()
print(m.workdir_id(w))
"""


@pytest.mark.parametrize("module", ["kit.facts", "programs.push_helper"])
def test_nodes_of_one_shared_home_read_one_workdir_id_never_a_half_made_one(
    py38: str, tmp_path: Path, module: str
) -> None:
    code = WORKDIR_ID.format(module=module)
    out = subprocess.run(
        [py38, "-S", "-c", code, node_tree(), str(tmp_path / "w")],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    first, second = out.stdout.splitlines()
    assert first == "1 False ['.fleetctl-id']", out.stdout  # one id; no temp file left
    assert second == "abc"


STAND_IN = (
    "import json, sys\ndef program():\n    print('D ' + json.dumps({'stand_in': sys.argv[1:]}))\n"
)


def test_the_probe_and_the_push_helper_install_themselves_then_run_from_cached_bytecode(
    py38: str, tmp_path: Path
) -> None:
    """The first start installs the program under W/bin (private, whole, its bytecode cached:
    no compile of its source at every check or push); the next start runs that file."""
    import stat

    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    w = tmp_path / "w"
    args = {"address": "127.0.0.1", "workdir": str(w), "ports": []}
    cfg = json.dumps({"workdir": str(w), "digest": "d1"}).encode() + b"\n"
    push_argv = remote.cached_argv(py38, str(w), "push_helper.py", "probe")
    starts = {
        "probe.py": (probe_command(py38, args), b"", PROBE_KINDS, [json.dumps(args)]),
        "push_helper.py": (shlex.join(push_argv), cfg, PUSH_KINDS, ["probe"]),
    }

    def start(name: str) -> list:
        line, stdin, kinds, _ = starts[name]
        out = subprocess.run(
            line, shell=True, input=stdin, env=env, capture_output=True, timeout=60
        )
        assert out.returncode == 0, out.stderr[-600:]
        return [f.data() for f in decode(out.stdout, kinds) if f.kind == "D"]

    for name, (*_, argv) in starts.items():
        facts = start(name)
        assert len(facts) == 1 and facts[0]["workdir"] == str(w), facts
        folder = Path(remote.installed_path(str(w), name))
        installed = folder / remote.node_file(name)
        mods = remote.modules(name)
        inits = [f"{p.replace('.', '/')}/__init__.py" for p in remote.packages(mods)]
        assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py")) == sorted(
            ["__main__.py", *inits, *(f"{m.replace('.', '/')}.py" for m in mods)]
        )
        for mod, src in mods.items():
            assert (folder / f"{mod.replace('.', '/')}.py").read_text() == src
        assert stat.S_IMODE(installed.stat().st_mode) == 0o600
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert list((installed.parent / "__pycache__").glob(f"{installed.stem}.cpython-38*.pyc"))
        installed.write_text(STAND_IN)  # the next start must run this file, not the source
        assert start(name) == [{"stand_in": argv}]
    assert not list((w / "bin").glob("*.part")), "a temp file of the install was left"


def test_a_workdir_that_cannot_take_the_probe_still_gets_its_facts(
    py38: str, tmp_path: Path
) -> None:
    (tmp_path / "afile").write_text("")  # a file where the workdir's parent should be
    args = {"address": "127.0.0.1", "workdir": str(tmp_path / "afile" / "w"), "ports": []}
    out = subprocess.run(
        probe_command(py38, args),
        shell=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr[-600:]
    facts = [f.data() for f in decode(out.stdout, PROBE_KINDS) if f.kind == "D"]
    assert len(facts) == 1 and facts[0]["workdir_id"] is None, facts
    assert (tmp_path / "afile").read_text() == ""


def test_the_probe_reads_the_interface_addresses_ip_lists_from_rtnetlink(py38: str) -> None:
    """In-process (no ``ip`` process on every node), and the same answer as ``ip -4 addr``."""
    ip = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, check=True)
    want = {
        e["ifname"]: [a["local"] for a in e.get("addr_info", []) if a.get("family") == "inet"]
        for e in json.loads(ip.stdout)
    }
    code = (
        "import json, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from remote.kit import facts\n"
        "print(json.dumps(facts.ipv4_netlink()))\n"
    )
    out = subprocess.run(
        [py38, "-S", "-c", code, node_tree()],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(out.stdout) == {k: v for k, v in want.items() if v}


TAR_WRITE = """
import io, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import pack as s
out = open(sys.argv[2], "wb")
w = s.TarWriter(out)
w.add_dir("ranks/empty", 0o700, 7)
w.add("a.log", io.BytesIO(b"line\\n"), 5, 0o600, 1795656000)
w.add("d" * 150 + "/long name.log", io.BytesIO(b"x" * 1000), 1000, 0o600, 1)
w.add("r\\u00e9sum\\u00e9/tail.log", io.BytesIO(b"tail"), 4, 0o600, 2, {"fleetctl.offset": "12"})
w.add("shrank.log", io.BytesIO(b"abc"), 600, 0o600, 3)
w.close()
out.close()
"""


def test_the_supervisors_tar_stream_reads_back_with_tarfile(py38: str, tmp_path: Path) -> None:
    """pack's own tar writer (tarfile's import cost every node ~6 ms per job) against the
    controller's reader: folders, a long and a non-ASCII name, the resume offset, a file that
    shrank while it was sent, whole records."""
    path = tmp_path / "out.tar"
    subprocess.run([py38, "-S", "-c", TAR_WRITE, node_tree(), str(path)], timeout=60, check=True)
    assert path.stat().st_size % 10240 == 0
    got = {}
    with tarfile.open(path, mode="r|") as tar:
        for m in tar:
            data = tar.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]
            got[m.name] = (m.type, data, m.mtime, m.mode, m.pax_headers.get("fleetctl.offset"))
    assert got == {
        "ranks/empty": (tarfile.DIRTYPE, None, 7, 0o700, None),
        "a.log": (tarfile.REGTYPE, b"line\n", 1795656000, 0o600, None),
        "d" * 150 + "/long name.log": (tarfile.REGTYPE, b"x" * 1000, 1, 0o600, None),
        "résumé/tail.log": (tarfile.REGTYPE, b"tail", 2, 0o600, "12"),
        "shrank.log": (tarfile.REGTYPE, b"abc" + b"\0" * 597, 3, 0o600, None),
    }


def test_the_job_scan_reads_no_kernel_threads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernel threads (thousands on a big GPU host) are never a job's: the after-exit scan
    skips them instead of reading each one's environment."""
    from fleetctl.remote.kit import jobprocs, procfs

    def flags(pid: int) -> int:
        st = procfs.proc_stat_flags(pid)
        return st[4] if st else 0

    pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    kthreads = {pid for pid in pids if flags(pid) & procfs.PF_KTHREAD}
    if not kthreads:
        pytest.skip("no kernel threads visible here (a PID namespace)")
    read: list[int] = []
    monkeypatch.setattr(jobprocs, "environ_has", lambda pid, tags: read.append(pid) or False)
    assert jobprocs.scan_job("no-such-job", None, None, None) == ([], False)
    assert read and not set(read) & kthreads
