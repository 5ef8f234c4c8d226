"""The collective benchmark's node program under Python 3.8: it imports without torch (the
controller ships it to nodes whose python may lack torch, and reads that as a finding) and
reads InfiniBand ports from a sysfs tree."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fleetctl import remote

READ_PORTS = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); import collective as c; "
    "assert 'torch' not in sys.modules; print(json.dumps(c.ib_ports(sys.argv[2])))"
)


def test_the_collective_program_imports_without_torch_and_reads_ib_ports(
    py38: str, tmp_path: Path
) -> None:
    port = tmp_path / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text("4: ACTIVE\n")
    (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
    (port / "link_layer").write_text("InfiniBand\n")
    here = str(remote.HERE)
    for root, want in ((tmp_path, [("mlx5_0", "ACTIVE", 200.0)]), (tmp_path / "none", [])):
        out = subprocess.run(
            [py38, "-S", "-c", READ_PORTS, here, str(root)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        got = [(p["device"], p["state"], p["rate"]) for p in json.loads(out.stdout)]
        assert got == want


def test_the_shipped_program_says_its_pid_then_its_finding_under_38(py38: str) -> None:
    """Started ahead of its part (``{"wait": S}``): its pid first (the controller's SIGABRT
    target), then the import's finding — here torch missing — from the nice-10 import thread."""
    keep, held = os.pipe()  # its stdin stays open: EOF would end it before its finding
    try:
        out = subprocess.run(
            [py38, "-S", "-c", remote.inline("collective.py"), json.dumps({"wait": 20})],
            capture_output=True,
            text=True,
            timeout=60,
            stdin=keep,
        )
    finally:
        os.close(keep)
        os.close(held)
    frames = [line.split(" ", 1) for line in out.stdout.splitlines()]
    assert [k for k, _ in frames] == ["I", "D"], out.stdout + out.stderr
    assert isinstance(json.loads(frames[0][1])["pid"], int)
    assert json.loads(frames[1][1])["error"].startswith("cannot import torch with ")
