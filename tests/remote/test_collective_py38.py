"""The collective benchmark's node program under Python 3.8: it imports without torch (the
controller ships it to nodes whose python may lack torch, and reads that as a finding) and
reads InfiniBand ports from a sysfs tree."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import node_tree

from fleetctl import remote

READ_PORTS = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); "
    "from remote.programs import collective as c; "
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
    here = node_tree()
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


# A stand-in torch: records what its import saw (numpy reachable? the collector on?) and warns
# as a numpy-less torch does. A stand-in numpy: importing it is recorded too.
FAKE_TORCH = (
    "import gc, sys, warnings\n"
    "try:\n"
    "    import numpy\n"
    "    SAW_NUMPY = True\n"
    "except ImportError:\n"
    "    SAW_NUMPY = False\n"
    "    warnings.warn('Failed to initialize NumPy: No module named numpy', UserWarning)\n"
    "GC_ON = gc.isenabled()\n"
)
LOAD = (
    "import gc, json, sys, warnings; sys.path[:0] = sys.argv[1:3]; "
    "from remote.programs import collective as c\n"
    "with warnings.catch_warnings(record=True) as seen:\n"
    "    warnings.simplefilter('always')\n"
    "    torch = c.load_torch()\n"
    "import numpy\n"  # kept out of torch's import only: the node's numpy still imports after
    "print(json.dumps({'numpy': torch.SAW_NUMPY, 'gc_during': torch.GC_ON,\n"
    "    'gc_after': gc.isenabled(), 'frozen': gc.get_freeze_count() > 0,\n"
    "    'dist': 'torch.distributed' in sys.modules, 'warned': [str(w.message) for w in seen]}))\n"
)


def test_torch_is_imported_without_numpy_and_the_collector(py38: str, tmp_path: Path) -> None:
    """numpy kept out and the collector off while torch imports (a fifth of the import's CPU
    on the lab), both back after; torch's numpy warning silenced."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(FAKE_TORCH)
    (tmp_path / "torch" / "distributed.py").write_text("")
    (tmp_path / "numpy.py").write_text("")
    out = subprocess.run(
        [py38, "-S", "-c", LOAD, node_tree(), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "numpy": False,
        "gc_during": False,
        "gc_after": True,
        "frozen": True,
        "dist": True,
        "warned": [],
    }


def _rounds(times: list, others_settled: bool = True) -> int:
    from fleetctl.remote.programs.collective import best_rounds

    it = iter(times)
    return len(best_rounds(lambda: next(it), 3, lambda mine: mine and others_settled))


def test_the_all_reduce_stops_at_two_rounds_once_every_rank_agrees() -> None:
    assert _rounds([1.0, 1.1, 9.0]) == 2  # within 15%: a third round would not move the best
    assert _rounds([1.0, 1.5, 1.2]) == 3  # apart: a third
    assert _rounds([1.5, 1.0, 1.2]) == 3
    assert _rounds([1.0, 1.1, 1.2], others_settled=False) == 3  # another rank's two disagree
    from fleetctl.remote.programs.collective import best_rounds

    assert len(best_rounds(lambda: 1.0, 1, lambda mine: True)) == 1
    assert len(best_rounds(lambda: 1.0, 2, lambda mine: False)) == 2


def test_a_torch_that_needs_numpy_says_numpy_was_kept_out(py38: str, tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("import numpy\n")
    (tmp_path / "numpy.py").write_text("")
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]; "
        "from remote.programs import collective as c\n"
        "try:\n"
        "    c.load_torch()\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [py38, "-S", "-c", code, node_tree(), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "numpy is kept out of the collective's torch import" in out.stdout, out


# A stand-in torch for one rank alone: its import and each process group are logged, so a test
# sees how many times the program imported torch and made and destroyed a group.
PARTS_TORCH = """\
import os
def log(word):
    with open(os.environ["FAKE_TORCH_LOG"], "a") as f:
        f.write(word + "\\n")
log("import")
__version__ = "0+stand-in"
float32 = float64 = None
class T:
    def __init__(self, v):
        self.v = list(v)
    def item(self):
        return self.v[0]
    def tolist(self):
        return list(self.v)
def ones(n, dtype=None, device=None):
    return T([1.0] * n)
def zeros(n, dtype=None, device=None):
    return T([0.0] * n)
def tensor(v, dtype=None, device=None):
    return T(v)
class cuda:
    @staticmethod
    def is_available():
        return False
"""
PARTS_DIST = """\
from torch import log
class ReduceOp:
    MAX = "max"
class TCPStore:
    def __init__(self, host, port, world, is_master, timeout=None, wait_for_workers=True):
        self.port = port or 29500
def init_process_group(backend, store=None, rank=0, world_size=1, timeout=None):
    log("init " + backend)
def destroy_process_group():
    log("destroy")
def all_reduce(t, op=None):
    pass
def barrier():
    pass
"""


def test_one_program_runs_several_parts_in_a_row_with_torch_imported_once(
    py38: str, tmp_path: Path
) -> None:
    """The post-mortem's rounds on one program per host: a part with ``more`` leaves it
    waiting for the next (its ``I`` again, a fresh store and group), the last part ends it."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(PARTS_TORCH)
    (tmp_path / "torch" / "distributed.py").write_text(PARTS_DIST)
    log = tmp_path / "torch.log"
    part = {
        "rank": 0,
        "world": 1,
        "master_addr": "127.0.0.1",
        "size": 16,
        "iters": 2,
        "shifts": [],
        "deadline": 20,
        "op_timeout": 20,
    }
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FAKE_TORCH_LOG": str(log)}
    proc = subprocess.Popen(
        [py38, "-S", "-c", remote.inline("collective.py"), json.dumps({"wait": 20})],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    kinds, pids = [], set()
    try:
        for more in (True, True, False):
            proc.stdin.write(json.dumps({**part, "more": more}) + "\n")
            proc.stdin.flush()
            while True:
                kind, _, payload = proc.stdout.readline().rstrip("\n").partition(" ")
                assert kind, f"the program ended early: {kinds}"
                kinds.append(kind)
                if kind == "I":
                    pids.add(json.loads(payload)["pid"])
                if kind == "D":
                    data = json.loads(payload)
                    assert "error" not in data and data["allreduce"]["bytes"] == 16, data
                    break
        assert proc.wait(timeout=30) == 0  # the last part (no ``more``) ended it, stdin open
    finally:
        proc.kill()
        proc.wait(timeout=10)
        proc.stdin.close()
        proc.stdout.close()
    assert kinds == ["I", "R", "P", "P", "D"] * 3, kinds
    assert len(pids) == 1
    assert log.read_text().split("\n") == ["import", *["init gloo", "destroy"] * 3, ""]
