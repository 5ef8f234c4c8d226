"""Folding a hung job's stack dumps: many dumps in (py-spy and faulthandler formats), the odd
rank out visible in the folded lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl import remote
from fleetctl.cli.render import stack_lines
from fleetctl.job.diagnose.stacks import fold
from fleetctl.phases.stackdumps import RankStack, console_stacks, innermost_frame

PYSPY_WAITING = """\
Process 4242: /usr/bin/python3 train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    wait (torch/distributed/distributed_c10d.py:3041)
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    train (train.py:88)
    <module> (train.py:130)
Thread 4250 (idle): "Thread-1 (_pin_memory_loop)"
    select (selectors.py:415)
"""

PYSPY_LOADER_FIRST = """\
Process 4243: /usr/bin/python3 train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 4251 (idle): "Thread-1 (_pin_memory_loop)"
    select (selectors.py:415)
Thread 4243 (idle): "MainThread"
    load_batch (data.py:41)
    train (train.py:80)
"""

FAULTHANDLER_WAITING = """\
some output line
Fatal Python error: Aborted

Thread 0x00007f0a1b2c3640 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "/usr/lib/python3.11/threading.py", line 622 in wait

Current thread 0x00007f0a2d4e5740 (most recent call first):
  File "/opt/torch/distributed/distributed_c10d.py", line 3041 in wait
  File "/work/train.py", line 88 in train
  File "/work/train.py", line 130 in <module>
"""

FAULTHANDLER_STUCK = """\
Fatal Python error: Aborted

Current thread 0x00007f0a2d4e5740 (most recent call first):
  File "/work/ddp_train.py", line 75 in stuck_loading_batch
  File "/work/ddp_train.py", line 160 in main
"""

LAUNCHER = """\
Thread 100 (idle): "MainThread"
    _monitor_workers (torch/distributed/elastic/agent/server/local_elastic_agent.py:350)
