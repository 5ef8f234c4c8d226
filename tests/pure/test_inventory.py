"""Inventory reading without ansible: ranges, INI typing, precedence, fields, limits, CLI.

The agreement with real ansible-core is pinned in test_inventory_ansible.py; these tables pin
the details a user relies on (and explain them by example).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from fleetctl.errors import InventoryError
from fleetctl.node import Node
from fleetctl.plan.inventory import Inventory, load_inventory, local_inventory, parse_limit
from fleetctl.testing.cli_runner import run_cli

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES = HERE / "inventories"
EXAMPLE_YML = ROOT / "inventories" / "example.yml"
EXAMPLE_INI = ROOT / "inventories" / "example.ini"


def write(tmp_path: Path, text: str, name: str = "hosts.ini") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def names(inv: Inventory) -> list[str]:
    return [n.name for n in inv.nodes]


# ------------------------------------------------------------------------------ host ranges


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("gpu[01:04]", "gpu01 gpu02 gpu03 gpu04"),
        ("gpu[1:3]", "gpu1 gpu2 gpu3"),
        ("gpu[8:11]", "gpu8 gpu9 gpu10 gpu11"),  # no padding unless begin is zero-padded
        ("gpu[001:003]", "gpu001 gpu002 gpu003"),
        ("node-[a:c]", "node-a node-b node-c"),
        ("node-[y:B]", "node-y node-z node-A node-B"),  # a..z then A..Z, like Ansible
        ("w[1:10:3]", "w1 w4 w7 w10"),
        ("w[a:g:3]", "wa wd wg"),
        ("r[1:2]n[08:09]", "r1n08 r1n09 r2n08 r2n09"),
        ("[1:2]x.example.com", "1x.example.com 2x.example.com"),
        ("gpu[:2]", "gpu0 gpu1 gpu2"),  # empty begin is 0
        ("gpu[5:5]", "gpu5"),
    ],
)
def test_host_ranges(tmp_path: Path, pattern: str, expected: str) -> None:
    inv = load_inventory(write(tmp_path, f"[g]\n{pattern}\n"))
    assert names(inv) == expected.split()


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("gpu[01:4]", "equal length"),
        ("gpu[3:1]", "begins after it ends"),
        ("gpu[c:a]", "begins after it ends"),
        ("gpu[1:]", "no end value"),
        ("gpu[1:4:0]", "step must be a positive integer"),
        ("gpu[1:2:3:4]", "begin:end"),
        ("gpu[aa:bb]", "numbers or single letters"),
        ("gpu[1:3", "unbalanced"),
    ],
)
def test_bad_ranges(tmp_path: Path, pattern: str, why: str) -> None:
    path = write(tmp_path, f"[g]\nok01\n{pattern}\n")
    with pytest.raises(InventoryError) as exc:
        load_inventory(path)
    assert str(exc.value).startswith(f"{path}:3: bad host range {pattern!r}")
    assert why in str(exc.value)


@pytest.mark.parametrize(
    ("line", "name", "port"),
    [
        ("gpu01:2222", "gpu01", 2222),
        ("10.0.0.5:2200", "10.0.0.5", 2200),
        ("[fd00::5]:2201", "fd00::5", 2201),
        ("fd00::6", "fd00::6", 22),  # a bare IPv6 address has no port
        ("gpu01:2222 ansible_port=2300", "gpu01", 2300),  # an explicit var wins
    ],
)
def test_host_port(tmp_path: Path, line: str, name: str, port: int) -> None:
    (node,) = load_inventory(write(tmp_path, f"{line}\n")).nodes
    assert (node.name, node.address, node.port) == (name, name, port)


# ------------------------------------------------------------------------------ INI values


@pytest.mark.parametrize(
    ("text", "in_vars", "inline"),
    [
        # [g:vars] keeps quotes for literal_eval; inline host vars go through shlex first.
        ("8", 8, 8),
        ('"8"', "8", 8),
        ("'8'", "8", 8),
        ("True", True, True),
        ("true", "true", "true"),
        ("yes", "yes", "yes"),
        ("1.5", 1.5, 1.5),
        ("0x10", 16, 16),
        ("None", None, None),
        ("/srv/fleet", "/srv/fleet", "/srv/fleet"),
        ("\"{'A': '1', 'B': 2}\"", "{'A': '1', 'B': 2}", {"A": "1", "B": 2}),
        ("{'A':'1'}", {"A": "1"}, "{A:1}"),  # inline: shlex eats the quotes; write "{'A':'1'}"
        ("[1,2]", [1, 2], [1, 2]),
        ("True # comment", True, True),  # a Python comment; shlex drops it inline
        ("ib0 # comment", "ib0 # comment", "ib0"),  # not a literal: kept whole in :vars
    ],
)
def test_ini_value_typing(tmp_path: Path, text: str, in_vars: Any, inline: Any) -> None:
    path = write(tmp_path, f"[g]\nh1\nh2 v={text}\n[g:vars]\nv={text}\n")
    h1, h2 = load_inventory(path).nodes
    assert h1.vars["v"] == in_vars
    assert h2.vars["v"] == inline


# ------------------------------------------------------------------------------ precedence

# host -> (nic, gpus, workdir, user): why, in Ansible's terms
PRECEDENCE = {
    # alpha < other < zeta (same depth 1, alphabetical); parent (depth 1) < zeta (depth 2);
    # host vars from [other] (last definition wins: gpus 6, user 'last').
    "h1": ("from-zeta", 6, "/parent", "last"),
    # prio has ansible_group_priority=10: it beats zeta although both are depth 2.
    "h2": ("from-prio", 2, "/parent", None),
    # host var wins over its group alpha.
    "h3": ("host-nic", 3, "/all", None),
    # only parent and all.
    "h4": ("from-parent", 1, "/parent", None),
}


@pytest.mark.parametrize("name", ["precedence.ini", "precedence.yml"])
def test_var_precedence(name: str) -> None:
    inv = load_inventory(CASES / name)
    got = {n.name: (n.nic, n.gpus, n.workdir, n.user) for n in inv.nodes}
    assert got == PRECEDENCE


def test_yaml_and_ini_twins_agree() -> None:
    for yml, ini in [
        (CASES / "precedence.yml", CASES / "precedence.ini"),
        (EXAMPLE_YML, EXAMPLE_INI),
    ]:
        a, b = load_inventory(yml), load_inventory(ini)
        by_name = {n.name: n for n in b.nodes}
        for node in a.nodes:
            other = by_name[node.name]
            assert dataclasses.replace(node, source=None) == dataclasses.replace(other, source=None)
            assert (node.vars, node.env) == (other.vars, other.env)
    assert names(load_inventory(EXAMPLE_YML)) == names(load_inventory(EXAMPLE_INI))


# ------------------------------------------------------------------------------ node fields


def test_example_inventory_fields() -> None:
    inv = load_inventory(EXAMPLE_YML)
    assert names(inv) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    assert [n.address for n in inv.nodes] == [f"10.0.0.1{i}" for i in range(1, 5)]
    assert [n.nic for n in inv.nodes] == ["ib0", "ib0", "ibp65s0", "ib0"]
    first = inv.nodes[0]
    assert first == Node(
        name="gpu01",
        address="10.0.0.11",
        port=22,
        user="train",
        key_file="~/.ssh/fleet_ed25519",
        nic="ib0",
        gpus=8,
        workdir="~/.fleetctl",
        python="python3",
        known_hosts="~/.ssh/known_hosts.fleet",
        groups=("gpu",),
        source=f"{EXAMPLE_YML}:35",
    )
    assert first.env == {"NCCL_IB_HCA": "mlx5", "OMP_NUM_THREADS": "8"}
    assert inv.groups == {"all": tuple(names(inv)), "ungrouped": (), "gpu": tuple(names(inv))}


def test_all_mapped_vars(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
all:
  hosts:
    box1:
      ansible_host: 192.0.2.1
      ansible_port: "2201"
      ansible_user: ops
      ansible_ssh_private_key_file: /keys/id
      fleetctl_nic: eth1
      fleetctl_addr: 198.51.100.1
      fleetctl_gpus: "4"
      fleetctl_workdir: /scratch/f
      fleetctl_python: /opt/py/bin/python
      fleetctl_env: {A: 1, B: true, C: null, D: x y}
      fleetctl_env_archive: /envs/train.tar.gz
      fleetctl_known_hosts: /etc/fleet/known_hosts
      fleetctl_ssh_config: /etc/fleet/ssh_config
    box2:
      ansible_ssh_host: 192.0.2.2
      ansible_ssh_user: legacy
      ansible_ssh_port: 2202
    here:
      ansible_connection: local
""",
        "hosts.yml",
    )
    box1, box2, here = load_inventory(path).nodes
    assert (box1.address, box1.port, box1.user, box1.key_file) == (
        "192.0.2.1",
        2201,
        "ops",
        "/keys/id",
    )
    assert (box1.nic, box1.train_addr, box1.gpus) == ("eth1", "198.51.100.1", 4)
    assert (box1.workdir, box1.python) == ("/scratch/f", "/opt/py/bin/python")
    assert box1.env == {"A": "1", "B": "true", "C": "", "D": "x y"}
    assert box1.env_archive == "/envs/train.tar.gz"
    assert (box1.known_hosts, box1.ssh_config) == (
        "/etc/fleet/known_hosts",
        "/etc/fleet/ssh_config",
    )
    assert not box1.local and box1.source == f"{path}:3"
    assert (box2.address, box2.user, box2.port) == ("192.0.2.2", "legacy", 2202)
    assert box2.gpus is None and box2.nic is None and box2.workdir == "~/.fleetctl"
    assert here.local and here.address == "here"


