"""fleetctl/data/compose.yaml started for real, with podman-compose (Debian's; no Docker daemon
here): the hosts announce themselves, ``lab containers inventory --podman`` writes an inventory
that ``fleetctl check`` and a 3-node run use with host keys verified, no lookup waits on a DNS
server, and the fleet's containers and network are removed by their label."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl.testing.cli_runner import run_cli, run_cli_process
from fleetctl.testing.pytest_plugin import skip_or_fail

pytestmark = [pytest.mark.lab]

ROOT = Path(__file__).resolve().parents[2]


def _labelled(name: str) -> list[str]:
    flt = f"label=fleetctl.lab={name}"
    ps = subprocess.run(["podman", "ps", "-aq", "--filter", flt], capture_output=True, text=True)
    nets = subprocess.run(
        ["podman", "network", "ls", "-q", "--filter", flt], capture_output=True, text=True
    )
    return ps.stdout.split() + nets.stdout.split()


def test_the_compose_file_under_podman_compose_is_a_fleet_fleetctl_runs_on(tmp_path: Path) -> None:
    if os.environ.get("FLEETCTL_TEST_FLEET", "containers") != "containers":
        pytest.skip("podman-compose is the container tier's own check")
    if os.geteuid() != 0:
        skip_or_fail("podman-compose's fleet is reached over rootful podman's bridge (root)")
    for tool in ("podman", "podman-compose", "runc", "mmdebstrap"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is not installed (apt-get install podman-compose)")
    image = run_cli("lab", "containers", "image")
    assert image.exit_code == 0, image.stderr
    name = "pc" + secrets.token_hex(3)
    d = tmp_path / name  # the compose project is named after its folder
    assert run_cli("lab", "containers", "prepare", str(d)).exit_code == 0
    env = {**os.environ, "FLEETCTL_FLEET": name, "FLEETCTL_IMAGE": image.stdout.strip()}

    def compose(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["podman-compose", *args], cwd=d, env=env, capture_output=True, text=True, timeout=180
        )

    try:
        up = compose("up", "-d")
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-2000:]
        inv = run_cli("lab", "containers", "inventory", str(d), "--podman")
        assert inv.exit_code == 0, inv.stdout + inv.stderr
        inventory = d / "hosts.yml"
        check = run_cli("check", "-i", str(inventory))
        assert check.exit_code == 0, check.stdout + check.stderr
        (d / "code").mkdir()
        (d / "code" / "hello.py").write_text(
            "import os, socket, time\n"
            "t = time.monotonic()\n"
            "try:\n    socket.getaddrinfo('example.invalid', 80)\nexcept OSError:\n    pass\n"
            "print('hello', os.environ['FLEET_NODE_RANK'], socket.gethostname(),\n"
            "      'lookup-s=%.1f' % (time.monotonic() - t), flush=True)\n"
        )
        run = run_cli_process(
            "run", "-i", str(inventory), "--launcher", "plain", "--no-check",
            "--runs-dir", str(d / "runs"), "--code-dir", str(d / "code"),
            str(d / "code" / "hello.py"), cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert run.exit_code == 0, run.stdout + run.stderr
        for rank, host in enumerate(("node1", "node2", "node3")):
            m = re.search(rf"hello {rank} {host} lookup-s=([0-9.]+)", run.stdout)
            assert m, run.stdout
            # a resolver that never answers costs glibc 5 s per try; none at all, nothing
            assert float(m.group(1)) < 2.0, run.stdout
    finally:
        compose("down")
        removed = run_cli("lab", "containers", "down", name)
    assert removed.exit_code == 0, removed.stderr
    assert _labelled(name) == []
