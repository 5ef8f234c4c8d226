"""Golden tables: fleetctl's inventory reading agrees with real ansible-core.

Each case is (inventory file, group, --limit) -> the node order. The pure test checks fleetctl
against the table; the ansible tests check the *real* tools against the same table and against
fleetctl: ``ansible -i F GROUP --limit L --list-hosts`` for the order (the order Ansible runs
hosts in, which is the order ``ansible-inventory --list`` iterates), and
``ansible-inventory -i F --list`` for every host's merged variables, which must equal
``Node.vars`` key for key and value for value (types included).

The ansible tests need ansible-core's binaries (installed in CI); they skip only when the
binaries are missing AND FLEETCTL_REQUIRE_LAB is unset.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fleetctl.node import DEFAULT_PYTHON, DEFAULT_WORKDIR
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.pytest_plugin import skip_or_fail

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CASES_DIR = HERE / "inventories"


def _file(name: str) -> Path:
    return ROOT / name if name.startswith("inventories/") else CASES_DIR / name


# (file, group, limit, expected order). Orders were read from ansible-core 2.19.14 and are
# re-checked against the installed ansible by the tests below.
GOLDEN: list[tuple[str, str, str | None, str]] = [
    ("nested.yml", "all", None, "head01 gpu00 cpu01 gpu03 gpu05 gpu06 gpu01 gpu02 gpu04 gpu07"),
    ("nested.yml", "gpu", None, "gpu00 gpu05 gpu06 gpu01 gpu02 gpu03 gpu04 gpu07"),
    ("nested.yml", "all", "gpu0*", "gpu00 gpu03 gpu05 gpu06 gpu01 gpu02 gpu04 gpu07"),
    ("nested.yml", "all", "rack_a:&cpu", "gpu03"),
    ("nested.yml", "all", "gpu:!rack_a_top", "gpu00 gpu03 gpu05 gpu06 gpu01 gpu04"),
    ("nested.yml", "all", "~gpu0[13]", "gpu03 gpu01"),
    ("nested.yml", "all", "gpu[1:3]", "gpu05 gpu06 gpu01"),
    ("nested.yml", "all", "cpu,head01", "head01 cpu01 gpu03"),
    ("nested.yml", "cpu:rack_b", None, "cpu01 gpu03 gpu05 gpu06"),
    (
        "ranges.ini",
        "all",
        None,
        "login01 gpu01 gpu02 gpu03 gpu04 gpu10 gpu13 gpu16 node-a node-b node-c "
        "r1n08 r1n09 r2n08 r2n09 stx stz stB",
    ),
    ("ranges.ini", "all", "train[-1]", "stB"),
    ("ranges.ini", "all", "node-*:&gpu:!node-b", "node-a node-c"),
    ("ranges.ini", "storage", None, "stx stz stB"),
    ("ranges.ini", "all", "un*", "login01"),
    ("precedence.ini", "all", None, "h1 h3 h4 h2"),
    ("precedence.ini", "parent", "h2,h1", "h1 h2"),
    ("precedence.yml", "all", None, "h1 h2 h3 h4"),
    ("precedence.yml", "parent", None, "h4 h1 h2"),
    (
        "letters.yml",
        "all",
        None,
        "node-a node-b node-c node-d big-x big-y big-z big-A big-B w1 w5 w9 node-e "
        "10.3.0.1 fd00::5 fd00::6",
    ),
    ("letters.yml", "all", "*:!w*", "node-e 10.3.0.1 fd00::5 fd00::6"),
    ("letters.yml", "all", "fd00::6", "fd00::6"),
    ("gvars/hosts.yml", "all", None, "g1 g2 g3 c1"),  # + group_vars/ and host_vars/
    ("inventories/example.yml", "all", None, "gpu01 gpu02 gpu03 gpu04"),
    ("inventories/example.ini", "all", None, "gpu01 gpu02 gpu03 gpu04"),
    ("inventories/example.ini", "gpu", "gpu0*:!gpu03", "gpu01 gpu02 gpu04"),
]
FILES = sorted({case[0] for case in GOLDEN})
# Where ansible-core's own order is unstable (see fleetctl.plan.inventory): fleetctl's fixed order.
UNSTABLE = ("unstable.ini", "ah bh ch a1h b1h c1h")


def _case_id(case: tuple[str, str, str | None, str]) -> str:
    name, group, limit, _ = case
    return f"{name.removeprefix('inventories/')}|{group}|{limit or '-'}"


@pytest.mark.parametrize("case", GOLDEN, ids=_case_id)
def test_order_matches_golden(case: tuple[str, str, str | None, str]) -> None:
    name, group, limit, expected = case
    inv = load_inventory(_file(name), limit=limit, group=group)
    assert [n.name for n in inv.nodes] == expected.split()


def test_unstable_ansible_order_is_fixed_here() -> None:
    name, expected = UNSTABLE
    assert [n.name for n in load_inventory(_file(name)).nodes] == expected.split()


# ---------------------------------------------------------------------------- real ansible


def _ansible_bins() -> tuple[str, str] | None:
    a, ai = shutil.which("ansible"), shutil.which("ansible-inventory")
    return (a, ai) if a and ai else None


@pytest.fixture(scope="module")
def ansible(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every ansible answer the tests need, computed once, in parallel (each call ~1 s)."""
    bins = _ansible_bins()
    if bins is None:
        skip_or_fail("ansible-core not installed (pip install ansible-core==2.19.14)")
    home = tmp_path_factory.mktemp("ansible-home")
    cfg = home / "ansible.cfg"
    cfg.write_text("[defaults]\n")  # neutral: not the repository's ansible.cfg
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_HOME": str(home),
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "LC_ALL": "C.UTF-8",
    }

    def run(argv: list[str]) -> str:
        out = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=home, timeout=120, check=False
        )
        assert out.returncode == 0, f"{argv}: {out.stderr}"
        return out.stdout

    def hosts(case: tuple[str, str, str | None, str]) -> list[str]:
        name, group, limit, _ = case
        argv = [bins[0], "-i", str(_file(name)), group, "--list-hosts"]
        lines = run([*argv, *(["--limit", limit] if limit else [])]).splitlines()
        assert lines and lines[0].strip().startswith("hosts ("), lines
        return [line.strip() for line in lines[1:]]

    def hostvars(name: str) -> dict[str, Any]:
        data = json.loads(run([bins[1], "-i", str(_file(name)), "--list"]))
        return data["_meta"]["hostvars"]

    unstable = (UNSTABLE[0], "all", None, UNSTABLE[1])
    with ThreadPoolExecutor(max_workers=4) as pool:
        orders = dict(zip(map(_case_id, GOLDEN), pool.map(hosts, GOLDEN), strict=True))
        hvars = dict(zip(FILES, pool.map(hostvars, FILES), strict=True))
        orders[_case_id(unstable)] = hosts(unstable)
    return {"orders": orders, "hostvars": hvars}


