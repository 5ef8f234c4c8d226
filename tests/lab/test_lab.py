"""The namespace lab against real OpenSSH: hosts, isolation, faults, teardown.

Network rule: every packet here goes to a lab host address (from this machine only to
management addresses, whose bridge has the gateway; data addresses only from inside lab hosts,
which have no default route).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab import Lab, procs
from fleetctl.lab.constants import REGISTRY
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.pytest_plugin import skip_or_fail
from fleetctl.transport.connection import SSHSettings, connect

pytestmark = pytest.mark.lab

SSH_TIMEOUT = 30


def ssh(
    lab: Lab, host: str, command: str, *, config: Path | None = None, extra: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Real OpenSSH client, strict host key checking against the lab's pinned keys."""
    argv = ["ssh", "-F", str(config or lab.ssh_config), *(extra or []), host, command]
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=SSH_TIMEOUT, stdin=subprocess.DEVNULL
    )


def banner(addr: str, timeout: float = 1.0) -> bytes:
    with socket.create_connection((addr, 22), timeout=timeout) as s:
        s.settimeout(timeout)
        return s.recv(64)


def ping(lab: Lab, src: str, dst_addr: str, wait: int = 1) -> subprocess.CompletedProcess[str]:
    return lab.exec(src, ["ping", "-n", "-c", "1", "-W", str(wait), dst_addr], timeout=10)


# ---------------------------------------------------------------------------- the hosts


def test_each_host_answers_ssh_with_its_own_name_and_addresses(lab3: Lab) -> None:
    for h in lab3.hosts:
        r = ssh(lab3, h.name, "hostname; ip -4 -o addr show")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == h.name
        addrs = "\n".join(lines[1:])
        assert re.search(rf"\beth0\s+inet {re.escape(h.mgmt_addr)}/", addrs), addrs
        assert re.search(rf"\b{h.nic}\s+inet {re.escape(h.data_addr or '')}/", addrs), addrs
        others = [o for o in lab3.hosts if o is not h]
        assert not any(o.mgmt_addr in addrs for o in others)


def test_data_nic_names_differ_and_inventory_matches(lab3: Lab) -> None:
    assert [h.nic for h in lab3.hosts] == ["data0", "data0", "ib0"]
    inv = yaml.safe_load(lab3.inventory_path.read_text())
    hosts = inv["all"]["children"]["nodes"]["hosts"]
    assert list(hosts) == ["node1", "node2", "node3"]
    for h in lab3.hosts:
        v = hosts[h.name]
        assert v["ansible_host"] == h.mgmt_addr
        assert v["ansible_user"] == "root"
        assert v["fleetctl_nic"] == h.nic
        assert v["fleetctl_gpus"] == 2
        assert v["fleetctl_known_hosts"] == str(lab3.known_hosts)
        assert v["ansible_ssh_private_key_file"] == str(lab3.key_path)
        assert "StrictHostKeyChecking=yes" in v["ansible_ssh_common_args"]
        assert "shims" not in v["fleetctl_python"]
        assert os.path.realpath(v["fleetctl_python"]) == os.path.realpath(sys.executable)
    assert oct(lab3.key_path.stat().st_mode & 0o777) == "0o600"


def test_host_keys_are_pinned_not_trusted_blindly(lab3: Lab, tmp_path: Path) -> None:
    # A known_hosts that pins node2's key under node1's address must make ssh refuse node1.
    n1, n2 = lab3.hosts[0], lab3.hosts[1]
    keys = {
        ln.split()[0].split(",")[0]: ln.split(None, 1)[1]
        for ln in lab3.known_hosts.read_text().splitlines()
        if ln.strip()
    }
    assert keys["node1"] != keys["node2"]
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"{n1.mgmt_addr} {keys['node2']}\n")
    r = ssh(lab3, n1.name, "true", extra=["-o", f"UserKnownHostsFile={wrong}"])
    assert r.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr
    empty = tmp_path / "empty"
    empty.write_text("")
    r = ssh(lab3, n2.name, "true", extra=["-o", f"UserKnownHostsFile={empty}"])
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr


