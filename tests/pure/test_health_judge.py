"""The health gate's parsers on captured-shape outputs (golden files in health_cases/), its
judge, and the ledger's rules: expiry, refresh, twice in a window, clearing, two writers."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from fleetctl.errors import HealthLedgerError
from fleetctl.health.judge import judge_health
from fleetctl.health.ledger import Ledger, load_last, record_sick, save_last
from fleetctl.remote.kit import health as node

CASES = Path(__file__).parent / "health_cases"
PARSERS = {
    "smi_h200_healthy.xml": node.parse_smi_xml,
    "smi_h200_sick.xml": node.parse_smi_xml,
    "smi_a100_driver470.xml": node.parse_smi_xml,
    "dmesg_xid.txt": node.parse_xid_lines,
    "journalctl_xid.txt": node.parse_xid_lines,
    "dcgm_diag_r1_fail.json": node.parse_dcgm,
}


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_each_captured_output_parses_to_its_golden_figures(name: str) -> None:
    got = PARSERS[name]((CASES / name).read_text())
    expected = json.loads((CASES / (name.rsplit(".", 1)[0] + ".expected.json")).read_text())
    assert json.loads(json.dumps(got)) == expected


def test_every_case_file_has_a_parser_and_a_golden_answer() -> None:
    inputs = {p.name for p in CASES.iterdir() if ".expected." not in p.name} - {"README.md"}
    assert inputs == set(PARSERS)


def facts(smi: str, kernel: str = "dmesg_xid.txt", boot: str = "b1", ib: list | None = None):
    return {
        "boot_id": boot,
        "gpus": node.parse_smi_xml((CASES / smi).read_text()),
        "kernel": {"source": "dmesg", "xids": node.parse_xid_lines((CASES / kernel).read_text())},
        "ib": ib or [],
    }


def test_a_sick_host_fails_with_one_line_per_gpu_naming_evidence_and_cause() -> None:
    v = judge_health(facts("smi_h200_sick.xml"), None)
    assert [(f.severity, f.line()) for f in v.findings] == [
        ("fail", "GPU 0: PCIe link x8, its maximum x16 — a degraded link"),
        ("warn", "GPU 0: PCIe gen 4 while busy, its maximum gen 5 — slow link"),
        (
            "fail",
            "GPU 1: 2 uncorrectable ECC error(s) since the driver loaded — GPU memory is "
            "failing; reset the GPU, replace it if it recurs",
        ),
        ("fail", "GPU 1: remapped rows pending — reset the GPU to apply them"),
        (
            "fail",
            "GPU 1: clocks throttled: hw_slowdown — HW slowdown (the board's power or thermal "
            "alarm)",
        ),
        (
            "warn",
            "GPU 0: XID 13 at 8124 s after boot: pid=48213, name=python, Graphics Exception: "
            "ESR 0x514648=0x1000f 0x514650=0x0 0x514644=0xd3eff2 0x51464c=0x17f — graphics "
            "engine exception; usually the application (an illegal access)",
        ),
        (
            "fail",
            "GPU 1: XID 79 at 9001 s after boot: pid='<unknown>', name=<unknown>, GPU has "
            "fallen off the bus. — GPU has fallen off the bus; reboot; reseat or replace the GPU",
        ),
        (
            "fail",
            "GPU 1: XID 94 at 9311 s after boot: pid=51002, name=python, Contained: SM (0x1). "
            "RST: No, D-RST: No — contained ECC error; reset the GPU (the process on it was "
            "stopped)",
        ),
    ]


def test_old_drivers_fields_are_judged_the_same() -> None:
    v = judge_health(
        {"boot_id": "b", **facts("smi_a100_driver470.xml", "journalctl_xid.txt")}, None
    )
    lines = [f.line() for f in v.findings]
    assert "GPU 3: 1 uncorrectable ECC error(s) in its lifetime — past memory faults; watch " \
        "for new ones" in lines  # fmt: skip
    assert "GPU 3: retired pages pending — reset the GPU to apply them" in lines
    assert any(x.startswith("GPU 3: clocks throttled: hw_thermal_slowdown") for x in lines)
    assert any(x.startswith("GPU 3: clocks throttled: sw_thermal_slowdown") for x in lines)
    # the XIDs name GPUs this host's nvidia-smi does not show: by their PCI address
    xids = [x for x in lines if "XID" in x]
    assert xids[0].startswith("GPU at PCI 1:00:00: XID 48 at 77013 s after boot")
    assert [f.severity for f in v.findings if "XID" in f.evidence] == ["fail", "warn", "fail"]


def test_a_healthy_host_passes_and_its_xids_are_old_news_at_the_next_check() -> None:
    healthy = facts("smi_h200_healthy.xml", "journalctl_xid.txt")
    assert judge_health(healthy, None).failed  # first check: every XID since boot counts
    first = judge_health(facts("smi_h200_healthy.xml"), None)
    again = judge_health(facts("smi_h200_healthy.xml"), first.baseline)
    assert again.findings == [] and again.summary == "2 GPU(s), 0 IB port(s)"
    rebooted = judge_health(facts("smi_h200_healthy.xml", boot="b2"), first.baseline)
    assert len(rebooted.failed) == 2  # another boot: its log is all new


def ib_port(port: str, state="ACTIVE", rate=400.0, **counters: int) -> dict:
    base = {"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0}
    return {
        "port": port,
        "state": state,
        "phys": "LinkUp" if state == "ACTIVE" else "Disabled",
        "rate": rate,
        "rate_text": f"{rate:g} Gb/sec (4X NDR)",
        "link_layer": "InfiniBand",
        "counters": {**base, **counters},
    }


def test_ib_ports_down_slow_or_flapping_since_the_last_check_are_named() -> None:
    before = {"boot_id": "b", "ib": [ib_port("mlx5_0/1"), ib_port("mlx5_1/1")]}
    last = judge_health(before, None).baseline
    now = {
        "boot_id": "b",
        "ib": [
            ib_port("mlx5_0/1", link_downed=2, symbol_error=40),
            ib_port("mlx5_1/1", rate=200.0),
            ib_port("mlx5_2/1", state="DOWN"),
        ],
    }
    got = [(f.severity, f.line()) for f in judge_health(now, last).findings]
    assert got == [
        ("fail", "mlx5_0/1: link_downed +2 since the last check — the link flapped (cable, "
                 "transceiver or switch port)"),
        ("warn", "mlx5_0/1: symbol_error +40 since the last check — a noisy link"),
        ("fail", "mlx5_1/1: rate 200 Gb/sec (4X NDR), the host's other ports 400 Gb/sec — a "
                 "degraded link (cable, transceiver or switch port)"),
        ("fail", "mlx5_2/1: port DOWN (Disabled) — link down"),
    ]  # fmt: skip
    assert judge_health(now, None).findings[0].line().startswith("mlx5_1/1: rate 200")


def test_a_failed_dcgm_test_fails_the_gpu_it_names() -> None:
    dcgm = node.parse_dcgm((CASES / "dcgm_diag_r1_fail.json").read_text())
    [f] = judge_health({"boot_id": "b", "dcgm": dcgm}, None).findings
    assert f.severity == "fail" and f.where == "GPU 1"
    assert f.evidence == "DCGM diag -r 1 Page Retirement/Row Remap: failed"


# ------------------------------------------------------------------------------- the ledger


def test_an_entry_expires_and_the_same_fault_seen_again_refreshes_it(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "ledger.json", window=100.0)
    led.record("n1", source="gate", reason="GPU 1: off the bus", ttl=10, now=1000)
    led.record("n1", source="gate", reason="GPU 1: off the bus", ttl=10, now=1005)
    [st] = led.status(now=1012).values()
    assert st.sick and not st.pinned and len(st.entries) == 1  # one fault, seen twice
    assert led.status(now=1016) == {}
    assert stat.S_IMODE((tmp_path / "ledger.json").stat().st_mode) == 0o600


def test_a_host_sick_twice_in_the_window_stays_out_until_cleared(tmp_path: Path) -> None:
    led = Ledger(tmp_path / "ledger.json", window=100.0)
    led.record("n1", source="gate", reason="GPU 1: off the bus", ttl=10, now=1000)
    led.record("n1", source="lost", reason="lost in attempt 1", ttl=10, now=1050)
    st = led.status(now=1090)["n1"]
    assert st.pinned and not st.sick and st.why().endswith("(until cleared (failed twice))")
    assert led.status(now=1151) == {}  # the window passed
    led.record("n2", source="gate", reason="a", ttl=10, now=1000)
    led.record("n2", source="gate", reason="b", ttl=10, now=1001)
    assert led.clear(["n2", "n3"]) == ["n2"] and "n2" not in led.status(now=1002)
    assert led.clear_all() == 2 and led.entries(now=1002) == []


def test_a_broken_ledger_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    path.write_text('{"entries": [{"host": 3}]}')
    with pytest.raises(HealthLedgerError, match=r"ledger.json: an entry is malformed"):
        Ledger(path).entries()
    path.write_text("{")
    with pytest.raises(HealthLedgerError, match=r"ledger.json: not JSON"):
        Ledger(path).status()


def test_record_sick_writes_the_users_ledger_and_refuses_an_unknown_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("FLEETCTL_HEALTH_TTL", "60")
    e = record_sick("n1", source="slow", reason="slowest rank", evidence="3.1x", job_id="j1")
    assert e.expires - e.at == 60
    assert Ledger().status()["n1"].entries == (e,)
    assert (tmp_path / "health" / "ledger.json").is_file()
    with pytest.raises(ValueError, match="source 'gpu'"):
        record_sick("n1", source="gpu", reason="x")
    save_last("n1", {"boot_id": "b", "xid_t": 5.0})
    assert load_last("n1") == {"boot_id": "b", "xid_t": 5.0} and load_last("n9") is None


def _writer(path: str, prefix: str) -> None:
    led = Ledger(Path(path))
    for i in range(40):
        led.record(f"{prefix}{i}", source="gate", reason="r", ttl=3600)


def test_two_processes_recording_at_once_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.json")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(path, p)) for p in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert len(Ledger(Path(path)).status()) == 80
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".ledger.")]
