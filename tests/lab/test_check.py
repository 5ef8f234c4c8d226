"""``fleetctl check`` against real sshd hosts in the namespace lab.

One shared 3-host lab (2 networks, data NICs data0/data0/ib0, 2 fake GPUs each). Each fault test
breaks exactly one thing, asserts the exact set of (host, check) cells that fail, and heals in
``finally`` (the ``lab3`` fixture also undoes recorded faults). Modified inventories and
known_hosts files are written to tmp dirs; the lab's own files are never edited.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from fleetctl.lab import Lab
from fleetctl.node import Node
from fleetctl.phases.check.preflight import CheckOptions, CheckReport, check_fleet
from fleetctl.plan.inventory import load_inventory
from fleetctl.ssh.fanout import FanOut
from fleetctl.testing.pytest_plugin import lab_login, skip_or_fail
from fleetctl.transport.connection import SSHSettings

pytestmark = [pytest.mark.lab, pytest.mark.login, pytest.mark.shared_home]


def run_check(
    nodes: list[Node] | tuple[Node, ...], settings: SSHSettings | None = None, **opts: Any
) -> CheckReport:
    opts.setdefault("cache_ttl", 0)
    with FanOut(nodes, settings or SSHSettings(connect_timeout=5)) as fleet:
        return check_fleet(fleet, CheckOptions(**opts))


def lab_nodes(lab: Lab) -> tuple[Node, ...]:
    return load_inventory(lab.inventory_path).nodes


def failing(report: CheckReport) -> set[tuple[str, str]]:
    return {(h, c) for h, c, _ in report.failures}


SHARED_HOME = bool(lab_login().get("shared_home"))  # FLEETCTL_LAB_SHARED_HOME=1: one home


def other_warnings(report: CheckReport) -> list[str]:
    """The report's warnings but the note that hosts share one workdir, which a shared-home
    lab must give (and a private-home lab must not)."""
    shared = [w for w in report.warnings if "(one filesystem, e.g. an NFS home)" in w]
    assert bool(shared) == (SHARED_HOME and len(report.hosts) > 1 and report.ok), report.warnings
    return [w for w in report.warnings if w not in shared]


def assert_only(report: CheckReport, expected: set[tuple[str, str]], *, mesh: bool = False) -> None:
    """Exactly ``expected`` (host, check) cells fail; no warnings; no mesh pair unless ``mesh``."""
    assert failing(report) == expected, report.failures
    assert [w for w in report.warnings if "(one filesystem, e.g. an NFS home)" not in w] == []
    if not mesh:
        assert report.mesh_failures == []


def reason(report: CheckReport, host: str, check: str) -> str:
    return report.hosts[host].checks[check].detail


def edited_inventory(lab: Lab, tmp_path: Path, host: str, edit: Callable[[dict], None]) -> Path:
    """A copy of the lab's hosts.yml with one host's variables changed by ``edit``."""
    data = yaml.safe_load(lab.inventory_path.read_text())
    edit(data["all"]["children"]["nodes"]["hosts"][host])
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def known_hosts_without(lab: Lab, tmp_path: Path, addr: str, replace_with: str | None) -> Path:
    """A copy of the lab's known_hosts where ``addr``'s key is dropped or replaced by another's."""

    def names(line: str) -> list[str]:
        return line.split(" ", 1)[0].split(",")

    lines = lab.known_hosts.read_text().splitlines()
    other = next(ln for ln in lines if addr not in names(ln)) if replace_with else None
    out = []
    for ln in lines:
        if addr in names(ln):
            if other is not None:
                out.append(ln.split(" ", 1)[0] + " " + other.split(" ", 1)[1])
            continue
        out.append(ln)
    assert out != lines
    path = tmp_path / "known_hosts"
    path.write_text("\n".join(out) + "\n")
    return path


def test_all_good_lab_with_two_networks_passes(lab3: Lab) -> None:
    report = run_check(lab_nodes(lab3))
    assert report.ok, report.failures
    assert report.failures == [] and report.mesh_failures == [] and report.mesh_skipped == []
    assert other_warnings(report) == []  # on a shared-home lab: the shared workdir, named
    for h in lab3.hosts:
        facts = report.facts[h.name]
        # The training NIC differs per host (data0 / ib0) and is not the SSH network.
        assert (facts.nic, facts.train_addr) == (h.data_nic, h.data_addr)
        assert facts.gpu_count == 2
        row = report.hosts[h.name].checks
        assert row["mesh"].detail == "2/2 peers"
        assert row["ping"].status == "ok"
    assert {h.data_nic for h in lab3.hosts} == {"data0", "ib0"}
    assert report.hosts["node1"].checks["port"].detail == "29500 free"


