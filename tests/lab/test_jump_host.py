"""Hosts reached only through a bastion named in the inventory (``ansible_ssh_common_args:
-o ProxyJump=…``), as Ansible users reach private clusters.

node2 and node3 are addressed by their data-network addresses, which this machine has no route
to (the data bridge carries no address here); node1's management address is the jump host.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from fleetctl.job.monitor.process import monitor_alive
from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli, run_cli_process
from fleetctl.testing.wait import wait_for

pytestmark = pytest.mark.lab


def behind_bastion(lab: Lab, tmp_path: Path, *, jump: bool = True) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    bastion = lab.hosts[0]
    cfg = tmp_path / "ssh_config"  # how the bastion itself is logged into: the user's config
    cfg.write_text(
        f"Host {bastion.mgmt_addr}\n  User root\n  IdentityFile {lab.key_path}\n"
        "  IdentitiesOnly yes\n"
    )
    data = yaml.safe_load(lab.inventory_path.read_text())
    hosts = data["all"]["children"]["nodes"]["hosts"]
    for h in lab.hosts[1:]:
        v = hosts[h.name]
        v["ansible_host"] = h.data_addr
        args = f"-F {cfg} -o UserKnownHostsFile={lab.known_hosts} -o StrictHostKeyChecking=yes"
        if jump:
            args += f" -o ProxyJump=root@{bastion.mgmt_addr}"
        v["ansible_ssh_common_args"] = args
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_data_addresses_are_unreachable_from_here(lab3: Lab) -> None:
    """The lab's unreachable route: refused here at once, nothing leaves the machine."""
    import errno

    target = lab3.hosts[1].data_addr
    assert target
    with socket.socket() as s, pytest.raises(OSError) as e:
        s.settimeout(2)
        s.connect((target, 22))
    assert e.value.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH)


def test_exec_push_and_run_reach_hosts_only_through_the_inventory_jump_host(
    lab3: Lab, tmp_path: Path
) -> None:
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    direct = run_cli("exec", "-i", str(behind_bastion(lab3, tmp_path / "d", jump=False)),
                     "--connect-timeout", "3", "--", "hostname", env=env)  # fmt: skip
    assert direct.exit_code == 3 and "node2" in direct.stderr + direct.stdout

    inv = behind_bastion(lab3, tmp_path)
    r = run_cli("exec", "-i", str(inv), "--", "hostname", env=env)
    assert r.exit_code == 0, r.stderr
    for h in lab3.hosts:
        assert f"{h.name}: {h.name}" in r.stdout or f"[{h.name}] {h.name}" in r.stdout, r.stdout

    code = tmp_path / "code"
    code.mkdir()
    (code / "job.py").write_text(
        "import os, socket\nprint('rank', os.environ['RANK'], 'on', socket.gethostname())\n"
    )
    p = run_cli("push", "-i", str(inv), "--code", str(code), "--json", env=env)
    assert p.exit_code == 0, p.stderr + p.stdout
    # rsync too: its OpenSSH goes through the bastion with fleetctl's known_hosts
    assert {n: v["code_method"] for n, v in p.json["nodes"].items()} == {
        h.name: "rsync" for h in lab3.hosts
    }
    job = run_cli(
        "run", "-i", str(inv), "--launcher", "plain", "--runs-dir", str(tmp_path / "runs"),
        "--code", str(code), str(code / "job.py"), env=env,
    )  # fmt: skip
    assert job.exit_code == 0, job.stderr + job.stdout
    for rank, h in enumerate(lab3.hosts):
        assert f"rank {rank} on {h.name}" in job.stdout

    # a detached job: its monitor, a process of its own, reaches the nodes again from the run
    # folder's connect.json, so that must keep the jump host (and the login shell)
    runs = tmp_path / "runs"
    det = run_cli_process(
        "run", "-i", str(inv), "--launcher", "plain", "--runs-dir", str(runs), "--detach",
        "--code", str(code), str(code / "job.py"), env=env,
    )  # fmt: skip
    assert det.exit_code == 0, det.stderr
    job_id = det.stdout.strip()
    saved = json.loads((runs / job_id / "connect.json").read_text())
    jump = f"root@{lab3.hosts[0].mgmt_addr}"
    assert {n["name"]: n["proxy_jump"] for n in saved["nodes"]} == {
        "node1": None,
        "node2": jump,
        "node3": jump,
    }
    try:

        def ended() -> dict | None:
            job = json.loads((runs / job_id / "job.json").read_text())
            live = job["status"] in ("running", "starting", "detached")
            return None if live or monitor_alive(job.get("monitor")) else job

        job = wait_for(ended, 60, what=f"job {job_id} ended by its monitor", interval=0.3)
        assert job["status"] == "succeeded", job
        for rank, h in enumerate(lab3.hosts):
            log = (runs / job_id / f"{rank}-{h.name}" / "console.log").read_text()
            assert f"rank {rank} on {h.name}" in log
    finally:
        run_cli("stop", "--runs-dir", str(runs), job_id, "--grace", "0", env=env)
