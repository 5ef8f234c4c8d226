"""The progress markers' parser (``remote/kit/progress.py``) run by Python 3.8: one parser for
both sides, so a node reads a line's markers exactly as the controller does."""

from __future__ import annotations

import json
import subprocess

from conftest import node_tree

from fleetctl.remote.kit.progress import Count, parse

LINES = [
    "Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.308416",
    "[rank3]:Train Epoch: 2 [64/60000 (0%)]\tLoss: 0.2",
    " 36%|███▌      | 360/1000 [00:12<00:21, 30.1it/s]\r 37%|███▋      | 370/1000 [00:12<00:21]",
    "3761it [00:12, 301.12it/s]",
    " 12%|█▏        | 1.20k/10.0k [00:05<00:38, 231it/s]",
    " 45%|████▌     | 4.50M/10.0M [00:02<00:02, 2.36MB/s]",
    "{'loss': 0.6931, 'grad_norm': 1.2345, 'learning_rate': 4.5e-05, 'epoch': 0.12}",
    "TrainOutput(global_step=10000, training_loss=0.43, metrics={'epoch': 9.98})",
    "epoch: 0, batch_id: 20, loss is: [0.4121], acc is: [0.875]",
    "[Epoch 0, batch 20] loss: 2.29515",
    "step 20/938 - loss: 0.4573 - acc: 0.8672 - 12ms/step",
    "iter 300 loss 1.23",
    "total steps=1000",
    "Loading checkpoint shards: done",
]

PARSE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit.progress import Count, parse
lines = json.loads(sys.stdin.read())
count = Count()
print(json.dumps({
    "markers": [[[m.kind, m.value, m.epoch] for m in parse(ln)] for ln in lines],
    "counts": [count.add(m) for ln in lines for m in parse(ln) if m.kind == "mnist"],
}))
"""


def test_python_3_8_reads_the_markers_of_every_shape_as_the_controller_does(py38: str) -> None:
    out = subprocess.run(
        [py38, "-c", PARSE, node_tree()],
        input=json.dumps(LINES), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    got = json.loads(out.stdout)
    want = [[[m.kind, m.value, m.epoch] for m in parse(ln)] for ln in LINES]
    assert got["markers"] == want
    assert sum(1 for m in want if m) == 11, want  # a bytes bar and the two last lines: none
    count = Count()  # epoch 2 carries epoch 1's 640 samples on
    mnist = [count.add(m) for ln in LINES for m in parse(ln) if m.kind == "mnist"]
    assert got["counts"] == mnist == [640.0, 704.0]


TALLY = """
import json, sys
sys.path.insert(0, sys.argv[1])
from remote.kit.progress import RING, Tally
clock = [100.0]
tally = Tally(clock=lambda: clock[0])
for i, line in enumerate([
    b"Train Epoch: 1 [6336/6400 (99%)]\\tLoss: 0.3",
    b"loading data, no marker here",
    b"Train Epoch: 2 [64/6400 (1%)]\\tLoss: 0.3",
    b"[rank1]:step 7",
    b"Train Epoch: 1 [640/6400 (10%)]\\tLoss: 0.3",
]):
    clock[0] += 1
    tally.line(line)
first = tally.report()
for i in range(RING + 10):  # a flood between two reports: the newest RING lines are read
    tally.line(b"[rank1]:step %d" % (8 + i))
own = Tally("shard (?P<n>[0-9]+) done", clock=lambda: 5.0)
own.line(b"shard 4 done, step 99")
print(json.dumps({"first": first, "second": tally.report(), "ring": RING, "own": own.report()}))
"""


def test_a_detached_supervisors_tally_counts_each_ranks_markers_with_their_time(
    py38: str,
) -> None:
    """Python 3.8, as a node runs it: each rank's count carried across epochs (a lagging
    line ignored), stamped with the time of the line that said it; a flood costs the newest
    ``RING`` lines' parsing, not its length; the job's own regex replaces the shapes."""
    out = subprocess.run(
        [py38, "-c", TALLY, node_tree()], capture_output=True, text=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    assert got["first"] == [["", "mnist", 103.0, 6400.0], ["1", "step", 104.0, 7.0]]
    ring = got["ring"]
    assert got["second"] == [["", "mnist", 103.0, 6400.0], ["1", "step", 105.0, 8.0 + ring + 9]]
    assert got["own"] == [["", "own", 5.0, 4.0]]