def test_a_fanout_smaller_than_the_fleet_still_meshes_every_host(lab3: Lab) -> None:
    """Connections go --fanout at a time, but the mesh needs every probe up at once: with a
    fanout of 1, the 3 hosts still test each other (before: each waited alone, then gave up)."""
    with FanOut(lab_nodes(lab3), SSHSettings(connect_timeout=5), fanout=1) as fleet:
        report = check_fleet(fleet, CheckOptions(cache_ttl=0))
    assert report.ok and report.mesh_failures == [] and report.mesh_skipped == []
    for h in lab3.hosts:
        assert report.hosts[h.name].checks["mesh"].detail == "2/2 peers"


def test_data_link_cut_shows_exactly_its_row_and_column(lab3: Lab) -> None:
    lab3.cut_link("node2", "data")
    try:
        report = run_check(lab_nodes(lab3))
    finally:
        lab3.heal_link("node2", "data")
    assert_only(report, {("node2", "nic"), ("node2", "mesh")}, mesh=True)
    assert "down" in reason(report, "node2", "nic")
    pairs = {(f.src, f.dst) for f in report.mesh_failures}
    assert pairs == {("node1", "node2"), ("node2", "node1"), ("node3", "node2"), ("node2", "node3")}
    for f in report.mesh_failures:
        assert any(p.startswith("TCP 2950") for p in f.problems), str(f)
        # node2's own facts say its NIC is down: its pairs are not measured a second time
        assert "measured twice" not in f.problems, str(f)
    # SSH goes over the management network, which is fine.
    assert report.hosts["node2"].checks["ssh"].status == "ok"


def test_killed_sshd_fails_only_that_host_and_the_rest_is_checked(lab3: Lab) -> None:
    lab3.kill_sshd("node2")
    try:
        report = run_check(lab_nodes(lab3))
    finally:
        lab3.start_sshd("node2")
    assert_only(report, {("node2", "ssh")})
    assert "refused" in reason(report, "node2", "ssh")
    assert report.mesh_skipped == ["node2: no SSH"]
    assert report.hosts["node1"].checks["mesh"].detail == "1/1 peers"
    assert report.mesh_failures == []


def test_wrong_key_is_an_authentication_failure(lab3: Lab, tmp_path: Path) -> None:
    key = tmp_path / "wrong_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
        check=True,
        stdin=subprocess.DEVNULL,
    )

    def edit(h: dict) -> None:
        h["ansible_ssh_private_key_file"] = str(key)

    inv = edited_inventory(lab3, tmp_path, "node3", edit)
    report = run_check(load_inventory(inv).nodes)
    assert_only(report, {("node3", "ssh")})
    assert "authentication failed" in reason(report, "node3", "ssh")


def test_unknown_host_key_is_refused_with_the_command_to_accept_it(
    lab3: Lab, tmp_path: Path
) -> None:
    addr = lab3.host("node1").mgmt_addr
    kh = known_hosts_without(lab3, tmp_path, addr, replace_with=None)
    report = run_check(lab_nodes(lab3), SSHSettings(known_hosts=str(kh), connect_timeout=5))
    assert_only(report, {("node1", "ssh")})
    why = reason(report, "node1", "ssh")
    assert "unknown" in why and f"ssh-keyscan -p 22 {addr} >> {kh}" in why
    assert addr not in kh.read_text()  # never auto-added


def test_changed_host_key_is_refused_with_the_ssh_keygen_hint(lab3: Lab, tmp_path: Path) -> None:
    addr = lab3.host("node2").mgmt_addr
    kh = known_hosts_without(lab3, tmp_path, addr, replace_with="another host's key")
    before = kh.read_text()
    report = run_check(
        lab_nodes(lab3), SSHSettings(known_hosts=str(kh), accept_new=True, connect_timeout=5)
    )
    assert_only(report, {("node2", "ssh")})
    why = reason(report, "node2", "ssh")
    assert "CHANGED" in why and f"ssh-keygen -f {kh} -R '{addr}'" in why
    assert kh.read_text() == before  # --accept-new never replaces a changed key