def test_workdir_and_tmp_are_private_per_host(lab3: Lab) -> None:
    token = f"t{os.getpid()}{time.monotonic_ns()}"
    r = ssh(lab3, "node1", f"echo {token} > /root/.fleetctl/{token} && echo x > /tmp/{token}")
    assert r.returncode == 0, r.stderr
    try:
        assert ssh(lab3, "node1", f"cat /root/.fleetctl/{token}").stdout.strip() == token
        r2 = ssh(lab3, "node2", f"ls /root/.fleetctl/{token} /tmp/{token}")
        assert r2.returncode != 0
        assert "No such file" in r2.stderr
        assert not Path(f"/root/.fleetctl/{token}").exists()  # not on this machine either
        assert (lab3.host_dir("node1") / "fleetctl" / token).read_text().strip() == token
    finally:
        (lab3.host_dir("node1") / "fleetctl" / token).unlink(missing_ok=True)
        (lab3.host_dir("node1") / "tmp" / token).unlink(missing_ok=True)


def test_hosts_reach_each_other_on_both_networks_and_nothing_else(lab3: Lab) -> None:
    src = lab3.hosts[0]
    for dst in lab3.hosts[1:]:
        for addr in (dst.mgmt_addr, dst.data_addr):
            r = ping(lab3, src.name, addr or "")
            assert r.returncode == 0, f"{src.name} -> {addr}: {r.stdout}{r.stderr}"
    for h in lab3.hosts:
        routes = lab3.exec(h.name, ["ip", "-4", "route", "show"], check=True).stdout
        assert "default" not in routes, routes


def test_host_sees_only_its_own_processes(lab3: Lab) -> None:
    out = lab3.exec("node2", ["ps", "-e", "-o", "pid=,args="], check=True).stdout
    rows = [ln.split(None, 1) for ln in out.strip().splitlines()]
    by_pid = {int(p): a for p, a in rows}
    assert "hostinit.py" in by_pid[1]
    assert "node2" in by_pid[1]
    listeners = [a for a in by_pid.values() if "[listener]" in a]
    assert len(listeners) == 1 and "/hosts/node2/ssh/sshd_config" in listeners[0]
    assert not any("node1" in a or "node3" in a for a in by_pid.values())


def test_host_mounts_are_private_and_pin_no_other_namespace(lab3: Lab) -> None:
    info = lab3.exec("node1", ["cat", "/proc/self/mountinfo"], check=True).stdout
    assert " - nsfs " not in info  # copies of /run/netns/* would keep other labs' netns alive
    targets = {ln.split()[4] for ln in info.splitlines()}
    assert {"/root/.fleetctl", "/tmp", "/etc/hosts", "/dev/shm", "/sys"} <= targets
    hosts = lab3.exec("node1", ["getent", "hosts", "node3"], check=True).stdout.split()
    assert hosts[0] == lab3.host("node3").mgmt_addr
    mine = Path("/proc/self/mountinfo").read_text()
    assert lab3.name not in mine.replace(f"/run/netns/{lab3.name}-", "")  # nothing leaked here


def test_fake_nvidia_smi_formats_and_per_host_override(lab3: Lab) -> None:
    r = ssh(lab3, "node1", "nvidia-smi -L")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"GPU 0: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)", lines[0])
    q = ssh(
        lab3,
        "node1",
        "nvidia-smi --query-gpu=index,name,memory.total,driver_version,uuid "
        "--format=csv,noheader,nounits",
    ).stdout.splitlines()
    assert len(q) == 2
    idx, name, mem, drv, uuid = [x.strip() for x in q[1].split(",")]
    assert (idx, name, mem) == ("1", "NVIDIA H100 80GB HBM3", "81559")
    assert uuid in lines[1] and re.fullmatch(r"\d+\.\d+\.\d+", drv)
    hdr = ssh(lab3, "node1", "nvidia-smi --query-gpu=memory.total --format=csv").stdout
    assert hdr.splitlines() == ["memory.total [MiB]", "81559 MiB", "81559 MiB"]
    bad = ssh(lab3, "node1", "nvidia-smi --query-gpu=bogus --format=csv")
    assert bad.returncode == 2
    other = ssh(lab3, "node2", "nvidia-smi -L").stdout
    assert other.splitlines()[0] != lines[0]  # distinct UUIDs per host
    lab3.set_gpus("node2", 1)
    assert len(ssh(lab3, "node2", "nvidia-smi -L").stdout.splitlines()) == 1
    lab3.set_gpus("node2", 0)
    none = ssh(lab3, "node2", "nvidia-smi -L")
    assert none.returncode == 6 and "No devices were found" in none.stdout
    lab3.set_gpus("node2", None)
    gone = ssh(lab3, "node2", "nvidia-smi -L")
    assert gone.returncode == 127 and "not found" in gone.stderr


