"""The GPU health gate end to end on a 4-host lab with fake GPUs: a faked XID 79 on one host
fails `check` for that host alone and writes the ledger; `run --nodes 3` then leaves it out
and runs on the other three; `fleetctl health` lists it; `health --clear` brings it back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fleetctl.testing.cli_runner import CliResult, run_cli

ROOT = Path(__file__).resolve().parents[2]
TICK = "import os\nprint('tick', os.environ['RANK'], flush=True)\n"


def fleetctl(*args: str) -> CliResult:
    return run_cli(*args, cwd=ROOT)


def health_json() -> list[dict[str, Any]]:
    p = fleetctl("health", "--json")
    assert p.exit_code == 0, p.stderr
    return json.loads(p.stdout)["hosts"]


def test_an_xid_79_on_one_host_fails_its_check_alone_and_run_nodes_3_leaves_it_out(
    make_lab: Any, tmp_path: Path
) -> None:
    lab = make_lab(4, networks=2, gpus=2)
    inv = str(lab.inventory_path)
    p = fleetctl("lab", "fault", "--dir", str(lab.dir), "gpu-xid", "node2", "--gpu", "1")
    assert p.exit_code == 0, p.stderr
    assert "node2: GPU 1: XID 79 (GPU has fallen off the bus)" in p.stderr + p.stdout

    p = fleetctl("check", "-i", inv, "--json")
    assert p.exit_code == 3, p.stderr
    report = json.loads(p.stdout)
    [(host, check, why)] = [(f["host"], f["check"], f["reason"]) for f in report["failures"]]
    assert (host, check) == ("node2", "health"), report["failures"]
    assert why.startswith("GPU 1: XID 79 at "), why
    assert "GPU has fallen off the bus; reboot; reseat or replace the GPU" in why
    for h in report["hosts"]:
        if h["host"] != "node2":
            assert h["checks"]["health"]["status"] == "ok", h
            assert h["checks"]["health"]["detail"].startswith("2 GPU(s), 1 IB port(s)")

    [entry] = health_json()
    assert entry["host"] == "node2" and entry["out"] and not entry["pinned"]
    assert entry["why"].startswith("gate: GPU 1: GPU has fallen off the bus (until ")
    listed = fleetctl("health", "-i", inv).stdout
    assert "node2: out: gate: GPU 1: GPU has fallen off the bus" in listed, listed

    (tmp_path / "tick.py").write_text(TICK)
    runs = tmp_path / "runs"
    p = fleetctl(
        "run", "-i", inv, "--launcher", "plain", "--nproc-per-node", "1", "--nodes", "3",
        "--runs-dir", str(runs), "--code-dir", str(tmp_path), str(tmp_path / "tick.py"),
    )  # fmt: skip
    assert p.exit_code == 0, p.stdout + p.stderr
    assert "node2: left out: health ledger: gate: GPU 1: GPU has fallen off the bus" in p.stderr
    assert "running on node1, node3, node4" in p.stderr, p.stderr

    p = fleetctl("health", "--clear", "node2")
    assert p.exit_code == 0 and "node2: cleared" in p.stderr, p.stderr
    assert health_json() == []
    p = fleetctl("check", "-i", inv, "--json", "--mesh", "off")
    assert p.exit_code == 0, p.stdout  # the XID is older than the last check: node2 is back