@pytest.mark.parametrize("case", GOLDEN, ids=_case_id)
def test_order_matches_real_ansible(
    ansible: dict[str, Any], case: tuple[str, str, str | None, str]
) -> None:
    name, group, limit, expected = case
    real = ansible["orders"][_case_id(case)]
    assert real == expected.split(), "ansible's order changed: update GOLDEN and fleetctl"
    inv = load_inventory(_file(name), limit=limit, group=group)
    assert [n.name for n in inv.nodes] == real


def test_unstable_order_is_one_of_ansibles(ansible: dict[str, Any]) -> None:
    """Level 1 in declaration order like Ansible; level 2 the same hosts, in fleetctl's fixed
    order where Ansible's depends on set iteration (a1h/b1h/c1h in any order)."""
    real = ansible["orders"][_case_id((UNSTABLE[0], "all", None, UNSTABLE[1]))]
    mine = UNSTABLE[1].split()
    assert real[:3] == mine[:3]
    assert sorted(real[3:]) == sorted(mine[3:])


@pytest.mark.parametrize("name", FILES)
def test_vars_match_real_ansible(ansible: dict[str, Any], name: str) -> None:
    """Node.vars is exactly ansible-inventory's merged hostvars; the mapped fields follow."""
    real = ansible["hostvars"][name]
    inv = load_inventory(_file(name))
    assert {n.name for n in inv.nodes} >= set(real)  # hosts without vars are left out there
    for node in inv.nodes:
        hv = real.get(node.name, {})
        assert node.vars == hv, node.name
        local = hv.get("ansible_connection") == "local"
        assert node.local is local
        assert node.address == hv.get("ansible_host", node.name)
        assert node.port == hv.get("ansible_port", 22)
        assert node.user == hv.get("ansible_user")
        assert node.key_file == hv.get("ansible_ssh_private_key_file")
        assert node.nic == hv.get("fleetctl_nic")
        assert node.train_addr == hv.get("fleetctl_addr")
        gpus = hv.get("fleetctl_gpus")
        assert node.gpus == (None if gpus is None else int(gpus))
        assert node.workdir == hv.get("fleetctl_workdir", DEFAULT_WORKDIR)
        assert node.python == hv.get("fleetctl_python", DEFAULT_PYTHON)
        assert node.env == {k: str(v) for k, v in hv.get("fleetctl_env", {}).items()}
