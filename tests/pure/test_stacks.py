"""Folding a hung job's stack dumps: many dumps in (py-spy and faulthandler formats), the odd
rank out visible in the folded lines."""

from __future__ import annotations

import pytest

from fleetctl.cli.render import stack_lines
from fleetctl.job.stacks import RankStack, fold, innermost_frame

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
