"""Lab logic that needs no root and no network: address rules, argument checks, generated
configs, the fake nvidia-smi. The real thing is exercised in tests/lab/test_lab.py."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetctl.errors import LabError, LabInputError
from fleetctl.lab import Lab, core, net

N = ipaddress.IPv4Network


def test_pairs_come_from_the_documented_pool_and_skip_taken_ones() -> None:
    assert net.choose_pair([]) == (N("10.213.0.0/24"), N("10.213.1.0/24"))
    taken = [N("10.213.1.7/32"), N("10.213.2.0/23")]
    assert net.choose_pair(taken) == (N("10.213.4.0/24"), N("10.213.5.0/24"))
    with pytest.raises(LabError, match="no free subnet"):
        net.choose_pair([N("10.213.0.0/16")])


def test_host_addresses_and_next_block() -> None:
    assert str(net.host_addr(N("10.9.0.0/24"), 1, 3)) == "10.9.0.11"
    assert str(net.host_addr(N("10.9.0.0/28"), 3, 3)) == "10.9.0.13"
    small = [str(net.host_addr(N("10.9.0.0/28"), i, 12)) for i in range(1, 13)]
    assert small == [f"10.9.0.{i}" for i in range(2, 14)]  # one scheme per lab: no collisions
    with pytest.raises(LabError):
        net.host_addr(N("10.9.0.0/28"), 14, 14)
    assert net.next_block(N("172.20.4.0/23")) == N("172.20.6.0/23")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("8.8.8.0/24", "private"),
        ("192.0.2.0/24", "private"),
        ("10.1.2.0/30", "too small"),
        ("banana", "not an IPv4 CIDR"),
    ],
)
def test_bad_subnets_are_input_errors(text: str, match: str) -> None:
    with pytest.raises(LabInputError) as e:
        net.parse_subnet(text)
    assert match in str(e.value) or (match == "private" and "10.0.0.0/8" in str(e.value))
    assert e.value.exit_code == 2


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"n": 0}, "host count"),
        ({"n": 2, "networks": 3}, "--networks"),
        ({"n": 2, "gpus": -1}, "--gpus"),
        ({"n": 2, "name": "Bad-Name"}, "--name"),
        ({"n": 2, "name": "waytoolongname"}, "--name"),
        ({"n": 30, "subnet": "10.50.0.0/28"}, "too small for 30 hosts"),
    ],
)
def test_up_rejects_bad_arguments_before_touching_anything(kw: dict, match: str) -> None:
    n = kw.pop("n")
    with pytest.raises(LabInputError, match=match):
        Lab.up(n, **kw)


@pytest.mark.parametrize("d", ["/tmp/lab", "/tmp", "/root/.fleetctl/lab", "/var/tmp/a b"])
def test_dirs_hidden_inside_hosts_are_refused(d: str) -> None:
    with pytest.raises(LabInputError):
        core._check_dir(Path(d))


def test_not_root_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core.os, "geteuid", lambda: 1000)
    with pytest.raises(LabError) as e:
        Lab.up(2)
    assert e.value.one_line().startswith("fleetctl lab needs root (")
    assert e.value.exit_code == 1


def _planned(networks: int = 2, gpus: int = 2) -> Lab:
    state = Lab._plan(
        "flab", Path("/var/tmp/fleetctl-lab/flab"), 3, networks, gpus,
        N("10.213.8.0/24"), N("10.213.9.0/24"), "/opt/py/bin/python3.11", "/usr/sbin/sshd",
    )  # fmt: skip
    return Lab(state)


def test_plan_names_fit_ifnamsiz_and_nics_differ() -> None:
    lab = _planned()
    assert [h.ns for h in lab.hosts] == ["flab-node1", "flab-node2", "flab-node3"]
    assert [h.nic for h in lab.hosts] == ["data0", "data0", "ib0"]
    assert all(len(x) <= 15 for h in lab.hosts for x in (h.mgmt_veth, h.data_veth) if x)
    assert [h.mgmt_addr for h in lab.hosts] == ["10.213.8.11", "10.213.8.12", "10.213.8.13"]
    one = _planned(networks=1)
    assert [h.nic for h in one.hosts] == ["eth0"] * 3 and one.data_bridge is None


def test_generated_sshd_and_client_configs_are_strict() -> None:
    lab = _planned()
    cfg = lab.files.sshd_config(lab.hosts[0])
    for line in (
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "MaxSessions 256",
        "MaxStartups 256:30:512",
        "UseDNS no",
        "AuthorizedKeysFile /var/tmp/fleetctl-lab/flab/authorized_keys",
        "ListenAddress 10.213.8.11:22",
        "ListenAddress 10.213.9.11:22",
    ):
        assert line in cfg.splitlines()
    assert "AcceptEnv" not in cfg
    client = lab.files.ssh_client_config()
    assert "StrictHostKeyChecking yes" in client
    assert "StrictHostKeyChecking no" not in client + cfg
    assert "UserKnownHostsFile /var/tmp/fleetctl-lab/flab/known_hosts" in client


def test_inventory_is_ansible_shaped() -> None:
    lab = _planned()
    inv = yaml.safe_load(lab.files.inventory())
    hosts = inv["all"]["children"]["nodes"]["hosts"]
    assert hosts["node3"]["fleetctl_nic"] == "ib0"
    assert hosts["node1"]["fleetctl_gpus"] == 2
    assert hosts["node1"]["ansible_python_interpreter"] == "/opt/py/bin/python3.11"
    assert "-o StrictHostKeyChecking=yes" in hosts["node2"]["ansible_ssh_common_args"]
    no_gpu = yaml.safe_load(_planned(gpus=0).files.inventory())
    assert "fleetctl_gpus" not in no_gpu["all"]["children"]["nodes"]["hosts"]["node1"]


@pytest.fixture
def smi(tmp_path: Path):  # type: ignore[no-untyped-def]
    src = Path(core.__file__).with_name("fake_nvidia_smi.py")
    shutil.copy(src, tmp_path / "nvidia-smi")

    def run(*args: str, count: int = 2) -> subprocess.CompletedProcess[str]:
        (tmp_path / "nvidia-smi.json").write_text(json.dumps({"count": count, "seed": "s"}))
        return subprocess.run([sys.executable, str(tmp_path / "nvidia-smi"), *args],
                              capture_output=True, text=True, timeout=30)  # fmt: skip

    return run


def test_fake_nvidia_smi_speaks_the_real_formats(smi) -> None:  # type: ignore[no-untyped-def]
    lst = smi("-L").stdout.splitlines()
    assert len(lst) == 2 and lst[1].startswith("GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    q = smi("--query-gpu=index,uuid,memory.total", "--format=csv,noheader").stdout.splitlines()
    assert q[0].split(", ")[0] == "0" and q[0].endswith(", 81559 MiB")
    assert q[0].split(", ")[1] in lst[0]
    assert smi("--query-gpu=name", "--format=csv").stdout.splitlines()[0] == "name"
    assert smi("-L", "-i", "1").stdout.startswith("GPU 1:")
    assert smi("--query-gpu=count", "--format=csv,noheader", count=4).stdout.split() == ["4"] * 4
    assert smi("--query-compute-apps=pid", "--format=csv,noheader").stdout == ""
    assert "Driver Version" in smi().stdout
    bad = smi("--query-gpu=nope", "--format=csv")
    assert bad.returncode == 2 and 'Field "nope"' in bad.stderr
    none = smi("-L", count=0)
    assert none.returncode == 6 and none.stdout.strip() == "No devices were found"


def test_fake_nvidia_smi_in_a_slurm_step_shows_the_steps_gpus(tmp_path: Path) -> None:
    """As the real one where cgroup.conf has ConstrainDevices=yes: the step's GPUs (the batch
    step: the job's); outside Slurm, or in a job without gres, every GPU."""
    shutil.copy(Path(core.__file__).with_name("fake_nvidia_smi.py"), tmp_path / "nvidia-smi")
    (tmp_path / "nvidia-smi.json").write_text(json.dumps({"count": 4, "seed": "s"}))
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}

    def listed(**env: str) -> list[str]:
        p = subprocess.run(
            [sys.executable, str(tmp_path / "nvidia-smi"), "--query-gpu=index,count",
             "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, env={**clean, **env},
        )  # fmt: skip
        return p.stdout.splitlines()

    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "0,1,2,3"}
    assert listed(**job, SLURM_STEP_GPUS="2") == ["2, 1"]
    assert listed(**job) == ["0, 4", "1, 4", "2, 4", "3, 4"]
    assert listed(SLURM_JOB_ID="7", SLURM_JOB_GPUS="1,3") == ["1, 2", "3, 2"]
    assert len(listed()) == len(listed(SLURM_JOB_ID="7")) == 4