def test_local_hosts_may_share_an_address(tmp_path: Path) -> None:
    """Only SSH endpoints must be unique: two local nodes (a one-box test fleet) are fine."""
    path = write(tmp_path, "a ansible_connection=local\nb ansible_connection=local\n")
    assert names(load_inventory(path)) == ["a", "b"]


def test_same_address_other_port_is_fine(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "a ansible_host=127.0.0.1 ansible_port=2201\nb ansible_host=127.0.0.1 ansible_port=2202\n",
    )
    assert [n.port for n in load_inventory(path).nodes] == [2201, 2202]


def test_duplicate_address_is_case_and_form_insensitive(tmp_path: Path) -> None:
    path = write(tmp_path, "a ansible_host=fd00::1\nb ansible_host=fd00:0::0001\n")
    with pytest.raises(InventoryError, match=r":2: host b: address fd00:0::0001 port 22 .* a's"):
        load_inventory(path)


def test_limit_can_leave_out_a_broken_host(tmp_path: Path) -> None:
    """Only selected hosts are validated, so --limit works around one bad entry."""
    path = write(tmp_path, "good fleetctl_gpus=8\nbad fleetctl_gpus=lots\n")
    assert names(load_inventory(path, limit="good")) == ["good"]
    with pytest.raises(InventoryError, match="host bad: fleetctl_gpus"):
        load_inventory(path)