@pytest.mark.slow
def test_ansible_uses_the_inventory_with_strict_host_keys(lab3: Lab, tmp_path: Path) -> None:
    ansible = Path(sys.executable).with_name("ansible")
    if not ansible.exists():
        skip_or_fail("ansible-core not installed next to this python")
    env = {
        **os.environ,
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "a"),
        "ANSIBLE_HOME": str(tmp_path / "h"),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_CONFIG": str(tmp_path / "ansible.cfg"),  # not the repo's ansible.cfg
    }
    (tmp_path / "ansible.cfg").write_text("[defaults]\n")
    r = subprocess.run(
        [
            str(ansible),
            "-i",
            str(lab3.inventory_path),
            "nodes",
            "-m",
            "ansible.builtin.command",
            "-a",
            "hostname",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    for h in lab3.hosts:
        assert re.search(rf"^{h.name} \| CHANGED \| rc=0 >>\n{h.name}$", r.stdout, re.M), r.stdout


# ---------------------------------------------------------------------------- faults


def test_cut_and_heal_management_link(lab3: Lab) -> None:
    h = lab3.hosts[1]
    assert banner(h.mgmt_addr).startswith(b"SSH-2.0-")
    lab3.cut_link(h.name)
    with pytest.raises(OSError):
        banner(h.mgmt_addr, timeout=1.0)
    assert ping(lab3, "node1", h.mgmt_addr).returncode != 0
    assert ping(lab3, "node1", h.data_addr or "").returncode == 0  # the other cable is fine
    lab3.heal_link(h.name)
    assert ping(lab3, "node1", h.mgmt_addr, wait=2).returncode == 0
    r = ssh(lab3, h.name, "hostname")
    assert r.returncode == 0 and r.stdout.strip() == h.name


def test_cut_and_heal_data_link(lab3: Lab) -> None:
    h = lab3.hosts[2]
    lab3.cut_link(h.name, "data")
    assert ping(lab3, "node1", h.data_addr or "").returncode != 0
    assert ping(lab3, "node1", h.mgmt_addr).returncode == 0
    assert [f["kind"] for f in lab3.faults] == ["link"]
    lab3.heal_link(h.name, "data")
    assert ping(lab3, "node1", h.data_addr or "", wait=2).returncode == 0
    assert lab3.faults == []


def test_kill_and_restart_sshd(lab3: Lab) -> None:
    h = lab3.hosts[0]
    old = lab3.sshd_pid(h.name)
    assert old is not None
    lab3.kill_sshd(h.name)
    assert procs.start_time(old) is None
    with pytest.raises(ConnectionRefusedError):
        banner(h.mgmt_addr)
    r = ssh(lab3, h.name, "true")
    assert r.returncode == 255 and "Connection refused" in r.stderr
    assert lab3.host(h.name).init_pid is not None  # the host itself is still up
    lab3.start_sshd(h.name)
    new = lab3.sshd_pid(h.name)
    assert new is not None and new != old
    assert ssh(lab3, h.name, "hostname").stdout.strip() == h.name


def test_kill_sshd_after_a_restart_kills_the_listener_not_a_surviving_session(
    lab3: Lab,
) -> None:
    """A session that outlived a killed listener is re-parented to the host's PID 1 and runs
    the same sshd binary; the next ``kill_sshd`` must still kill the (new) listener."""
    h = lab3.hosts[1]
    node = next(n for n in load_inventory(lab3.inventory_path).nodes if n.name == h.name)
    conn = connect(node, SSHSettings(connect_timeout=5))
    try:
        assert conn.run("hostname", timeout=SSH_TIMEOUT).stdout.strip() == h.name
        first = lab3.kill_sshd(h.name)  # the session above lives on, now a child of PID 1
        lab3.start_sshd(h.name)
        listener = lab3.sshd_pid(h.name)
        assert listener is not None and listener != first
        assert lab3.kill_sshd(h.name) == listener
        with pytest.raises(ConnectionRefusedError):
            banner(h.mgmt_addr)
        assert lab3.sshd_pid(h.name) is None
        # The surviving session was left alone (a real crash keeps open sessions too).
        assert conn.run("hostname", timeout=SSH_TIMEOUT).stdout.strip() == h.name
    finally:
        conn.close()


def neigh_states(lab: Lab, host: str, addr: str, dev: str) -> list[str]:
    out = lab.exec(host, ["ip", "-j", "neigh", "show", "to", addr, "dev", dev], check=True).stdout
    return [s for e in json.loads(out or "[]") for s in e.get("state", [])]


CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], 22), timeout=3).close()\n"
    "    print('ok')\n"
    "except OSError as e:\n"
    "    print(repr(e))\n"
)


