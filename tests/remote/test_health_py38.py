"""The node's health sources read by Python 3.8: the lab's fake nvidia-smi, kernel log and IB
port (as a lab host has them, with faults injected), and the golden captures parsed as the
controller parses them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
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


# ---------------------------------------------------------------- the kernel log, read here

SOURCES = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import health
health.KMSG, health.JOURNAL_DIRS = sys.argv[2], (sys.argv[3],)
ran, run = [], health.run
def record(argv, timeout):
    ran.append(argv[0].rsplit("/", 1)[-1])
    return run(argv, timeout)
health.run = record
print(json.dumps([health.kernel_xids(), ran]))
"""


def _kmsg_readable() -> bool:
    try:
        with open(health.KMSG, "rb"):
            return True
    except OSError:
        return False


def test_an_xid_record_of_dev_kmsg_reads_as_dmesg_prints_it() -> None:
    rec = (
        b"3,1874,5012345678,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python,"
        b" GPU has fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n"
    )
    seq, line = health.kmsg_line(rec, b"NVRM: Xid")
    dmesg = (
        "[ 5012.345678] NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, "
        "GPU has fallen off the bus."
    )
    assert (seq, line) == (1874, dmesg)
    assert health.parse_xid_lines(line) == health.parse_xid_lines(dmesg)
    assert health.parse_xid_lines(line)[0]["xid"] == 79
    assert health.kmsg_line(b"6,0,0,-;Linux version 6.1\n", b"NVRM: Xid") == (0, None)
    tab = health.kmsg_line(b"6,7,12,-;NVRM: Xid a\\x09b\n", b"NVRM: Xid")[1]
    assert tab == "[    0.000012] NVRM: Xid a\tb"  # the kernel's escape undone, as dmesg does


@pytest.mark.skipif(not _kmsg_readable() or not shutil.which("dmesg"), reason="needs root")
def test_dev_kmsg_read_here_holds_what_dmesg_prints() -> None:
    got = health.read_kmsg(health.KMSG, b"")
    assert got is not None
    text, _whole = got
    ours = set(text.splitlines())
    theirs = subprocess.run(["dmesg"], capture_output=True, text=True, check=True).stdout
    # dmesg indents the lines after a newline inside one record; lines may arrive between reads
    missing = [ln for ln in theirs.splitlines() if ln not in ours and not ln.startswith(" ")]
    assert len(missing) <= 2, missing[:3]


@pytest.mark.parametrize(
    ("journal", "kmsg", "source", "ran"),
    [
        (False, False, "dmesg", ["dmesg"]),  # no journal: journalctl would print nothing
        (True, False, "dmesg", ["journalctl", "dmesg"]),  # (this host's journal is empty)
        (False, True, "kmsg", []),
        (True, True, "kmsg", []),  # the ring holds every line since boot: it says the same
    ],
)
def test_the_system_kernel_log_programs_run_only_where_the_ring_buffer_cannot_stand_in(
    py38: str, tmp_path: Path, journal: bool, kmsg: bool, source: str, ran: list
) -> None:
    tools = [shutil.which("journalctl"), shutil.which("dmesg")]
    if None in tools or (kmsg and not _kmsg_readable()):
        pytest.skip("needs journalctl, dmesg and (for the ring) root")
    ring = health.read_kmsg(health.KMSG)
    if journal and kmsg and ring is not None and not ring[1]:
        # the boot's first lines are gone: the journal is asked (and, empty here, dmesg)
        source, ran = "dmesg", ["journalctl", "dmesg"]
    bindir, journal_dir = tmp_path / "bin", tmp_path / "journal"
    bindir.mkdir()
    journal_dir.mkdir()
    for tool in tools:
        (bindir / Path(str(tool)).name).symlink_to(str(tool))  # the system's own: compiled
    if journal:
        (journal_dir / "machine-id").mkdir()
    kmsg_path = health.KMSG if kmsg else str(tmp_path / "no-kmsg")
    out = subprocess.run(
        [py38, "-S", "-c", SOURCES, node_tree(), kmsg_path, str(journal_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bindir)},
    )
    assert out.returncode == 0, out.stderr
    kernel, programs = json.loads(out.stdout)
    assert (kernel["source"], programs) == (source, ran)
    assert isinstance(kernel["xids"], list)


# ------------------------------------------------ the probe's program runner (waits.run)

RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import waits
py = sys.executable
big = "import sys; sys.stdout.write('x' * 300000); sys.stderr.write('e' * 100000)"
cases = [
    waits.run([py, "-c", "import sys; print(sys.stdin.read() == ''); sys.exit(3)"], 10),
    waits.run(["/no/such/program"], 10),
    waits.run(["no-such-program-on-path"], 10),
    waits.run([py, "-c", "import time; time.sleep(30)"], 0.5),
    waits.run([py, "-c", big], 10),
    waits.run([py, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"], 10),
    waits.run(["sh", "-c", "yes | head -c 3"], 10),
    waits.run(["sh", "-c", "ls /proc/self/fd"], 10),
    waits.run(["sh", "-c", "exec >&- 2>&-; sleep 30"], 0.5),  # its pipes shut, it lingers
]
print(json.dumps([[c[0], c[1][:20], len(c[1]), len(c[2])] for c in cases]))
"""


def test_the_probe_runs_programs_as_subprocess_did_under_3_8(py38: str) -> None:
    out = subprocess.run(
        [py38, "-S", "-c", RUN, node_tree()],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got[0][:2] == [3, "True\n"]  # stdin is /dev/null; the exit code kept
    assert got[1][0] == 127 and got[2][0] == 127  # missing, by path or on PATH
    assert got[3][0] == 124  # killed at its time limit
    assert got[4][0] == 0 and got[4][2:] == [300000, 100000]  # both pipes read in full
    assert got[5][0] == -15  # a signal's end, as subprocess says it
    assert got[6] == [0, "y\ny", 3, 0]  # SIGPIPE as the default: yes ends without a word
    assert got[7][1].split() == ["0", "1", "2", "3"]  # no fd of the probe's leaks into it
    assert got[8][0] == 124  # the limit holds after its output ended, as subprocess's did


SKIP = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit import health
health.NVIDIA_MODULE, health.KMSG = sys.argv[2], sys.argv[3]
print(json.dumps(health.health_facts({"ib_root": sys.argv[3]})["kernel"]))
"""


@pytest.mark.parametrize("driver", [False, True])
def test_no_kernel_log_is_read_where_no_nvidia_driver_could_have_logged_an_xid(
    py38: str, tmp_path: Path, driver: bool
) -> None:
    """No nvidia-smi and no driver loaded: no Xid line can exist, so none is looked for; a
    loaded driver without nvidia-smi on PATH still has its kernel log read."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "dmesg").write_text(
        "#!/bin/sh\necho '[ 12.500000] NVRM: Xid (PCI:0000:18:00): 79, off'\n"
    )
    (bindir / "dmesg").chmod(0o755)
    module = tmp_path / "module"
    if driver:
        module.mkdir()
    out = subprocess.run(
        [py38, "-S", "-c", SKIP, node_tree(), str(module), str(tmp_path / "no-kmsg")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": str(bindir)},
    )
    assert out.returncode == 0, out.stderr
    kernel = json.loads(out.stdout)
    if driver:
        assert kernel["source"] == "dmesg" and [x["xid"] for x in kernel["xids"]] == [79]
    else:
        assert kernel["xids"] == [] and kernel["skipped"] and kernel["source"]