"""


@pytest.mark.parametrize(
    ("text", "frame"),
    [
        (PYSPY_WAITING, "wait (distributed_c10d.py:3041)"),
        (PYSPY_LOADER_FIRST, "load_batch (data.py:41)"),  # the main thread, not the first
        (FAULTHANDLER_WAITING, "wait (distributed_c10d.py:3041)"),  # the current thread
        (FAULTHANDLER_STUCK, "stuck_loading_batch (ddp_train.py:75)"),
        ("no stack here\n", None),
    ],
)
def test_the_innermost_frame_is_the_main_threads_in_either_format(
    text: str, frame: str | None
) -> None:
    assert innermost_frame(text) == frame


def test_sixty_four_dumps_fold_to_the_common_wait_and_the_odd_rank_out() -> None:
    stacks = [
        RankStack(node=r // 8, rank=r, text=PYSPY_WAITING if r % 2 else FAULTHANDLER_WAITING)
        for r in range(64)
        if r != 37
    ]
    stacks.append(RankStack(node=4, rank=37, text=FAULTHANDLER_STUCK))
    stacks += [RankStack(node=n, rank=None, text=LAUNCHER) for n in range(8)]
    assert stack_lines(fold(stacks)) == [
        "ranks 0-36,38-63: wait (distributed_c10d.py:3041)",
        "rank 37: stuck_loading_batch (ddp_train.py:75)",
        "launcher on nodes 0-7: _monitor_workers (local_elastic_agent.py:350)",
    ]


def test_a_process_without_a_python_stack_is_named_not_dropped() -> None:
    groups = fold([RankStack(0, 0, PYSPY_WAITING), RankStack(0, 1, "")])
    assert stack_lines(groups) == [
        "rank 0: wait (distributed_c10d.py:3041)",
        "rank 1: no Python stack",
    ]


# A real console.log after a stall's SIGABRT (generated with Python 3.11's faulthandler from
# stack_dumps/hang.py and a stand-in for torchrun's elastic agent): the launcher's dump is
# untagged and comes first, the ranks' lines come tagged `[rank G]`, interleaved.
CONSOLE = (Path(__file__).parent / "stack_dumps" / "torchrun_faulthandler_console.log").read_text()


def test_faulthandler_dumps_in_a_console_log_fold_per_rank_not_as_the_launchers() -> None:
    assert innermost_frame(CONSOLE) == "_monitor_workers (api.py:5)"  # one text: the launcher's
    stacks = console_stacks(CONSOLE, node=0)
    assert {s.rank: innermost_frame(s.text) for s in stacks} == {
        None: "_monitor_workers (api.py:5)",
        0: "train (hang.py:21)",
        1: "slow_data_loader (hang.py:12)",
    }
    assert stack_lines(fold(stacks)) == [
        "rank 0: train (hang.py:21)",
        "rank 1: slow_data_loader (hang.py:12)",
        "launcher on node 0: _monitor_workers (api.py:5)",
    ]


def test_a_plain_launchers_untagged_dump_is_the_ranks_own() -> None:
    untagged = "\n".join(
        line.removeprefix("[rank 1] ")
        for line in CONSOLE.splitlines()
        if line.startswith("[rank 1] ")
    )
    (stack,) = console_stacks("hello\n" + untagged, node=3, untagged_rank=3)
    assert (stack.node, stack.rank, innermost_frame(stack.text)) == (
        3,
        3,
        "slow_data_loader (hang.py:12)",
    )
    assert console_stacks("no dump here\n[rank 0] nor here\n", node=0) == []


def test_the_node_report_folds_console_dumps_with_py_spys() -> None:
    from fleetctl.phases.stacks import NodeStacks, StackReport

    node0 = NodeStacks(0, "node0", console=CONSOLE)
    node0.processes = [
        {"pid": 10, "rank": None, "method": "faulthandler", "text": None},
        {"pid": 11, "rank": 0, "method": "faulthandler", "text": None},
        {"pid": 12, "rank": 1, "method": "faulthandler", "text": None},
    ]
    node1 = NodeStacks(1, "node1", processes=[{"pid": 5, "rank": 2, "text": PYSPY_WAITING}])
    assert stack_lines(fold(StackReport([node0, node1]).stacks())) == [
        "rank 0: train (hang.py:21)",
        "rank 1: slow_data_loader (hang.py:12)",
        "rank 2: wait (distributed_c10d.py:3041)",
        "launcher on node 0: _monitor_workers (api.py:5)",
    ]


def test_the_node_side_sends_back_the_dump_an_aborted_rank_wrote(tmp_path: Path) -> None:
    """remote/programs/stacks.py on this machine, py-spy out of reach: the rank is aborted, and the
    D frame carries what console.log gained — its faulthandler dump, folded under its rank."""
    import json
    import os
    import subprocess
    import sys
    import time

    from fleetctl.phases.stacks import NodeStacks

    here = Path(__file__).parent
    console = tmp_path / "console.log"
    with open(console, "ab") as log:
        env = dict(os.environ, FLEET_JOB_ID="j-fh", RANK="1", PYTHONFAULTHANDLER="1")
        rank = subprocess.Popen(
            [sys.executable, str(here / "stack_dumps" / "hang.py"), "1"],
            stdout=log, stderr=log, env=env,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while b"ready" not in console.read_bytes():  # the rank is in slow_data_loader
            assert time.monotonic() < deadline and rank.poll() is None
            time.sleep(0.05)
        args = {"job_id": "j-fh", "run_dir": str(tmp_path), "py_spy": None, "abort": True}
        out = subprocess.run(
            [sys.executable, "-c", remote.inline("stacks.py"), json.dumps(args)],
            capture_output=True, text=True, timeout=60, env={"PATH": "/nonexistent"},
        )  # fmt: skip
        assert rank.wait(timeout=10) == -6  # SIGABRT
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait()
    frames = {line[0]: json.loads(line[2:]) for line in out.stdout.splitlines()}
    assert frames["K"]["method"] == "faulthandler" and frames["K"]["rank"] == 1
    assert frames["D"]["faulthandler"] == 1
    node = NodeStacks(0, "node0", processes=[frames["K"]], console=frames["D"]["console"])
    assert stack_lines(fold(node.console_stacks())) == ["rank 1: slow_data_loader (hang.py:12)"]