def test_vault_value_refused_only_when_used(tmp_path: Path) -> None:
    vault = "!vault |\n        $ANSIBLE_VAULT;1.1;AES256\n        6162\n"
    text = f"all:\n  hosts:\n    h1:\n      ansible_become_password: {vault}"
    assert (
        load_inventory(write(tmp_path, text, "ok.yml")).nodes[0].vars["ansible_become_password"]
        == "<vault>"
    )
    text = f"all:\n  hosts:\n    h1:\n      ansible_host: {vault}"
    with pytest.raises(InventoryError, match="h1: ansible_host is vault-encrypted"):
        load_inventory(write(tmp_path, text, "bad.yml"))


def test_yaml_merge_keys_and_unsafe(tmp_path: Path) -> None:
    text = """\
all:
  vars:
    base: &base {fleetctl_gpus: 8, fleetctl_nic: ib0}
  hosts:
    h1:
      <<: *base
      fleetctl_nic: ib1
    h2:
      fleetctl_workdir: !unsafe '/w/{{ raw }}x'
"""
    h1, h2 = load_inventory(write(tmp_path, text, "m.yml")).nodes
    assert (h1.gpus, h1.nic) == (8, "ib1")
    assert h2.vars["fleetctl_workdir"] == "/w/{{ raw }}x"


def test_group_vars_and_host_vars_folders() -> None:
    """gvars/: group_vars/all beats the file's group vars, group_vars/<g> (a folder read in
    sorted order) beats group_vars/all, host_vars/<h> beats everything (checked against
    ansible-inventory in test_inventory_ansible.py)."""
    inv = load_inventory(CASES / "gvars" / "hosts.yml")
    got = {n.name: (n.address, n.port, n.user, n.nic, n.gpus, n.workdir) for n in inv.nodes}
    assert got == {
        "g1": ("g1", 22, "gv-all-user", "gv-gpu-dir-later", 4, "/from-group-vars-all"),
        "g2": ("g2", 22, "gv-all-user", "gv-gpu-dir-later", 6, "/from-group-vars-all"),
        "g3": ("10.9.0.3", 22, "gv-all-user", "file-host", 8, "/from-group-vars-all"),
        "c1": ("c1", 2201, "gv-all-user", "gv-all", 0, "/from-group-vars-all"),
    }


