"""fleetctl provision against lab hosts: real ansible-playbook, real sshd, testinfra checks.

The lab's hosts share this machine's /etc: bootstrap's sshd drop-in is pointed at a folder in
each host's private /tmp (``fleetctl_sshd_dropin_dir``), and the tests check that the machine's
own /etc/ssh/sshd_config.d was not touched. Likewise the firewall step meets stand-ins of ufw and
firewall-cmd (first on a host's PATH, rules kept in its /tmp), never the machine's firewall.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fleetctl.lab import Lab
from fleetctl.testing.pytest_plugin import import_or_skip, skip_or_fail

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)",
    re.M,
)
PLAYBOOK_TIMEOUT = 300


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines -> {host: {ok, changed, unreachable, failed}}."""
    tail = output[output.rindex("PLAY RECAP") :]
    return {
        m["host"]: {k: int(m[k]) for k in ("ok", "changed", "unreachable", "failed")}
        for m in RECAP.finditer(tail)
    }


@pytest.fixture
def ssh_mux() -> Iterator[Path]:
    """A short folder for SSH control sockets (ansible and testinfra reuse connections);
    every master left in it is told to exit afterwards, so no ssh process outlives the test."""
    d = Path(tempfile.mkdtemp(prefix="fc-cp-", dir="/tmp"))
    try:
        yield d
    finally:
        for sock in d.iterdir():
            subprocess.run(
                ["ssh", "-F", "/dev/null", "-O", "exit", "-o", f"ControlPath={sock}", "lab"],
                capture_output=True, timeout=10, check=False,
            )  # fmt: skip
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def ansible_env(tmp_path: Path, ssh_mux: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_HOME": str(tmp_path / "ansible-home"),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-tmp"),
        "ANSIBLE_REMOTE_TMP": "/tmp/.ansible-tmp",  # each lab host's private /tmp
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(ssh_mux),
        "ANSIBLE_NOCOLOR": "1",
    }


def fleetctl(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fleetctl", *args],
        capture_output=True, text=True, env=env, cwd=cwd, timeout=PLAYBOOK_TIMEOUT,
    )  # fmt: skip


def readiness(
    lab: Lab, hosts: list[str], dropin: str, mux: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """tests/infra/test_node_ready.py as a user runs it: OpenSSH with the lab's ssh_config."""
    return subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
            str(REPO / "tests" / "infra" / "test_node_ready.py"),
            "--hosts=" + ",".join(f"ssh://{h}" for h in hosts),
            f"--ssh-config={lab.ssh_config}",
            f"--ssh-extra-args=-o ControlMaster=auto -o ControlPath={mux}/ti-%C "
            "-o ControlPersist=60",
            f"--sshd-config={dropin}/50-fleetctl.conf",
        ],
        capture_output=True, text=True, timeout=PLAYBOOK_TIMEOUT, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


FAKE_UFW = r"""#!/bin/sh
# Stand-in ufw (test): rules kept in this lab host's private /tmp; ufw's messages.
R=/tmp/fake-ufw.rules; touch "$R"
case "$1" in
  status) echo "Status: active"; cat "$R" ;;
  allow) shift; rule="$*"
    if grep -qxF -- "$rule" "$R"; then echo "Skipping adding existing rule"
    else echo "$rule" >> "$R"; echo "Rule added"; fi ;;
  *) exit 1 ;;
esac
"""
FAKE_FWCMD = r"""#!/bin/sh
# Stand-in firewall-cmd (test): permanent/runtime rules in this lab host's private /tmp.
R=/tmp/fake-firewalld.rules; touch "$R"
where=runtime; zone=public
for a in "$@"; do
  case "$a" in
    --state) echo running; exit 0 ;;
    --permanent) where=permanent ;;
    --zone=*) zone=${a#--zone=} ;;
    --query-port=*) grep -qxF "$where port $zone ${a#--query-port=}" "$R"; exit $? ;;
    --query-source=*) grep -qxF "$where source $zone ${a#--query-source=}" "$R"; exit $? ;;
    --add-port=*) echo "$where port $zone ${a#--add-port=}" >> "$R"; echo success ;;
    --add-source=*) echo "$where source $zone ${a#--add-source=}" >> "$R"; echo success ;;
    *) exit 2 ;;
  esac
done
"""


def etc_ssh_snapshot() -> list[tuple[str, float]]:
    d = Path("/etc/ssh/sshd_config.d")
    return sorted((p.name, p.stat().st_mtime) for p in d.iterdir()) if d.is_dir() else []