def test_fixture_skips_without_root_but_fails_when_the_lab_is_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetctl.testing import pytest_plugin

    monkeypatch.setattr(pytest_plugin.os, "geteuid", lambda: 1000)
    monkeypatch.delenv("FLEETCTL_REQUIRE_LAB", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs root"):
        pytest_plugin.require_lab()
    monkeypatch.setenv("FLEETCTL_REQUIRE_LAB", "1")
    with pytest.raises(pytest.fail.Exception, match="FLEETCTL_REQUIRE_LAB=1 but"):
        pytest_plugin.require_lab()


def test_a_missing_module_skips_but_fails_when_the_lab_is_required(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from fleetctl.testing.pytest_plugin import import_or_skip

    missing = "fleetctl_no_such_module_for_this_test"
    monkeypatch.delenv("FLEETCTL_REQUIRE_LAB", raising=False)
    assert import_or_skip("json", "stdlib").dumps(1) == "1"
    with pytest.raises(pytest.skip.Exception, match="needed here"):
        import_or_skip(missing, "needed here")
    monkeypatch.setenv("FLEETCTL_REQUIRE_LAB", "1")
    with pytest.raises(pytest.fail.Exception, match="FLEETCTL_REQUIRE_LAB=1 but needed here"):
        import_or_skip(missing, "needed here")


def test_tests_never_see_the_developers_ssh_agent_or_config() -> None:
    import os

    assert "SSH_AUTH_SOCK" not in os.environ
    assert os.environ["FLEETCTL_SSH_CONFIG"] == "/dev/null"


def test_cli_without_root_exits_1_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fleetctl.cli import main

    monkeypatch.setattr(core.os, "geteuid", lambda: 1000)
    with pytest.raises(SystemExit) as e:
        main(["lab", "up", "2"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("fleetctl: error: fleetctl lab needs root (") and err.count("\n") == 1


def test_down_says_what_it_waits_for_and_each_host_as_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lab down` may wait (another lab command's lock, processes slow to die): every step is
    said as it starts. The lab is a plan whose node1 PID 1 is a real process of this test; no
    namespace or link exists, and nothing outside tmp_path is touched."""
    import threading

    from fleetctl.lab import procs
    from fleetctl.lab.registry import _locked

    state = Lab._plan(
        "pdown", tmp_path / "pdown", 2, 1, 0,
        N("10.213.8.0/24"), N("10.213.9.0/24"), sys.executable, "/usr/sbin/sshd",
    )  # fmt: skip
    lab = Lab(state)
    lab.dir.mkdir()
    init = subprocess.Popen(["sleep", "60"])
    lab.hosts[0].pids, lab.hosts[0].starts = (
        {"init": init.pid},
        {"init": procs.start_time(init.pid)},
    )
    lab.store.save()
    monkeypatch.setattr(core, "require_root", lambda: None)
    monkeypatch.setattr(core, "REGISTRY", tmp_path / "registry")
    monkeypatch.setattr(core, "_registry_entries", lambda: [{"name": "another lab"}])
    batch: list[list[str]] = []
    monkeypatch.setattr(net, "ip_batch", lambda cmds, **_: batch.append(list(cmds)))
    for absent in ("link_exists", "netns_exists"):
        monkeypatch.setattr(net, absent, lambda _: False)
    monkeypatch.setattr(net, "route_networks", lambda: [])

    held, release, said = threading.Event(), threading.Event(), []

    def other_command() -> None:
        with _locked(lab.dir / ".lock"):
            held.set()
            release.wait(10)

    def progress(step: str) -> None:
        said.append(step)
        release.set()  # the other command lets go once down has said it waits

    holder = threading.Thread(target=other_command)
    holder.start()
    try:
        assert held.wait(10)
        removed = lab.down(progress=progress)
    finally:
        release.set()
        holder.join(10)
        init.kill()
        init.wait(10)
    assert said == [
        f"waiting for {tmp_path}/pdown/.lock: another fleetctl lab command holds it",
        "stopping 1 host: up to 10 s for its processes to end",
        "node1: stopped",
    ]
    assert removed == [f"node1 init pid {init.pid}"] and batch == [[]]
