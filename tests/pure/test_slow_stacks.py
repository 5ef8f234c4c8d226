"""The slow-node verdict's py-spy evidence: real ``py-spy dump`` outputs of gloo DDP ranks
(``pyspy_dumps/``: torchrun, 3 ranks on CPU, py-spy 0.4.3, ``dump --nonblocking``) classified
as the node program does, and the shares and words they become in the verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.job.diagnose.pace import SlowVerdict
from fleetctl.job.diagnose.slowstacks import NodeSamples, SlowStacks, shares
from fleetctl.remote.programs.stacksample import classify

DUMPS = Path(__file__).parent / "pyspy_dumps"


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("peer_idle_all_reduce.txt", ("wait", "all_reduce")),  # asleep in dist.all_reduce
        ("slow_active_all_reduce.txt", ("wait", "all_reduce")),  # gloo polling: still a wait
        ("slow_active_gil_compute.txt", ("compute", None)),  # the script's own loop
        ("idle_backward.txt", ("wait", "backward")),  # DDP's bucket all-reduce, inside backward
        ("active_backward.txt", ("compute", None)),  # autograd computing
    ],
)
def test_real_py_spy_dumps_of_ddp_ranks_are_classified(name: str, want: tuple) -> None:
    assert classify((DUMPS / name).read_text()) == want


@pytest.mark.parametrize("name", sorted(p.name for p in DUMPS.glob("*.txt")))
def test_a_main_thread_showing_no_python_frame_is_unknown_not_compute(name: str) -> None:
    """In native code only (waiting or computing: py-spy cannot tell), as in each real dump
    with its main thread's frames taken out; the other threads' frames stay."""
    out, main = [], False
    for line in (DUMPS / name).read_text().splitlines():
        if line.startswith("Thread "):
            main = '"MainThread"' in line
        elif main and line.startswith("    "):
            continue
        out.append(line)
    text = "\n".join(out) + "\n"
    assert '"MainThread"' in text
    assert classify(text) == ("unknown", None)


def test_the_main_thread_is_judged_and_a_failed_or_empty_dump_is_unknown() -> None:
    other = (
        'Thread 0x7F00 (idle): "pin_memory"\n'
        "    all_reduce (torch/distributed/distributed_c10d.py:3252)\n"
        'Thread 0x7F01 (active+gil): "MainThread"\n'
        "    forward (model.py:12)\n"
    )
    assert classify(other) == ("compute", None)  # a helper thread's collective is not the rank's
    sync = 'Thread 7 (idle): "MainThread"\n    synchronize (torch/cuda/__init__.py:985)\n'
    assert classify(sync) == ("wait", "synchronize")  # NCCL's wait seen from Python
    asleep = 'Thread 7 (idle): "MainThread"\n    get (queue.py:180)\n    <module> (t.py:3)\n'
    assert classify(asleep) == ("idle", None)
    nameless = (
        "Thread 0x7FED0ED84B80 (idle)\n    barrier (torch/distributed/distributed_c10d.py:4)\n"
    )
    assert classify(nameless) == ("wait", "barrier")  # py-spy on 3.8 names no thread
    assert classify("Error: Failed to get stack traces\n") == ("unknown", None)
    assert classify("") == ("unknown", None)


def _node(rank: int, host: str, wait: int, compute: int, **kw: object) -> NodeSamples:
    places = kw.pop("places", {"all_reduce": wait} if wait else {})
    return NodeSamples(rank, host, wait=wait, compute=compute, places=places, **kw)  # type: ignore[arg-type]


def test_shares_name_the_peers_wait_and_the_slow_nodes_compute() -> None:
    got = shares(2, [_node(0, "h1", 7, 1), _node(1, "h2", 6, 2), _node(2, "h3", 1, 7)])
    assert (got.samples, got.peers_wait, got.node_compute) == (24, 0.812, 0.875)
    assert got.places == {"all_reduce": 0.812} and got.note is None
    assert got.phrase() == "peers wait in all_reduce 81% of the time (py-spy, 24 samples)"
    mixed = shares(
        0, [_node(0, "h1", 0, 8), _node(1, "h2", 6, 2, places={"all_reduce": 4, "backward": 2})]
    )
    assert (
        mixed.phrase()
        == "peers wait in all_reduce 50%, backward 25% of the time (py-spy, 16 samples)"
    )


def test_peers_asleep_outside_any_collective_are_said_so() -> None:
    got = shares(1, [NodeSamples(0, "h1", idle=8), NodeSamples(1, "h2", compute=8)])
    assert (got.peers_wait, got.peers_idle, got.node_compute) == (0.0, 1.0, 1.0)
    assert got.phrase() == (
        "peers wait in no collective, asleep elsewhere 100% of the time (py-spy, 16 samples)"
    )


def test_no_py_spy_is_a_one_line_note_and_no_figure() -> None:
    gone = "py-spy not available on this node"
    got = shares(1, [NodeSamples(0, "h1", error=gone), NodeSamples(1, "h2", error=gone)])
    assert got.phrase() is None and got.peers_wait is None
    assert got.note == f"no stack samples: h1: {gone}; h2: {gone}"


def test_the_verdict_takes_py_spys_words_in_place_of_the_kernels() -> None:
    why = "its ranks compute ~4.0× longer per step; peers wait in collectives 78% of the time"
    v = SlowVerdict(2, "h3", 0.9, 0.78, 4.0, None, 4, why)
    stacks = shares(2, [_node(0, "h1", 7, 1), _node(1, "h2", 6, 2), _node(2, "h3", 1, 7)])
    got = v.with_stacks(stacks)
    assert got.line() == (
        "node 2 (h3) slows the job: its ranks compute ~4.0× longer per step; "
        "peers wait in all_reduce 81% of the time (py-spy, 24 samples)"
    )
    assert got.to_dict()["stacks"]["places"] == {"all_reduce": 0.812}
    none = v.with_stacks(SlowStacks(0, None, {}, None, [], note="no stack samples: x"))
    assert none.why == why and none.to_dict()["stacks"]["note"] == "no stack samples: x"