def test_bootstrap_makes_three_hosts_ready_and_a_second_run_changes_nothing(
    lab3: Lab, ansible_env: dict[str, str], ssh_mux: Path, tmp_path: Path
) -> None:
    """Also the firewall step, against stand-ins of ufw (node1) and firewall-cmd (node2) first
    on those hosts' PATH; node3 has neither and is left alone."""
    names = [h.name for h in lab3.hosts]
    assert names == ["node1", "node2", "node3"]
    dropin = f"/tmp/fleetctl-sshd-{secrets.token_hex(4)}.d"
    before_etc = etc_ssh_snapshot()
    # A workdir that is not private: the readiness check must catch it, bootstrap must fix it.
    lab3.exec("node1", ["chmod", "0755", lab3.workdir], check=True)
    fakes = []
    for host, name, text in (("node1", "ufw", FAKE_UFW), ("node2", "firewall-cmd", FAKE_FWCMD)):
        fake = lab3.host_dir(host) / "bin" / name
        fake.write_text(text)
        fake.chmod(0o755)
        fakes.append(fake)
    try:
        not_ready = readiness(lab3, ["node1"], dropin, ssh_mux, tmp_path)
        assert not_ready.returncode == 1, not_ready.stdout + not_ready.stderr
        assert "test_workdir_is_a_private_directory_of_the_ssh_user" in not_ready.stdout
        assert "test_sshd_allows_many_parallel_sessions" in not_ready.stdout  # no drop-in yet

        args = [
            "provision", "bootstrap", "-i", str(lab3.inventory_path),
            "--", "-e", f"fleetctl_sshd_dropin_dir={dropin}",
            "-e", '{"fleetctl_firewall_sources": ["10.213.0.0/16"]}',
        ]  # fmt: skip
        first = fleetctl(*args, env=ansible_env)
        assert first.returncode == 0, first.stdout + first.stderr
        r1 = recap(first.stdout)
        assert all(r["failed"] == 0 and r["unreachable"] == 0 for r in r1.values()), r1
        # drop-in folder + file everywhere; node1: its workdir's mode, 2 ufw rules;
        # node2: 2 firewalld rules (each permanent + runtime)
        assert {h: r["changed"] for h, r in r1.items()} == {"node1": 5, "node2": 4, "node3": 2}
        ufw = lab3.exec("node1", ["cat", "/tmp/fake-ufw.rules"], check=True).stdout
        assert ufw.splitlines() == [
            "proto tcp from any to any port 29400:29600 comment fleetctl",
            "from 10.213.0.0/16 comment fleetctl",
        ]
        fwd = lab3.exec("node2", ["cat", "/tmp/fake-firewalld.rules"], check=True).stdout
        assert fwd.splitlines() == [
            "permanent port public 29400-29600/tcp",
            "runtime port public 29400-29600/tcp",
            "permanent source trusted 10.213.0.0/16",
            "runtime source trusted 10.213.0.0/16",
        ]

        second = fleetctl(*args, env=ansible_env)
        assert second.returncode == 0, second.stdout + second.stderr
        r2 = recap(second.stdout)
        assert sorted(r2) == names
        assert all(r["changed"] == 0 and r["failed"] == 0 for r in r2.values()), r2
        assert lab3.exec("node1", ["cat", "/tmp/fake-ufw.rules"], check=True).stdout == ufw
        assert lab3.exec("node2", ["cat", "/tmp/fake-firewalld.rules"], check=True).stdout == fwd

        ready = readiness(lab3, names, dropin, ssh_mux, tmp_path)
        assert ready.returncode == 0, ready.stdout + ready.stderr
        assert re.search(r"\b24 passed\b", ready.stdout), ready.stdout  # 8 checks x 3 hosts

        for h in names:
            conf = lab3.exec(h, ["cat", f"{dropin}/50-fleetctl.conf"], check=True).stdout
            assert "MaxSessions 64" in conf and "MaxStartups 64:30:256" in conf
        assert etc_ssh_snapshot() == before_etc, "the machine's /etc/ssh/sshd_config.d changed"
    finally:
        for fake in fakes:
            fake.unlink()
        for h in names:
            lab3.exec(h, ["rm", "-rf", dropin, "/tmp/fake-ufw.rules", "/tmp/fake-firewalld.rules"])


