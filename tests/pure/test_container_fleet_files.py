"""The container fleet's files, without a container: fleetctl/data/compose.yaml (what ``docker
compose config`` would check, parsed here since the CI machine has no compose), the image
build's argv and tag, and the inventory written from what the hosts announce."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fleetctl.errors import LabError
from fleetctl.lab import container_fleet as cf
from fleetctl.lab import container_image as ci
from fleetctl.plan.inventory import load_inventory

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "fleetctl" / "data" / "compose.yaml"


def test_the_compose_file_starts_hosts_of_the_image_on_one_internal_network() -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    nets = doc["networks"]
    assert list(nets) == ["fleet"] and nets["fleet"]["internal"] is True
    assert nets["fleet"]["labels"]["fleetctl.lab"] == "${FLEETCTL_FLEET:-compose}"
    services = doc["services"]
    assert list(services) == ["node1", "node2", "node3"]
    for name, svc in services.items():
        assert svc["hostname"] == name
        assert svc["networks"] == ["fleet"]  # no other network: nothing reaches out
        assert "ports" not in svc  # no published port on any host address
        assert svc["command"] == [ci.INIT_IN_IMAGE]
        assert svc["image"] == "${FLEETCTL_IMAGE:-" + ci.LATEST + "}"
        assert svc["labels"]["fleetctl.lab"] == "${FLEETCTL_FLEET:-compose}"
        assert "./fleet:/fleet" in svc["volumes"]
        assert "./fleet/resolv.conf:/etc/resolv.conf:ro" in svc["volumes"]  # no DNS server
    # the Python mount is read-only and its stand-in is a folder `prepare` makes
    (py,) = [v for v in services["node1"]["volumes"] if "FLEETCTL_PYTHON_HOME" in v]
    assert py.endswith(":ro") and "./fleet/empty" in py


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="no docker compose on this machine (the YAML is checked above)",
)
def test_docker_compose_accepts_the_file(tmp_path: Path) -> None:
    cf.prepare(tmp_path)
    shutil.copyfile(COMPOSE, tmp_path / "compose.yaml")
    r = subprocess.run(
        ["docker", "compose", "config", "--quiet"],
        cwd=tmp_path,
        env={"FLEETCTL_IMAGE": "fleetctl-sshd:x", "PATH": "/usr/bin:/bin:/usr/local/bin"},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr


def test_the_image_is_built_from_debian_packages_with_no_host_keys_or_dns_server() -> None:
    argv = ci.mmdebstrap_argv(Path("/x/out.tar"))
    assert argv[0] == "mmdebstrap" and argv[-2:] == ["bookworm", "/x/out.tar"]
    assert "--variant=minbase" in argv
    included = next(a for a in argv if a.startswith("--include=")).split("=", 1)[1].split(",")
    for pkg in ("openssh-server", "python3", "procps", "rsync", "iproute2"):
        assert pkg in included
    hooks = " ".join(a for a in argv if a.startswith("--customize-hook="))
    assert "/etc/ssh/ssh_host_*" in hooks and "/etc/resolv.conf" in hooks
    assert f"upload {ci.INIT} {ci.INIT_IN_IMAGE}" in hooks


def test_the_image_tag_follows_the_init_script(tmp_path: Path, monkeypatch) -> None:
    before = ci.image_tag()
    assert before.startswith("fleetctl-sshd:") and ci.tarball(tmp_path).parent == tmp_path
    changed = tmp_path / "init.sh"
    changed.write_text(ci.INIT.read_text() + "# changed\n")
    monkeypatch.setattr(ci, "INIT", changed)
    assert ci.image_tag() != before


def test_an_unknown_runtime_is_refused() -> None:
    with pytest.raises(LabError, match="container runtime 'lxc'"):
        ci.ensure_image("lxc")


def test_prepare_writes_the_key_and_clears_stale_host_answers(tmp_path: Path) -> None:
    d = tmp_path / "fleet1"
    cf.prepare(d)
    (d / "fleet" / "nodes" / "node9").write_text("10.0.0.9 ssh-ed25519 AAAA\n")
    cf.prepare(d)
    assert list((d / "fleet" / "nodes").iterdir()) == []
    pub = (d / "id_ed25519.pub").read_text()
    assert (d / "fleet" / "authorized_keys").read_text() == pub
    assert oct(d.stat().st_mode & 0o777) == "0o700"
    assert (d / "fleet" / "empty").is_dir()
    resolv = (d / "fleet" / "resolv.conf").read_text()
    assert [x for x in resolv.splitlines() if not x.startswith("#")] == ["nameserver 127.0.0.1"]


def test_the_inventory_pins_the_announced_host_keys(tmp_path: Path) -> None:
    cf.prepare(tmp_path)
    nodes = tmp_path / "fleet" / "nodes"
    for i in (10, 2, 1):  # node10 sorts after node2
        (nodes / f"node{i}").write_text(f"10.89.0.{i + 1} ssh-ed25519 KEY{i}\n")
    (nodes / ".node3.tmp").write_text("10.89.0.4 ssh-ed25519 half")  # being written: ignored
    found = cf.read_nodes(tmp_path)
    assert sorted(found) == ["node1", "node10", "node2"]
    hosts = sorted(found.values(), key=lambda h: cf._node_order(h.name))
    inv = cf.write_inventory(tmp_path, hosts, "/usr/bin/python3")
    assert (tmp_path / "known_hosts").read_text().splitlines() == [
        "node1,10.89.0.2 ssh-ed25519 KEY1",
        "node2,10.89.0.3 ssh-ed25519 KEY2",
        "node10,10.89.0.11 ssh-ed25519 KEY10",
    ]
    parsed = load_inventory(str(inv))
    got = [(n.name, n.address, n.user, n.python) for n in parsed.nodes]
    assert got == [
        ("node1", "10.89.0.2", "root", "/usr/bin/python3"),
        ("node2", "10.89.0.3", "root", "/usr/bin/python3"),
        ("node10", "10.89.0.11", "root", "/usr/bin/python3"),
    ]
    host_vars = yaml.safe_load(inv.read_text())["all"]["children"]["nodes"]["hosts"]["node1"]
    assert "StrictHostKeyChecking=yes" in host_vars["ansible_ssh_common_args"]
    assert host_vars["fleetctl_known_hosts"] == str(tmp_path / "known_hosts")


def test_waiting_for_hosts_that_never_come_names_how_many_did(tmp_path: Path) -> None:
    cf.prepare(tmp_path)
    (tmp_path / "fleet" / "nodes" / "node1").write_text("10.89.0.2 ssh-ed25519 K\n")
    with pytest.raises(LabError, match=r"1 of 3 hosts announced themselves within 0s"):
        cf.wait_hosts(tmp_path, 3, timeout=0.2)


@pytest.mark.parametrize(
    ("runtime", "rm"),
    [("podman", ["podman", "rm", "--force", "--time", "0", "c1"]),
     ("docker", ["docker", "rm", "--force", "c1"])],
)  # fmt: skip
def test_down_finds_containers_and_networks_by_label_only(monkeypatch, runtime, rm) -> None:
    """Never by a name pattern: every listing filters on ``fleetctl.lab=NAME``, and what is
    still listed afterwards is named in the error."""
    calls: list[list[str]] = []
    listed = {"ps": ["c1"], "network": ["n1"]}

    def fake_run(argv, **kw):
        calls.append(list(argv))
        out = ""
        if argv[1] == "ps" or argv[1:3] == ["network", "ls"]:
            assert argv[-2:] == ["--filter", "label=fleetctl.lab=demo"], argv
            out = "\n".join(listed["ps" if argv[1] == "ps" else "network"])
        return subprocess.CompletedProcess(argv, 0, out, "")

    monkeypatch.setattr(cf.net, "run", fake_run)
    with pytest.raises(LabError, match="container fleet demo: could not remove c1 n1"):
        cf.remove_by_label("demo", runtime)
    assert rm in calls and [runtime, "network", "rm", "n1"] in calls
    listed.update(ps=[], network=[])
    calls.clear()
    cf.remove_by_label("demo", runtime)
    assert not any(c[1] == "rm" or c[1:3] == ["network", "rm"] for c in calls)


class _FakePodman:
    """podman as ``reap_orphans`` sees it: containers with labels, answered and removed by
    label; every argv recorded."""

    def __init__(self, fleets: dict[str, dict[str, str]]) -> None:
        self.containers = {
            f"id-{name}": {cf.LABEL: name, **labels} for name, labels in fleets.items()
        }
        self.argvs: list[list[str]] = []

    def run(self, argv: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        self.argvs.append(list(argv))
        out = ""
        if argv[1:3] == ["network", "ls"]:
            out = ""  # the fleets' networks are gone already; their containers are left
        elif argv[1] == "ps" and "--format" in argv:
            out = "".join(f"{json.dumps(lb)}\n" for lb in self.containers.values())
        elif argv[1] == "ps":
            want = argv[argv.index("--filter") + 1].removeprefix(f"label={cf.LABEL}=")
            out = " ".join(c for c, lb in self.containers.items() if lb[cf.LABEL] == want)
        elif argv[1] == "rm":
            for c in argv[2:]:
                self.containers.pop(c, None)
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_reap_orphans_removes_only_the_owners_fleets_whose_creator_is_gone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import os

    from fleetctl.lab import procs

    me = os.getpid()
    gone = subprocess.Popen(["true"])
    gone.wait()
    started = procs.start_time(me)
    fake = _FakePodman(
        {
            "alive": {cf.OWNER_LABEL: "pytest", cf.CREATOR_LABEL: f"{me}-{started}"},
            "dead": {cf.OWNER_LABEL: "pytest", cf.CREATOR_LABEL: f"{gone.pid}-{started}"},
            "reused": {cf.OWNER_LABEL: "pytest", cf.CREATOR_LABEL: f"{me}-{started + 1}"},
            "nocreator": {cf.OWNER_LABEL: "pytest"},
            "theirs": {cf.OWNER_LABEL: "someone-else", cf.CREATOR_LABEL: f"{gone.pid}-1"},
        }
    )
    monkeypatch.setattr(cf.net, "run", fake.run)
    monkeypatch.setattr(cf.shutil, "which", lambda _: "/usr/bin/podman")
    monkeypatch.setattr(cf, "BASE", tmp_path)
    for name in ("alive", "dead", "reused", "nocreator", "theirs"):
        (tmp_path / name).mkdir()

    reaped = cf.reap_orphans("pytest")

    assert sorted(reaped) == ["dead", "nocreator", "reused"]
    assert sorted(lb[cf.LABEL] for lb in fake.containers.values()) == ["alive", "theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alive", "theirs"]
    removals = [a for a in fake.argvs if a[1] == "rm"]
    assert sorted(a[-1] for a in removals) == ["id-dead", "id-nocreator", "id-reused"]
    assert all(a[:4] == ["podman", "rm", "--force", "--time"] for a in removals)
    # found and removed by label, never by a name pattern
    finds = [a for a in fake.argvs if a[1] == "ps" and "--quiet" in a]
    assert all(a[a.index("--filter") + 1].startswith(f"label={cf.LABEL}=") for a in finds)