def test_heal_link_forgets_address_resolution_that_ran_out_while_cut(make_lab) -> None:  # type: ignore[no-untyped-def]
    """Right after ``heal_link`` a connection works, even from a host whose ARP for the healed
    host was still pending: the kernel would fail every packet queued on that entry once its
    last probe timed out ("No route to host" on a working link)."""
    lab = make_lab(2, networks=2)
    a, b = lab.hosts
    assert a.data_nic and b.data_addr
    # One ARP probe, given up after 5 s: the pending entry outlives the heal for sure.
    knobs = [f"net.ipv4.neigh.{a.data_nic}.{k}" for k in ("mcast_solicit", "retrans_time_ms")]
    lab.exec(a.name, ["sysctl", "-qw", f"{knobs[0]}=1", f"{knobs[1]}=5000"], check=True)
    lab.cut_link(b.name, "data")
    assert ping(lab, a.name, b.data_addr).returncode != 0
    assert neigh_states(lab, a.name, b.data_addr, a.data_nic) == ["INCOMPLETE"]
    lab.heal_link(b.name, "data")
    r = lab.exec(a.name, [lab.state["python"], "-c", CONNECT, b.data_addr], timeout=10)
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


def test_netem_delay_raises_rtt(lab3: Lab) -> None:
    if not lab3.netem_supported():
        # The one known skip in CI, whose kernel has no sch_netem: a plain skip on purpose
        # (test_netem_unsupported_is_one_clear_error covers that kernel instead).
        pytest.skip("kernel without sch_netem (as in CI): delay/loss faults unavailable here")
    h = lab3.hosts[1]
    lab3.netem(h.name, delay_ms=40)
    out = ping(lab3, "node1", h.mgmt_addr, wait=3).stdout
    rtt = float(re.search(r"time=([\d.]+) ms", out).group(1))  # type: ignore[union-attr]
    assert rtt >= 40.0, out
    lab3.clear_netem(h.name)
    out = ping(lab3, "node1", h.mgmt_addr).stdout
    assert float(re.search(r"time=([\d.]+) ms", out).group(1)) < 40.0  # type: ignore[union-attr]


def test_netem_unsupported_is_one_clear_error(lab3: Lab) -> None:
    if lab3.netem_supported():
        # Plain skip: CI's kernel lacks sch_netem, so CI always runs this one.
        pytest.skip("this kernel has sch_netem (test_netem_delay_raises_rtt runs instead)")
    with pytest.raises(LabError, match="no netem qdisc"):
        lab3.netem("node1", delay_ms=10)
    assert lab3.faults == []