def test_a_failing_task_exits_3_with_one_line_and_limit_selects_hosts(
    lab3: Lab, ansible_env: dict[str, str]
) -> None:
    r = fleetctl(
        "provision", "bootstrap", "-i", str(lab3.inventory_path), "--limit", "node2",
        "--", "-e", "fleetctl_install_packages=false", "-e", "fleetctl_sshd_manage=false",
        "-e", '{"fleetctl_required_commands": ["python3", "fleetctl-no-such-tool"]}',
        env=ansible_env,
    )  # fmt: skip
    assert r.returncode == 3, r.stdout + r.stderr
    assert list(recap(r.stdout)) == ["node2"]
    assert "missing on node2: fleetctl-no-such-tool" in r.stdout
    errors = [line for line in r.stderr.splitlines() if line.startswith("fleetctl: error:")]
    assert errors == [
        "fleetctl: error: ansible-playbook exited 2: failed on node2 (see its output above)"
    ]


def _inventory_without_ssh_args(lab: Lab, path: Path) -> Path:
    """The lab inventory as a user might write it: fleetctl_known_hosts, no ssh args for Ansible."""
    doc = yaml.safe_load(lab.inventory_path.read_text())
    for hostvars in doc["all"]["children"]["nodes"]["hosts"].values():
        del hostvars["ansible_ssh_common_args"]
    path.write_text(yaml.safe_dump(doc))
    return path


def test_gpu_facts_report_covers_every_host_using_fleetctls_known_hosts(
    lab3: Lab, ansible_env: dict[str, str], tmp_path: Path
) -> None:
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is needed to build the stand-in libnccl.so.2")
    from fleetctl.testing.envbuild import build_fake_nccl

    inv = _inventory_without_ssh_args(lab3, tmp_path / "hosts.yml")
    lab3.set_gpus("node2", 1)
    lab3.set_gpus("node3", None)  # no nvidia-smi at all
    # A real shared library answering ncclGetVersion, in node1's private /tmp.
    nccl_dir = f"fc-nccl-{secrets.token_hex(4)}"
    build_fake_nccl(lab3.host_dir("node1") / "tmp" / nccl_dir / "lib" / "libnccl.so.2", "2.21.5")
    report_dir = tmp_path / "report"
    try:
        r = fleetctl(
            "provision", "gpu-facts", "-i", str(inv),
            "--", "-e", f"fleetctl_report_dir={report_dir}",
            "-e", json.dumps({"fleetctl_nccl_paths": [f"/tmp/{nccl_dir}"]}),
            env=ansible_env,
        )  # fmt: skip
    finally:
        shutil.rmtree(lab3.host_dir("node1") / "tmp" / nccl_dir, ignore_errors=True)
    assert r.returncode == 0, r.stdout + r.stderr
    nodes = json.loads((report_dir / "gpu-facts.json").read_text())["nodes"]
    assert sorted(nodes) == ["node1", "node2", "node3"]
    n1, n2, n3 = nodes["node1"], nodes["node2"], nodes["node3"]
    assert (n1["gpu_count"], n2["gpu_count"], n3["gpu_count"]) == (2, 1, 0)
    assert n1["driver"] == "535.104.05" and n1["cuda"] == "12.2"
    assert [g["index"] for g in n1["gpus"]] == [0, 1]
    assert list(n1["nccl"].values()) == ["2.21.5"]
    assert n2["nccl"] == {}
    assert n3["nvidia_smi"] is None and "nvidia-smi not found on PATH" in n3["errors"]
    md = (report_dir / "gpu-facts.md").read_text()
    assert "| node1 | 2 | NVIDIA H100 80GB HBM3 | 535.104.05 | 12.2 | 2.21.5 |" in md
    assert "| node3 | 0 |" in md

    # The same inventory against a known_hosts file without the lab's keys: refused. (A fresh
    # connection: the shared master of the run above would skip the key exchange.)
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    bad = fleetctl(
        "provision", "gpu-facts", "-i", str(inv), "--known-hosts", str(empty), "--limit", "node1",
        "--", "-e", f"fleetctl_report_dir={tmp_path / 'bad'}",
        env={**ansible_env, "ANSIBLE_SSH_ARGS": "-o ControlMaster=no"},
    )  # fmt: skip
    assert bad.returncode == 3, bad.stdout + bad.stderr  # ansible: 4 (unreachable)
    assert "Host key verification failed" in bad.stdout
    assert recap(bad.stdout)["node1"]["unreachable"] == 1
    assert "fleetctl: error: ansible-playbook exited 4: unreachable: node1" in bad.stderr


