"""The node's health sources read by Python 3.8: the lab's fake nvidia-smi, kernel log and IB
port (as a lab host has them, with faults injected), and the golden captures parsed as the
controller parses them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import node_tree

from fleetctl import remote
from fleetctl.health.judge import judge_health
from fleetctl.lab.health_faults import inject, write_health_files
from fleetctl.remote.kit import health

CASES = Path(__file__).parents[1] / "pure" / "health_cases"
READ = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import health
print(json.dumps(health.health_facts({"ib_root": sys.argv[2]})))
"""
PARSE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import health
print(json.dumps([health.parse_smi_xml(open(sys.argv[2]).read()),
                  health.parse_xid_lines(open(sys.argv[3]).read())]))
"""


def test_the_health_sources_are_read_under_3_8_from_a_lab_hosts_fakes(
    py38: str, tmp_path: Path
) -> None:
    host = tmp_path / "node1"
    (host / "bin").mkdir(parents=True)
    smi = (Path(remote.HERE).parent / "lab" / "fake_nvidia_smi.py").read_text()
    (host / "bin" / "nvidia-smi").write_text(f"#!{sys.executable} -IS\n" + smi)
    (host / "bin" / "nvidia-smi").chmod(0o755)
    (host / "bin" / "nvidia-smi.json").write_text(json.dumps({"count": 2, "seed": "t"}))
    write_health_files(host, sys.executable)
    ib_root = str(host / "sys" / "class" / "infiniband")

    def read() -> dict:
        out = subprocess.run(
            [py38, "-S", "-c", READ, node_tree(), ib_root],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": str(host / "bin")},
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    first = read()
    # an empty journal (no access: a real one has the boot lines) falls back to dmesg
    assert first["kernel"] == {"source": "dmesg", "xids": []}
    assert [p["port"] for p in first["ib"]] == ["mlx5_0/1"]
    healthy = judge_health(first, None)
    assert healthy.findings == [] and healthy.summary == "2 GPU(s), 1 IB port(s)"
    inject(host, "gpu-xid", 1, gpus=2, xid=79, count=1, reason="")
    inject(host, "ecc", 0, gpus=2, xid=0, count=3, reason="")
    inject(host, "ib-flap", 0, gpus=2, xid=0, count=2, reason="")
    facts = read()
    assert facts["kernel"]["source"] == "journalctl"
    sick = judge_health(facts, healthy.baseline)
    assert [f.line().split(" — ")[0] for f in sick.failed] == [
        "GPU 0: 3 uncorrectable ECC error(s) since the driver loaded",
        sick.failed[1].line().split(" — ")[0],
        "mlx5_0/1: link_downed +2 since the last check",
    ]
    assert sick.failed[1].where == "GPU 1" and sick.failed[1].evidence.startswith("XID 79 at ")


def test_python_3_8_parses_the_captures_as_the_controller_does(py38: str) -> None:
    for xml, log in (
        ("smi_h200_sick.xml", "dmesg_xid.txt"),
        ("smi_a100_driver470.xml", "journalctl_xid.txt"),
    ):
        out = subprocess.run(
            [py38, "-S", "-c", PARSE, node_tree(), str(CASES / xml), str(CASES / log)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        here = [
            health.parse_smi_xml((CASES / xml).read_text()),
            health.parse_xid_lines((CASES / log).read_text()),
        ]
        assert json.loads(out.stdout) == json.loads(json.dumps(here))
