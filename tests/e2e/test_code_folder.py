"""``fleetctl run`` on the lab with a code folder that holds a checkpoint (pytorch/examples'
``snapshot.pt`` next to its script): the run warns, naming the file, and still runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.lab import Lab
from fleetctl.testing.files import tree

pytestmark = [pytest.mark.lab, pytest.mark.e2e]


def test_a_run_whose_code_folder_holds_snapshot_pt_warns_naming_it(
    lab3: Lab, tmp_path: Path
) -> None:
    code = tree(
        tmp_path / "code",
        {
            "multigpu.py": "import os\nprint('rank', os.environ['RANK'])\n",
            "snapshot.pt": "w" * 3000,
        },
    )
    argv = [
        *(sys.executable, "-m", "fleetctl", "run", "--inventory", str(lab3.inventory_path)),
        *("--launcher", "plain", "--nproc-per-node", "1", "--no-check"),
        *("--runs-dir", str(tmp_path / "runs"), "--code-dir", str(code), str(code / "multigpu.py")),
    ]
    p = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={**os.environ, "FLEETCTL_SSH_CONFIG": "/dev/null"},
    )
    assert p.returncode == 0, p.stderr
    warnings = [x for x in p.stderr.splitlines() if x.startswith("fleetctl: warning: ")]
    assert len(warnings) == 1, p.stderr
    assert "look like checkpoints or data, pushed as code to every node" in warnings[0]
    assert "snapshot.pt (2.9 KiB)" in warnings[0] and ".fleetignore" in warnings[0]
    assert sorted(p.stdout.splitlines()) == [f"[{i} node{i + 1}] rank {i}" for i in range(3)]
    (folder,) = (tmp_path / "runs").iterdir()  # and the run folder keeps it
    assert "snapshot.pt (2.9 KiB)" in (folder / "events.log").read_text()
