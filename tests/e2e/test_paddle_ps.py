"""Paddle parameter-server mode from a two-role job file, with the real
``paddle.distributed.launch`` on the 3-host lab: every task gets the same ``--servers`` /
``--trainers`` lists and paddle gives each node the role and trainer id of its place in them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.cli_runner import run_cli_process

pytestmark = [pytest.mark.lab, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]

PSINFO = """\
import os
e = os.environ
print("ps-info " + " ".join(f"{k}={e.get(k)}" for k in (
    "TRAINING_ROLE", "PADDLE_PORT", "PADDLE_TRAINER_ID", "PADDLE_PSERVERS_IP_PORT_LIST",
    "PADDLE_TRAINER_ENDPOINTS", "POD_IP", "FLEET_ROLE", "FLEET_ROLE_INDEX")), flush=True)
"""

JOB = """\
launcher: paddle-ps
script: psinfo.py
roles:
  server: {instances: 1}
  worker: {instances: 2}
"""


def test_paddle_ps_roles_get_servers_and_trainers_from_the_job_file(
    lab3: Lab, tmp_path: Path, paddle_python: str
) -> None:
    import yaml

    inv = yaml.safe_load(lab3.inventory_path.read_text())
    for host in inv["all"]["children"]["nodes"]["hosts"].values():
        host["fleetctl_python"] = paddle_python
    inventory = tmp_path / "paddle-hosts.yml"
    inventory.write_text(yaml.safe_dump(inv))
    code = tmp_path / "code"
    code.mkdir()
    (code / "psinfo.py").write_text(PSINFO)
    (code / "ps.yml").write_text(JOB)
    runs = tmp_path / "runs"
    p = run_cli_process(
        *("run", "-i", str(inventory), "--no-check"),
        *("--runs-dir", str(runs), "--code-dir", str(code), "--job", str(code / "ps.yml")),
        timeout=300,
        cwd=ROOT,
    )
    assert p.exit_code == 0, p.stdout[-3000:] + p.stderr[-3000:]
    [folder] = [d for d in runs.iterdir() if d.is_dir()]
    roles = json.loads((folder / "roles.json").read_text())
    plan = json.loads((folder / "plan.json").read_text())
    ips = {n["host"]: n["train_addr"] for n in plan["nodes"]}
    port = {(t["role"], t["index"]): t["ports"]["paddle"][0] for t in roles["tasks"]}
    servers = f"{ips['node1']}:{port[('server', 0)]}"
    trainers = f"{ips['node2']}:{port[('worker', 0)]},{ips['node3']}:{port[('worker', 1)]}"
    want = {
        "node1": ("0-node1", "serverlog.0", "PSERVER", "None", port[("server", 0)]),
        "node2": ("1-node2", "workerlog.0", "TRAINER", "0", port[("worker", 0)]),
        "node3": ("2-node3", "workerlog.0", "TRAINER", "1", port[("worker", 1)]),
    }
    for host, (sub, log, role, trainer_id, own_port) in want.items():
        text = (folder / sub / "log" / log).read_text()
        line = next(x for x in text.splitlines() if x.startswith("ps-info "))
        info = dict(kv.split("=", 1) for kv in line.split()[1:])
        assert info["TRAINING_ROLE"] == role, text
        assert info["PADDLE_TRAINER_ID"] == trainer_id
        assert info["PADDLE_PORT"] == str(own_port)
        assert info["PADDLE_PSERVERS_IP_PORT_LIST"] == servers
        assert info["PADDLE_TRAINER_ENDPOINTS"] == trainers
        assert info["POD_IP"] == ips[host]
    assert json.loads((folder / "job.json").read_text())["status"] == "succeeded"