def test_conda_env_packs_an_existing_env_and_fetches_it_once(
    lab3: Lab, ansible_env: dict[str, str], tmp_path: Path
) -> None:
    """Miniforge and `conda env create` need the conda channels (not reachable here): this runs
    the rest of conda-env.yml for real — conda-pack on the build host, fetch to the controller —
    on an env built offline, and the Miniforge part in check mode."""
    import_or_skip("rattler", "py-rattler builds the offline test env")
    import_or_skip("conda_pack", "conda-pack packs the test env")
    if shutil.which("gcc") is None:
        skip_or_fail("gcc is needed to build the stand-in libnccl.so.2")
    from fleetctl.testing.envbuild import build_env, build_fake_nccl

    # /var/tmp is shared by the lab hosts and this machine (their /tmp is private).
    work = Path(tempfile.mkdtemp(prefix="fc-conda-env-", dir="/var/tmp"))
    try:
        lib = build_fake_nccl(work / "nccl" / "libnccl.so.2", "2.21.5")
        env = build_env(work, nccl_lib=lib, tag="provision")
        archives = tmp_path / "envs"
        conda_pack = os.path.realpath(shutil.which("conda-pack") or "conda-pack")
        args = [
            "provision", "conda-env", "-i", str(lab3.inventory_path), "--limit", "node1",
            "--", "--tags", "env", "-e", "fleetctl_build_hosts=node1",
            "-e", f"fleetctl_env_prefix={env.prefix}", "-e", f"fleetctl_conda_pack={conda_pack}",
            "-e", f"fleetctl_env_archive_dir={archives}",
        ]  # fmt: skip
        first = fleetctl(*args, env=ansible_env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert recap(first.stdout)["node1"]["changed"] >= 2  # packed + fetched
        archive = archives / "prefix.tar.gz"
        from fleetctl.testing.envbuild import archive_members

        members = set(archive_members(archive))
        assert {"bin/python", "lib/libnccl.so.2", "bin/conda-unpack"} <= members
        second = fleetctl(*args, env=ansible_env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert recap(second.stdout)["node1"]["changed"] == 0

        installer = tmp_path / "Miniforge3-Linux-x86_64.sh"
        installer.write_text("#!/bin/sh\nexit 1\n")  # never run: check mode
        check = fleetctl(
            "provision", "conda-env", "-i", str(lab3.inventory_path), "--limit", "node1",
            "--", "--check", "--tags", "miniforge", "-e", "fleetctl_build_hosts=node1",
            "-e", f"fleetctl_miniforge_installer={installer}",
            env=ansible_env,
        )  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr
        assert "Copy the Miniforge installer from the controller" in check.stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)
        lab3.exec("node1", ["rm", "-rf", f"{lab3.workdir}/build"])


def test_bootstrap_as_a_login_user_becomes_root_only_where_it_must(
    make_lab, ansible_env: dict[str, str], tmp_path: Path
) -> None:
    """Real fleets log in as a plain user with passwordless sudo. Bootstrap's privileged step
    (the sshd drop-in) runs under sudo and is root's; the workdir stays the user's own, private.
    Without sudo rights it stops, exit 3, naming the host."""
    if shutil.which("sudo") is None:
        skip_or_fail("sudo is not installed (CI installs it)")
    user = "fleetprov"
    lab = make_lab(2, user=user)
    sudoers = Path(f"/etc/sudoers.d/fleetctl-test-{user}")
    dropins = [f"/tmp/fleetctl-sshd-{secrets.token_hex(4)}.d" for _ in range(2)]

    def bootstrap(dropin: str) -> subprocess.CompletedProcess[str]:
        return fleetctl(
            "provision", "bootstrap", "-i", str(lab.inventory_path),
            "--", "-e", f"fleetctl_sshd_dropin_dir={dropin}", "-e", "fleetctl_firewall=none",
            env=ansible_env,
        )  # fmt: skip

    try:
        sudoers.write_text(f"{user} ALL=(root) NOPASSWD: ALL\n")
        sudoers.chmod(0o440)
        first = bootstrap(dropins[0])
        assert first.returncode == 0, first.stdout + first.stderr
        r1 = recap(first.stdout)
        assert sorted(r1) == ["node1", "node2"] and all(r["failed"] == 0 for r in r1.values())
        for h in ("node1", "node2"):
            conf = f"{dropins[0]}/50-fleetctl.conf"
            said = lab.exec(h, ["stat", "-c", "%U %a", conf, lab.workdir], check=True).stdout
            assert said.split("\n")[:2] == ["root 644", f"{user} 700"], said
        sudoers.unlink()
        second = bootstrap(dropins[1])
        assert second.returncode == 3, second.stdout + second.stderr
        errors = [x for x in second.stderr.splitlines() if x.startswith("fleetctl: error:")]
        assert len(errors) == 1 and "node1" in errors[0] and "node2" in errors[0], errors
        assert "sudo" in second.stdout, second.stdout
    finally:
        sudoers.unlink(missing_ok=True)
        for h in ("node1", "node2"):
            lab.exec(h, ["rm", "-rf", *dropins])
