"""``fleetctl_env`` from groups and hosts does not merge: the winning definition (by the usual
variable precedence) replaces the others whole, as Ansible's default ``hash_behaviour=replace``
does (docs/inventory.md, "fleetctl_env from groups and hosts"); ``ansible-inventory --list``
agrees where it is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from fleetctl.plan.inventory import load_inventory
from fleetctl.plan.rankplan import JobSpec, make_plan
from fleetctl.testing.pytest_plugin import skip_or_fail

INVENTORY = """\
all:
  vars:
    fleetctl_env: {OMP_NUM_THREADS: 8, NCCL_DEBUG: WARN}
  children:
    ib:
      vars:
        fleetctl_env: {NCCL_IB_HCA: mlx5}
      hosts:
        gpu01: {ansible_host: 10.0.0.1}
        gpu02: {ansible_host: 10.0.0.2, fleetctl_env: {NCCL_DEBUG: INFO}}
    eth:
      hosts:
        gpu03: {ansible_host: 10.0.0.3}
"""

WANT = {
    "gpu01": {"NCCL_IB_HCA": "mlx5"},  # the group's mapping replaces all's: no OMP_NUM_THREADS
    "gpu02": {"NCCL_DEBUG": "INFO"},  # the host's replaces its group's: no NCCL_IB_HCA
    "gpu03": {"OMP_NUM_THREADS": "8", "NCCL_DEBUG": "WARN"},  # all's, untouched
}


def test_a_host_or_group_fleetctl_env_replaces_the_one_below_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    nodes = load_inventory(path).nodes
    assert {n.name: dict(n.env) for n in nodes} == WANT
    plan = make_plan(nodes, JobSpec(script="train.py", job_id="j1", launcher="plain"))
    for node in plan.nodes:  # and that is what the job gets
        for name in ("OMP_NUM_THREADS", "NCCL_DEBUG", "NCCL_IB_HCA"):
            assert node.env.get(name) == WANT[node.host].get(name)


def test_ansible_inventory_says_the_same(tmp_path: Path) -> None:
    exe = shutil.which("ansible-inventory")
    if exe is None:
        skip_or_fail("ansible-core not installed (pip install ansible-core==2.19.14)")
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text("[defaults]\n")  # neutral: Ansible's defaults, hash_behaviour=replace
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_HOME": str(tmp_path),
        "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"),
    }
    out = subprocess.run(
        [exe, "-i", str(path), "--list"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    hostvars = json.loads(out.stdout)["_meta"]["hostvars"]
    got = {h: {k: str(v) for k, v in hostvars[h]["fleetctl_env"].items()} for h in WANT}
    assert got == WANT
