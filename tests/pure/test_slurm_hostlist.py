"""Slurm hostlist expansion (fleetctl.slurm.hostlist), golden and against the real scontrol."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleetctl.errors import UsageError
from fleetctl.slurm.hostlist import expand

GOLDEN = {
    "gpu[01-04,07]": ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07"],
    "a[1-2],b3": ["a1", "a2", "b3"],
    "n[3,1,2]": ["n3", "n1", "n2"],
    "x[8-11]": ["x8", "x9", "x10", "x11"],
    "r[1-2]-n[01-02]": ["r1-n01", "r1-n02", "r2-n01", "r2-n02"],
    "a,b,a": ["a", "b", "a"],
    "n[001-3]": ["n001", "n002", "n003"],
    "n[1-03]": ["n1", "n2", "n3"],
    "n[1-3,2]": ["n1", "n2", "n3", "n2"],
    "node1": ["node1"],
    "a b": ["a", "b"],
    "a[1-2]x[3]": ["a1x3", "a2x3"],
    "node[1-3]": ["node1", "node2", "node3"],
}
BAD = ["h[9-10]s", "a[1-2]b,c[3-4]", "n[3-1]", "n[1-", "n]1[", "n[a-b]"]


@pytest.mark.parametrize("expr", sorted(GOLDEN))
def test_expand_golden(expr: str) -> None:
    assert expand(expr) == GOLDEN[expr]


@pytest.mark.parametrize("expr", BAD)
def test_expand_refuses_what_scontrol_refuses(expr: str) -> None:
    with pytest.raises(UsageError, match="invalid Slurm hostlist"):
        expand(expr)


def test_golden_matches_real_scontrol(tmp_path: Path) -> None:
    """The golden table is Slurm's own answer (skipped where Slurm is not installed)."""
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol not installed (apt-get install slurm-wlm)")
    conf = tmp_path / "slurm.conf"  # scontrol wants a config even to expand names
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1\nPartitionName=p\n")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for expr, want in GOLDEN.items():
        p = subprocess.run(
            ["scontrol", "show", "hostnames", expr], capture_output=True, text=True, env=env
        )
        assert p.stdout.split() == want, expr
    for expr in BAD[:3]:
        p = subprocess.run(
            ["scontrol", "show", "hostnames", expr], capture_output=True, text=True, env=env
        )
        assert p.returncode != 0 or not p.stdout.strip(), expr
