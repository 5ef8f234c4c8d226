"""What the node supervisor imports on Python 3.8: every stdlib module is CPU at every start of
it on every node (issue 35: a no-op run's remote CPU). An attached run's supervisor needs no
``dataclasses`` (the progress markers' parser: a detached job's tally only) and no ``shutil``
(the container runtime's lookup: ``--image`` only); a detached one with the slow-node watch
still gets its tally."""

from __future__ import annotations

import json
import subprocess

from conftest import node_tree

# modules the supervisor imported before the progress parser and the container lookup came
# in at the top (~10 ms of CPU per start with Python 3.11 -S: docs/performance.md, issue 35)
HEAVY = ("dataclasses", "inspect", "shutil", "bz2", "lzma", "fnmatch", "ast", "tokenize")

PROG = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.programs import supervisor
from remote.kit.output import Out
from remote.kit.records import SupervisorSpec
from remote.kit.supervision import Supervisor
loaded = sorted(sys.modules)
base = dict(argv=["true"], run_dir=sys.argv[2], job_id="j", node_rank=0)
attached = Supervisor(SupervisorSpec(**base, pace={}), Out(None), None)
after_attached = sorted(sys.modules)
detached = Supervisor(SupervisorSpec(**base, detach=True, pace={}), Out(None), None)
print(json.dumps({
    "loaded": loaded,
    "attached_tally": attached.tally is not None,
    "after_attached": after_attached,
    "detached_tally": type(detached.tally).__name__,
}))
"""


def test_an_attached_supervisor_imports_no_dataclasses_or_shutil(py38: str, tmp_path) -> None:
    out = subprocess.run(
        [py38, "-S", "-c", PROG, node_tree(), str(tmp_path / "run")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert [m for m in HEAVY if m in got["loaded"]] == []
    assert [m for m in HEAVY if m in got["after_attached"]] == []
    assert got["attached_tally"] is False
    assert got["detached_tally"] == "Tally"  # the detached job's monitor still gets its counts