def test_declared_gpus_differ_from_nvidia_smi(lab3: Lab) -> None:
    lab3.set_gpus("node3", 1)
    try:
        report = run_check(lab_nodes(lab3))
    finally:
        lab3.set_gpus("node3", 2)
    assert_only(report, {("node3", "gpu")})
    assert reason(report, "node3", "gpu") == (
        "fleetctl_gpus=2 but nvidia-smi shows 1 (1× NVIDIA H100 80GB HBM3)"
    )


@contextlib.contextmanager
def listening(lab: Lab, host: str, ports: tuple[int, ...]) -> Iterator[None]:
    """Listeners on ``ports`` of ``host`` (as a launcher binds: SO_REUSEADDR) while inside."""
    code = (
        "import socket, sys\n"
        "held = []\n"
        f"for port in {ports!r}:\n"
        "    s = socket.socket()\n"
        "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "    s.bind(('0.0.0.0', port))\n"
        "    s.listen(1)\n"
        "    held.append(s)\n"
        "print('ready', flush=True)\n"
        "sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        lab.nsenter_argv(host, [sys.executable, "-c", code]),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield
    finally:
        assert proc.stdin is not None
        proc.stdin.close()  # the listener exits when its stdin closes
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_master_port_taken_on_node0(lab3: Lab) -> None:
    with listening(lab3, "node1", (29500, 29501)):
        report = run_check(lab_nodes(lab3))
    assert_only(report, {("node1", "port")})
    assert reason(report, "node1", "port") == "master port 29500 in use"
    # The mesh listener skipped the master port and the busy 29501, and still worked.
    assert report.mesh_failures == []
    assert report.mesh_ports == {"node1": 29502, "node2": 29501, "node3": 29501}


def test_check_master_port_is_the_port_node0_must_have_free(
    lab3: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fleetctl check --master-port P``: P taken on node 0 fails its port check naming P (the
    default 29500 is not asked), and the mesh test listens just above P."""
    from fleetctl.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with listening(lab3, "node1", (29640,)), pytest.raises(SystemExit) as bad:
        main(["check", "-i", str(lab3.inventory_path), "--json", "--master-port", "29640"])
    data = json.loads(capsys.readouterr().out)
    assert bad.value.code == 3
    assert data["failures"] == [
        {"host": "node1", "check": "port", "reason": "master port 29640 in use"}
    ]
    assert data["mesh_ports"] == {"node1": 29641, "node2": 29641, "node3": 29641}


def test_full_disk_fails_the_disk_check(lab3: Lab) -> None:
    lab3.disk_full("node2")
    try:
        report = run_check(lab_nodes(lab3))
    finally:
        lab3.disk_ok("node2")
    assert_only(report, {("node2", "disk")})
    assert f"free in {lab3.workdir}, need 1.0 GiB" in reason(report, "node2", "disk")


def test_missing_rsync_on_one_host(lab3: Lab) -> None:
    path = lab3.exec("node3", ["sh", "-c", "command -v rsync"], check=True).stdout.strip()
    assert path
    # Hide rsync in node3's own mount namespace only.
    lab3.exec("node3", ["mount", "--bind", "/dev/null", path], check=True)
    try:
        report = run_check(lab_nodes(lab3))
    finally:
        lab3.exec("node3", ["umount", path], check=True)
    assert_only(report, {("node3", "rsync")})
    assert reason(report, "node3", "rsync") == "rsync not found on PATH (push needs it)"
    assert shutil.which("rsync")  # this machine was not touched


def test_unresolvable_hostname_fails_ssh_of_that_host_only(lab3: Lab, tmp_path: Path) -> None:
    # A name with a label over 63 characters can never resolve and is rejected before any DNS
    # query leaves this machine (tests talk only to lab hosts).
    bad = "node2-" + "x" * 60 + ".lab.invalid"

    def edit(h: dict) -> None:
        h["ansible_host"] = bad

    inv = edited_inventory(lab3, tmp_path, "node2", edit)
    report = run_check(load_inventory(inv).nodes)
    assert_only(report, {("node2", "ssh")})
    assert "cannot resolve host name" in reason(report, "node2", "ssh")
    assert report.hosts["node2"].checks["ping"].status == "skip"


def test_missing_python_fails_that_host_and_keeps_it_out_of_the_mesh(
    lab3: Lab, tmp_path: Path
) -> None:
    def edit(h: dict) -> None:
        h["fleetctl_python"] = "/usr/bin/python-nope"

    report = run_check(load_inventory(edited_inventory(lab3, tmp_path, "node2", edit)).nodes)
    assert_only(report, {("node2", "python")})
    assert reason(report, "node2", "python").startswith(
        "/usr/bin/python-nope not found on the host"
    )
    assert report.mesh_skipped == ["node2: probe failed"]
    assert report.mesh_failures == []


@pytest.fixture
def python_without_torch() -> Any:
    """A venv python on a path the lab hosts see (/var/tmp), without the site's packages."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="fleetctl-notorch-", dir="/var/tmp"))
    root.chmod(0o755)  # a non-root lab login runs it too
    try:
        subprocess.run(
            [os.path.realpath(sys.executable), "-m", "venv", "--without-pip", str(root / "v")],
            check=True,
        )
        yield str(root / "v" / "bin" / "python")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_a_node_python_that_cannot_import_the_launcher_fails_the_check_naming_it(
    lab3: Lab, tmp_path: Path, python_without_torch: str
) -> None:
    def edit(h: dict) -> None:
        h["fleetctl_python"] = python_without_torch

    nodes = load_inventory(edited_inventory(lab3, tmp_path, "node2", edit)).nodes
    report = run_check(nodes, launcher_module="torch.distributed.run")
    assert_only(report, {("node2", "python")})
    assert reason(report, "node2", "python") == (
        "cannot import torch.distributed.run: ModuleNotFoundError: No module named 'torch'"
    )
    assert ", torch 2." in reason(report, "node1", "python")
    # Without a launcher to start (plain), the same python is fine.
    assert run_check(nodes).ok


def test_run_with_torchrun_stops_in_preflight_when_a_node_lacks_torch(
    lab3: Lab, tmp_path: Path, python_without_torch: str
) -> None:
    from fleetctl.testing.cli_runner import run_cli

    def edit(h: dict) -> None:
        h["fleetctl_python"] = python_without_torch

    inv = edited_inventory(lab3, tmp_path, "node3", edit)
    script = tmp_path / "code" / "train.py"
    script.parent.mkdir()
    script.write_text("print('should never run')\n")
    r = run_cli(
        "run",
        "-i",
        str(inv),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--launcher",
        "torchrun",
        str(script),
        env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
    )
    assert r.exit_code == 3, r.stderr
    assert "node3: python: cannot import torch.distributed.run" in r.stderr
    assert "should never run" not in r.stdout
    assert "launching" not in r.stderr + r.stdout


def test_a_gpu_with_another_jobs_process_fails_the_check_unless_allowed(lab3: Lab) -> None:
    lab3.set_gpu_busy("node2", 1, pid=4242, mib=2048)
    nodes = lab_nodes(lab3)
    report = run_check(nodes)
    assert_only(report, {("node2", "gpu")})
    assert reason(report, "node2", "gpu").startswith("busy: GPU 1: pid 4242 (2048 MiB)")
    allowed = run_check(nodes, allow_busy_gpus=True)
    assert allowed.ok and allowed.hosts["node2"].checks["gpu"].status == "warn"
    assert any("GPU 1: pid 4242" in w for w in allowed.warnings), allowed.warnings


def test_gpus_outside_the_nodes_list_do_not_count_and_a_missing_one_fails(
    lab3: Lab, tmp_path: Path
) -> None:
    lab3.set_gpu_busy("node2", 1)

    def only_gpu0(h: dict) -> None:
        h["fleetctl_gpus"] = [0]  # a list of one (a bare 0 would be a count)

    ok = run_check(load_inventory(edited_inventory(lab3, tmp_path, "node2", only_gpu0)).nodes)
    assert ok.ok, ok.failures  # the busy GPU 1 is not this job's

    def gpu5(h: dict) -> None:
        h["fleetctl_gpus"] = "0,5"

    (tmp_path / "b").mkdir()
    bad = run_check(load_inventory(edited_inventory(lab3, tmp_path / "b", "node2", gpu5)).nodes)
    assert_only(bad, {("node2", "gpu")})
    assert reason(bad, "node2", "gpu") == "fleetctl_gpus lists 5 but nvidia-smi shows 0,1"


def test_passing_result_is_cached_until_recheck(lab3: Lab, tmp_path: Path) -> None:
    nodes = lab_nodes(lab3)
    first = run_check(nodes, cache_ttl=120, cache_dir=str(tmp_path))
    again = run_check(nodes, cache_ttl=120, cache_dir=str(tmp_path))
    forced = run_check(nodes, cache_ttl=120, cache_dir=str(tmp_path), recheck=True)
    assert first.ok and not first.cached
    assert again.cached and again.to_dict()["hosts"] == first.to_dict()["hosts"]
    assert again.facts == first.facts
    assert not forced.cached
    # A host that stopped answering makes the cached verdict stale: everything is checked again.
    lab3.kill_sshd("node2")
    try:
        stale = run_check(nodes, cache_ttl=120, cache_dir=str(tmp_path))
    finally:
        lab3.start_sshd("node2")
    assert not stale.cached
    assert_only(stale, {("node2", "ssh")})


def test_cli_prints_the_table_and_exits_3_on_failure(
    lab3: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.cli import main

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("COLUMNS", "250")
    with pytest.raises(SystemExit) as ok:
        main(["check", "-i", str(lab3.inventory_path), "--json", "--launcher", "torchrun"])
    assert ok.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["failures"] == [] and len(data["hosts"]) == 3

    lab3.kill_sshd("node3")
    try:
        with pytest.raises(SystemExit) as bad:
            main(["check", "-i", str(lab3.inventory_path), "--recheck"])
    finally:
        lab3.start_sshd("node3")
    out, err = capsys.readouterr()
    assert bad.value.code == 3
    assert "node3 ssh: connection refused" in out
    assert "FAILED: 1 of 3 host(s) failed" in out
    assert "fleetctl: error: check failed" in err


def test_single_local_host_needs_no_ssh(tmp_path: Path) -> None:
    node = Node.localhost(workdir=str(tmp_path / "w"))
    report = run_check([node], rdzv_port=_free_port())
    assert report.ok, report.failures
    assert report.hosts[node.name].checks["ssh"].detail == "local"
    assert report.facts[node.name].train_addr == "127.0.0.1"
    assert report.homes[node.name] == os.path.expanduser("~")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_nccl(folder: Path, version: int) -> Path:
    """A stand-in libnccl.so.2 whose ncclGetVersion reports ``version`` (e.g. 21803)."""
    src = folder / f"nccl{version}.c"
    src.write_text(f"int ncclGetVersion(int *v) {{ *v = {version}; return 0; }}\n")
    lib = folder / f"libnccl{version}.so.2"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


def test_env_python_and_nccl_versions_are_checked_and_must_agree(lab3: Lab) -> None:
    import tempfile

    if shutil.which("cc") is None:
        skip_or_fail("needs a C compiler for a fake libnccl")

    # Lab hosts have a private /tmp: build the fake libraries where they can see them.
    if SHARED_HOME:  # not a missing tool: the premise cannot hold on one shared home
        pytest.skip("one workdir on one filesystem cannot hold two NCCL versions at one path")
    shared = Path(tempfile.mkdtemp(prefix="fleetctl-check-", dir="/var/tmp"))
    shared.chmod(0o755)
    env = f"{lab3.workdir}/envs/e1"
    code_abc = f"{lab3.workdir}/code/abc"
    try:
        libs = {21803: _fake_nccl(shared, 21803), 21903: _fake_nccl(shared, 21903)}
        for h in lab3.hosts:
            lib = libs[21903 if h.name == "node3" else 21803]
            lab3.exec(
                h.name,
                [
                    "sh",
                    "-c",
                    f"mkdir -p {env}/bin {env}/lib && ln -sf "
                    f"{os.path.realpath(sys.executable)} {env}/bin/python && "
                    f"cp {lib} {env}/lib/libnccl.so.2 && "
                    # the login user's, as a push would leave them (a non-root lab)
                    f"chown -R --reference={lab3.home} {lab3.workdir}/envs",
                ],
                check=True,
            )
        lab3.exec(
            "node2",
            ["sh", "-c", f"mkdir -p {code_abc} && chown --reference={lab3.home} "
             f"{lab3.workdir}/code {code_abc}"],
            check=True,
        )  # fmt: skip
        report = run_check(
            lab_nodes(lab3),
            env_dir="envs/e1",
            code_dir="code/abc",
            env_imports=("json",),
            backend="nccl",
        )
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        for h in lab3.hosts:
            lab3.exec(h.name, ["rm", "-rf", env, code_abc], check=True)
    assert_only(report, {("node3", "env")})
    assert reason(report, "node3", "env") == "NCCL 2.19.3 while the others have 2.18.3"
    py = f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert reason(report, "node1", "env") == f"python {py}, NCCL 2.18.3"
    assert report.nccl_versions == {"node1": "2.18.3", "node2": "2.18.3", "node3": "2.19.3"}
    assert report.env_present == {"node1": True, "node2": True, "node3": True}
    assert report.code_present == {"node1": False, "node2": True, "node3": False}


# ------------------------------------------------------------------- the probe held for the run

# What runs the job: the basename of its parent's program file (argv[4] of ``python -S -c CODE
# FILE ...``): ``probe_<sha>.py`` when the check's probe became the supervisor.
PARENT_JOB = (
    "import os\n"
    "argv = open('/proc/%d/cmdline' % os.getppid(), 'rb').read().split(b'\\0')\n"
    "print('parent', os.path.basename(argv[4].decode()))\n"
)
# How many processes on a host run an installed probe (the pattern built so that this
# command's own cmdline does not hold it).
COUNT_PROBES = (
    "import os\n"
    "pat, n = b'/bin/' + b'probe_', 0\n"
    "for p in os.listdir('/proc'):\n"
    "    try:\n"
    "        n += p.isdigit() and pat in open('/proc/%s/cmdline' % p, 'rb').read()\n"
    "    except OSError:\n"
    "        pass\n"
    "print(n)\n"
)


def probes_running(lab: Lab) -> dict[str, int]:
    from fleetctl.testing.infra import node_host

    out = {}
    for node in lab_nodes(lab):
        res = node_host(node).run(f"{node.python} -S -c {shlex.quote(COUNT_PROBES)}")
        assert res.rc == 0, res.stderr
        out[node.name] = int(res.stdout)
    return out


def test_a_run_starts_each_supervisor_in_its_checks_probe_and_leaves_no_probe_behind(
    lab3: Lab, tmp_path: Path
) -> None:
    """The check's probe waits on its channel and becomes the node's supervisor: the launch
    costs no second remote command; a failed check, or a run without one, leaves none."""
    from fleetctl.testing.cli_runner import run_cli
    from fleetctl.testing.wait import wait_for

    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(PARENT_JOB)
    env = {"FLEETCTL_CACHE_DIR": str(tmp_path / "cache")}  # a real check, not a cached one

    def run(inventory: Path, *extra: str) -> Any:
        argv = ["run", "-i", str(inventory), "--launcher", "plain", "--nproc-per-node", "1"]
        argv += ["--runs-dir", str(tmp_path / "runs"), "--code-dir", str(code), *extra]
        return run_cli(*argv, str(code / "job.py"), env=env)

    def parents(out: str) -> list[str]:
        return sorted(line.rsplit(" ", 1)[1] for line in out.splitlines() if " parent " in line)

    res = run(lab3.inventory_path)
    assert res.exit_code == 0, res.stderr
    assert [p.split("_")[0] for p in parents(res.stdout)] == ["probe"] * len(lab3.hosts)
    wait_for(lambda: not any(probes_running(lab3).values()), 10, what="probes to exit")

    res = run(lab3.inventory_path, "--no-check")  # no probe to take over: a command of its own
    assert res.exit_code == 0, res.stderr
    assert [p.split("_")[0] for p in parents(res.stdout)] == ["supervisor"] * len(lab3.hosts)

    # one host fails the check: the probes that passed and waited are let go at once
    bad = edited_inventory(lab3, tmp_path, "node2", lambda v: v.update(fleetctl_nic="nosuch0"))
    res = run(bad)
    assert res.exit_code != 0 and "node2" in res.stderr, res.stderr
    wait_for(lambda: not any(probes_running(lab3).values()), 10, what="probes to exit")