def test_disk_full_and_back(lab3: Lab) -> None:
    write = "head -c 5000000 /dev/zero > /root/.fleetctl/big.bin"
    lab3.disk_full("node3")
    try:
        r = ssh(lab3, "node3", write)
        assert r.returncode != 0
        assert "No space left on device" in r.stderr
        assert ssh(lab3, "node2", write + " && rm /root/.fleetctl/big.bin").returncode == 0
    finally:
        lab3.disk_ok("node3")
    r = ssh(
        lab3,
        "node3",
        write + " && stat -c %s /root/.fleetctl/big.bin && rm /root/.fleetctl/big.bin",
    )
    assert r.returncode == 0 and r.stdout.strip() == "5000000", r.stderr


def test_crash_and_boot_host_keeps_its_disk(lab3: Lab) -> None:
    h = lab3.hosts[1]
    assert ssh(lab3, h.name, "echo kept > /root/.fleetctl/crash-marker").returncode == 0
    sleeper = lab3.exec(h.name, ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"]).stdout
    assert sleeper.strip().isdigit()
    init = lab3.host(h.name).init_pid
    assert init is not None
    lab3.crash_host(h.name)
    assert procs.start_time(init) is None
    assert procs.pids_in_netns(f"/run/netns/{h.ns}") == []  # the sleep died with the host
    with pytest.raises(OSError):
        banner(h.mgmt_addr)
    lab3.boot_host(h.name)
    r = ssh(
        lab3, h.name, "hostname; cat /root/.fleetctl/crash-marker; rm /root/.fleetctl/crash-marker"
    )
    assert r.stdout.split() == [h.name, "kept"], r.stderr


def test_reset_faults_undoes_everything(make_lab) -> None:  # type: ignore[no-untyped-def]
    lab = make_lab(2, networks=2, gpus=2)
    lab.cut_link("node1", "data")
    lab.kill_sshd("node2")
    lab.disk_full("node1", "/root/.fleetctl/runs", "512k")
    lab.set_gpus("node1", 1)
    lab.set_gpus("node1", None)  # one fault, remembering the first state
    assert len(lab.faults) == 4
    with pytest.raises(LabInputError, match=r"no full disk at /root/\.fleetctl; the lab filled"):
        lab.disk_ok("node1")  # the wrong path is not a silent success
    again = Lab.load(lab.dir)  # another process (the CLI) sees the same faults
    assert again.faults == lab.faults
    again.reset_faults()
    lab2 = Lab.load(lab.dir)
    assert lab2.faults == []
    assert ssh(lab2, "node2", "hostname").stdout.strip() == "node2"
    assert ping(lab2, "node2", lab2.hosts[0].data_addr or "", wait=2).returncode == 0
    mounts = lab2.exec("node1", ["cat", "/proc/self/mounts"], check=True).stdout
    assert "fleetctl-lab-full" not in mounts
    gpus = lab2.exec("node1", ["nvidia-smi", "-L"], check=True).stdout
    assert len(gpus.splitlines()) == 2  # the fake GPU count is back too


# ---------------------------------------------------------------------------- lifecycle


def _lab_traces(lab: Lab) -> list[str]:
    """Everything of ``lab`` still visible on this machine."""
    found = []
    names = [h.ns for h in lab.hosts]
    ns_list = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [n for n in names if re.search(rf"^{re.escape(n)}\b", ns_list, re.M)]
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    found += [f"link {m}" for m in re.findall(rf"\d+: ({re.escape(lab.name)}-[^:@ ]+)", links)]
    mounts = Path("/proc/mounts").read_text()
    found += [f"mount {ln}" for ln in mounts.splitlines() if lab.name in ln]
    for h in lab.hosts:
        for key, pid in h.pids.items():
            if procs.same_process(pid, h.starts.get(key)):
                found.append(f"{h.name} {key} pid {pid}")
    if (REGISTRY / f"{lab.name}.json").exists():
        found.append("registry entry")
    return found


def test_down_leaves_nothing_and_is_idempotent(make_lab) -> None:  # type: ignore[no-untyped-def]
    lab = make_lab(3, networks=2, gpus=1)
    snapshot = Lab.load(lab.dir)  # keeps the PIDs for checking after down
    sshd = [lab.sshd_pid(h.name) for h in lab.hosts]
    assert all(sshd)
    assert _lab_traces(snapshot) != []
    removed = lab.down()
    assert removed
    assert _lab_traces(snapshot) == []
    assert all(procs.start_time(p) is None for p in sshd if p)
    assert not lab.dir.exists()
    assert lab.down() == []  # idempotent


def test_two_labs_at_once_do_not_clash(make_lab) -> None:  # type: ignore[no-untyped-def]
    a = make_lab(2, networks=2)
    b = make_lab(2, networks=2)
    assert a.name != b.name
    subnets = [
        a.state["mgmt"]["subnet"],
        a.state["data"]["subnet"],
        b.state["mgmt"]["subnet"],
        b.state["data"]["subnet"],
    ]
    assert len(set(subnets)) == 4
    ka = ssh(a, "node1", "cat /proc/sys/kernel/hostname").stdout
    kb = ssh(b, "node1", "cat /proc/sys/kernel/hostname").stdout
    assert ka == kb == "node1\n"
    # Same host name, different machines: a's pinned key for node1 must refuse b's node1.
    r = subprocess.run(
        [
            "ssh",
            "-F",
            "/dev/null",
            "-o",
            f"UserKnownHostsFile={a.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "HostKeyAlias=node1",
            "-i",
            str(a.key_path),
            f"root@{b.hosts[0].mgmt_addr}",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=SSH_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr
    with pytest.raises(LabInputError, match="overlaps"):
        Lab.up(1, subnet=a.state["mgmt"]["subnet"])
    with pytest.raises(LabInputError, match="overlaps"):
        Lab.up(1, subnet=b.state["data"]["subnet"], networks=1)


def test_down_cleans_up_after_a_crashed_up(tmp_path: Path, lab_required: None) -> None:
    name = f"cr{os.getpid() % 100000}"
    lab_dir = Path("/var/tmp/fleetctl-lab") / name
    # A process that dies hard (no cleanup, like SIGKILL) right after the hosts started.
    code = (
        "import os\n"
        "from fleetctl.lab import core\n"
        "core.net.wait_banner = lambda *a, **k: os._exit(9)\n"
        f"core.Lab.up(2, networks=2, name={name!r}, owner='pytest')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 9, r.stderr
    lab = Lab.load(lab_dir)
    try:
        assert lab.state["phase"] == "creating"
        assert _lab_traces(lab) != []  # the crash really left things behind
        assert all(h.init_pid for h in lab.hosts)
    finally:
        lab.down()
    assert _lab_traces(lab) == []
    assert not lab_dir.exists()


def test_down_sweeps_processes_it_never_recorded(make_lab) -> None:  # type: ignore[no-untyped-def]
    lab = make_lab(1)
    h = lab.hosts[0]
    # A process started in the host's netns behind the lab's back (like `ip netns exec`).
    p = subprocess.Popen(
        ["ip", "netns", "exec", h.ns, "sleep", "300"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 5
        while p.pid not in procs.pids_in_netns(f"/run/netns/{h.ns}"):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        lab.down()
        assert p.wait(timeout=10) == -9
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_cli_up_fault_status_down(lab_required: None) -> None:
    name = f"cli{os.getpid() % 10000}"
    run = [sys.executable, "-m", "fleetctl", "lab"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*run, *args], capture_output=True, text=True, timeout=120)

    up = cli("up", "2", "--networks", "2", "--gpus", "1", "--name", name, "--json")
    try:
        assert up.returncode == 0, up.stderr
        st = json.loads(up.stdout)
        assert st["name"] == name and [h["nic"] for h in st["hosts"]] == ["data0", "ib0"]
        lab = Lab.find(name=name)
        assert cli("fault", "--name", name, "cut", "node2").returncode == 0
        st = json.loads(cli("status", "--name", name, "--json").stdout)
        assert st["faults"] == [{"kind": "link", "host": "node2", "net": "mgmt"}]
        assert [h["ssh_ok"] for h in st["hosts"]] == [True, False]
        assert cli("fault", "--name", name, "reset").returncode == 0
        assert ssh(lab, "node2", "hostname").stdout.strip() == "node2"
        bad = cli("fault", "--name", name, "cut", "node9")
        assert bad.returncode == 2 and "no host 'node9'" in bad.stderr
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    again = cli("down", "--name", name)
    assert again.returncode == 0 and "nothing to tear down" in again.stdout


def test_cli_refuses_overlapping_subnet_with_one_line(lab3: Lab) -> None:
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fleetctl",
            "lab",
            "up",
            "1",
            "--subnet",
            lab3.state["mgmt"]["subnet"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "overlaps" in r.stderr


# ------------------------------------------------------------------ a non-root login user


@pytest.mark.parametrize("shared", [False, True], ids=["own-homes", "shared-home"])
def test_a_lab_of_a_login_user_logs_in_as_it_hides_roots_home_and_down_removes_it_all(
    make_lab,
    shared: bool,  # type: ignore[no-untyped-def]
) -> None:
    import pwd

    user = "fleetlu"
    with pytest.raises(KeyError):
        pwd.getpwnam(user)  # made by the lab, so the lab must remove it again
    lab = make_lab(2, user=user, shared_home=shared)
    assert (lab.user, lab.home, lab.workdir) == (user, f"/home/{user}", f"/home/{user}/.fleetctl")
    inv = yaml.safe_load(lab.inventory_path.read_text())
    assert {h["ansible_user"] for h in inv["all"]["children"]["nodes"]["hosts"].values()} == {user}
    r = ssh(lab, "node1", "id -un; echo $HOME; echo $(ls -A /root); python3 -c 'import torch'")
    assert r.returncode == 0, r.stderr
    name, home, root_listing = r.stdout.split("\n")[:3]
    assert (name, home) == (user, f"/home/{user}")
    from fleetctl.lab.files import _root_paths_needed

    kept = sorted(os.path.basename(p) for p in _root_paths_needed(lab.state["python"]))
    assert root_listing.split() == kept  # root's home hidden but for the lab's Python
    assert ssh(lab, "node1", "echo mine > ~/marker").returncode == 0
    seen = ssh(lab, "node2", "cat ~/marker 2>/dev/null || echo none").stdout.strip()
    assert seen == ("mine" if shared else "none")  # one home for all, or one per host
    lab.down()
    with pytest.raises(KeyError):
        pwd.getpwnam(user)
    assert not os.path.exists(f"/home/{user}") and not lab.dir.exists()


def test_a_lab_makes_room_in_the_kernels_neighbour_table_and_the_last_down_gives_it_back() -> None:
    """One ARP table serves every namespace: a lab raises its limits to fit all lab hosts
    (at the default 1024, ~100 hosts overflow it and packets are dropped like cut links),
    never lowers them while other labs run, and the last lab down restores the machine's."""
    from fleetctl.lab import net
    from fleetctl.lab.constants import NEIGH_SAVED
    from fleetctl.lab.registry import _registry_entries

    saved = REGISTRY / NEIGH_SAVED
    before = net.neigh_thresholds()
    machine = json.loads(saved.read_text()) if saved.exists() else before
    others = sum(int(e.get("hosts") or 0) for e in _registry_entries())
    lab = Lab.up(4, networks=1)
    try:
        need = net.NEIGH_BASE + net.NEIGH_PER_HOST * (4 + others)
        up = net.neigh_thresholds()
        assert up[2] >= need and up[2] >= before[2] and up[1] >= before[1], (before, up)
    finally:
        lab.down()
    after = net.neigh_thresholds()
    if _registry_entries():  # other labs still up: nothing lowered under them
        assert after == up
    else:
        assert after == machine and not saved.exists()