def test_group_vars_errors_name_the_vars_file(tmp_path: Path) -> None:
    hosts = write(tmp_path, "[gpu]\ng1\n", "hosts")
    (tmp_path / "group_vars").mkdir()
    gv = tmp_path / "group_vars" / "gpu.yml"
    gv.write_text("fleetctl_nic: ib0\nfleetctl_gpus: many\n")
    with pytest.raises(InventoryError) as exc:
        load_inventory(hosts)
    assert str(exc.value).startswith(f"{gv}:2: host g1: fleetctl_gpus must be")
    gv.write_text("fleetctl_nic: [ib0\n")
    with pytest.raises(InventoryError, match=rf"^{gv}:2: malformed YAML"):
        load_inventory(hosts)
    gv.write_text("fleetctl_gpus: 8\n")
    before = load_inventory(hosts).digest
    gv.write_text("fleetctl_gpus: 4\n")
    assert load_inventory(hosts).digest != before  # vars files are part of the digest


# ------------------------------------------------------------------------------ structure


def test_ini_ungrouped_and_pending_children(tmp_path: Path) -> None:
    text = """\
solo
both
[parent:children]
late_b
late_a
[late_a]
both
a1
[late_b]
b1
"""
    inv = load_inventory(write(tmp_path, text))
    # parent's children are added when each is declared: late_a first.
    assert names(inv) == ["solo", "both", "a1", "b1"]
    assert inv.groups["ungrouped"] == ("solo",)  # `both` left ungrouped: it has a group
    assert inv.groups["parent"] == ("both", "a1", "b1")
    assert inv.nodes[1].groups == ("late_a", "parent")


def test_group_order_is_breadth_first(tmp_path: Path) -> None:
    """A child group's hosts come after every host of the level above (Ansible's walk)."""
    text = """\
all:
  children:
    top:
      children:
        deep:
          hosts: {d1: }
      hosts: {t1: }
    other:
      hosts: {o1: }
"""
    assert names(load_inventory(write(tmp_path, text, "g.yml"))) == ["t1", "o1", "d1"]


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [
        ("all:\n  hosts:\n    y1:\n", "", ["y1"]),  # no extension, a YAML mapping: YAML
        ("[g]\ni1\n", "", ["i1"]),  # no extension, INI
        ("i1\ni2\n", "", ["i1", "i2"]),  # plain host list: INI (YAML would read a string)
        ("[g]\nc1\n", ".cfg", ["c1"]),
    ],
)
def test_format_detection(tmp_path: Path, text: str, suffix: str, expected: list[str]) -> None:
    assert names(load_inventory(write(tmp_path, text, f"hosts{suffix}"))) == expected


def test_digest_tracks_content_and_selection(tmp_path: Path) -> None:
    path = write(tmp_path, "[g]\na\nb\n")
    d1 = load_inventory(path).digest
    assert load_inventory(path).digest == d1
    assert load_inventory(path, limit="a").digest != d1
    assert load_inventory(path, group="g").digest != d1
    path.write_text("[g]\na\nb fleetctl_gpus=2\n")
    assert load_inventory(path).digest != d1


def test_local_inventory() -> None:
    inv = local_inventory()
    (node,) = inv.nodes
    assert node.local and node.address == "127.0.0.1"
    assert inv.path is None and inv.groups["all"] == (node.name,)
    assert len(inv.digest) == 64 and inv.digest == local_inventory().digest


# ------------------------------------------------------------------------------ limits


@pytest.mark.parametrize(
    ("limit", "parts"),
    [
        ("gpu01", ["gpu01"]),
        ("a:b", ["a", "b"]),
        ("a,b , c", ["a", "b", "c"]),
        ("gpu*:&rack_a:!gpu02", ["gpu*", "&rack_a", "!gpu02"]),
        ("gpu[01:04]", ["gpu[01:04]"]),  # a range-looking word stays one pattern
        ("gpu01:2222", ["gpu01:2222"]),  # host:port stays one pattern
        ("fd00::1", ["fd00::1"]),
        ("~gpu0[13]:cpu", ["~gpu0[13]", "cpu"]),
    ],
)
def test_parse_limit(limit: str, parts: list[str]) -> None:
    assert parse_limit(limit) == parts


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("gpu02", "gpu02"),
        ("gpu0[2-3]", None),  # a subscript of group "gpu0", which does not exist: error
        ("rack_b:head01", "head01 gpu05 gpu06"),  # never reorders: rank order of "all"
        ("gpu?[57]", None),  # ends in [digits]: a subscript (Ansible's rule), not a glob
        ("gpu0[57]*", "gpu05 gpu07"),
        ("~^gpu0[0-2]$", "gpu00 gpu01 gpu02"),
        ("gpu:!rack_a:!rack_b", "gpu00"),  # gpu07 is in rack_a through rack_a_top
        ("!gpu", "head01 cpu01"),  # only exclusions: applied to all
        ("&cpu", "cpu01 gpu03"),
        ("rack_a[0]", "gpu01"),
        ("rack_a[1:]", "gpu03 gpu02 gpu04 gpu07"),  # rack_a minus gpu01, in rank order
    ],
)
def test_limit_patterns(limit: str, expected: str | None) -> None:
    if expected is None:
        with pytest.raises(InventoryError, match="matches no hosts"):
            load_inventory(CASES / "nested.yml", limit=limit)
        return
    inv = load_inventory(CASES / "nested.yml", limit=limit)
    assert names(inv) == expected.split()
    # groups keep Ansible's per-group order (its `groups` variable), restricted to the selection
    assert sorted(inv.groups["all"]) == sorted(names(inv))
    assert set(inv.groups["gpu"]) == {n.name for n in inv.nodes if "gpu" in n.groups}


def test_limit_file(tmp_path: Path) -> None:
    lst = tmp_path / "retry"
    lst.write_text("gpu07\n\ncpu01\n")
    assert names(load_inventory(CASES / "nested.yml", limit=f"@{lst}")) == ["cpu01", "gpu07"]


# ------------------------------------------------------------------------------ CLI


def inventory_cli(*args: str) -> tuple[int, str, str]:
    r = run_cli("inventory", *args)
    return r.exit_code, r.stdout, r.stderr


def test_cli_json() -> None:
    code, out, err = inventory_cli("-i", str(EXAMPLE_INI), "--limit", "gpu0*:!gpu02", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert [n["host"] for n in data["nodes"]] == ["gpu01", "gpu03", "gpu04"]
    assert [n["rank"] for n in data["nodes"]] == [0, 1, 2]
    n = data["nodes"][1]
    assert (n["address"], n["port"], n["nic"], n["gpus"], n["user"]) == (
        "10.0.0.13",
        22,
        "ibp65s0",
        8,
        "train",
    )
    assert data["limit"] == "gpu0*:!gpu02" and data["groups"]["gpu"] == ["gpu01", "gpu03", "gpu04"]
    assert data["digest"] == load_inventory(EXAMPLE_INI, limit="gpu0*:!gpu02").digest
    # each node is Node.to_dict: these keys, in this order, as the command has always printed
    assert list(n) == [
        "rank", "host", "address", "port", "user", "key_file", "local", "nic", "train_addr",
        "gpus", "workdir", "python", "env", "env_archive", "known_hosts", "ssh_config", "groups",
        "source",
    ]  # fmt: skip


def test_cli_table() -> None:
    code, out, err = inventory_cli("-i", str(CASES / "nested.yml"), "--group", "rack_a")
    assert code == 0, err
    cells = [line.split() for line in out.splitlines()]
    rows = [c for c in cells if len(c) >= 5 and c[0].isdigit()]
    assert [(r[0], r[1]) for r in rows] == [
        ("0", "gpu01"),
        ("1", "gpu02"),
        ("2", "gpu03"),
        ("3", "gpu04"),
        ("4", "gpu07"),
    ]
    assert rows[-1][2:5] == ["10.1.0.7", "22", "train"]
    assert "5 nodes" in out


def test_cli_without_inventory_is_this_machine() -> None:
    code, out, err = inventory_cli("--json")
    assert code == 0, err
    (node,) = json.loads(out)["nodes"]
    assert node["local"] and node["address"] == "127.0.0.1" and node["rank"] == 0
