"""Progress markers (``fleetctl.remote.kit.progress``) as a golden table of real
lines: each printed by the source it names (its format string rendered, or its own docs'
sample output), with the markers the parser must read from it."""

from __future__ import annotations

import re

import pytest

from fleetctl.remote.kit.progress import Marker, compile_own, may_mark, parse, source

M = Marker
GOLDEN: list[tuple[str, str, list[Marker]]] = [
    # (where the line comes from, the line, its markers)
    (
        "pytorch/examples mnist/main.py train(): "
        "'Train Epoch: {} [{}/{} ({:.0f}%)]\\tLoss: {:.6f}'",
        "Train Epoch: 1 [640/60000 (1%)]\tLoss: 0.308416",
        [M("mnist", 640.0, 1.0)],
    ),
    (
        "pytorch/examples mnist/main.py, the epoch's last line",
        "Train Epoch: 14 [59520/60000 (99%)]\tLoss: 0.002301",
        [M("mnist", 59520.0, 14.0)],
    ),
    (
        "tqdm/tqdm README.rst, the sample bar",
        "76%|████████████████████████████         | 7568/10000 [00:33<00:10, 229.00it/s]",
        [M("tqdm", 7568.0)],
    ),
    (
        "tqdm/tqdm, a bar's \\r updates arriving as one line: the last one counts",
        " 36%|███▌      | 360/1000 [00:12<00:21, 30.1it/s]\r 37%|███▋      | 370/1000 "
        "[00:12<00:21, 30.1it/s]",
        [M("tqdm", 370.0)],
    ),
    (
        "tqdm/tqdm README.rst, a bar with no total",
        "3761it [00:12, 301.12it/s]",
        [M("tqdm", 3761.0)],
    ),
    (
        "tqdm 4.70.1 format_meter(3, 100, 6, rate=0.5): a slow loop's rate is seconds per it",
        "  3%|▎         | 3/100 [00:06<03:14,  2.00s/it]",
        [M("tqdm", 3.0)],
    ),
    (
        "tqdm 4.70.1 format_meter(1200, 10000, 5.2, unit_scale=True): the count scaled",
        " 12%|█▏        | 1.20k/10.0k [00:05<00:38, 231it/s]",
        [M("tqdm", 1200.0)],
    ),
    (
        "tqdm 4.70.1 format_meter(1230, None, 5, unit_scale=True): scaled, no total",
        "1.23kit [00:05, 230it/s]",
        [M("tqdm", 1230.0)],
    ),
    (
        "tqdm 4.70.1 format_meter(45, 100, 1.5, unit='batch', postfix='loss=0.3'): own unit",
        " 45%|████▌     | 45/100 [00:01<00:01, 30.00batch/s, loss=0.3]",
        [M("tqdm", 45.0)],
    ),
    (
        "tqdm 4.70.1 format_meter(0, 100, 0): a bar's first line, no rate yet",
        "  0%|          | 0/100 [00:00<?, ?it/s]",
        [M("tqdm", 0.0)],
    ),
    (
        "tqdm 4.70.1 format_meter(…, unit='B', unit_scale=True, unit_divisor=1024): a "
        "download (huggingface_hub's bars) is no training progress",
        " 45%|█████████████████                     | 4.50M/10.0M [00:02<00:02, 2.36MB/s]",
        [],
    ),
    (
        "tqdm 4.70.1 format_meter(4718592, 10485760, 2, unit='B'): bytes, unscaled",
        " 45%|████▌     | 4718592/10485760 [00:02<00:02, 2359296.00B/s]",
        [],
    ),
    (
        "tqdm 4.70.1 format_meter(1234, 10000, 1, unit='kB'): kilobytes",
        " 12%|█▏        | 1234/10000 [00:01<00:07, 1234.00kB/s]",
        [],
    ),
    (
        "tqdm 4.70.1 format_meter(…, unit='iB', unit_scale=True): MiB/s",
        " 45%|████▌     | 4.72M/10.5M [00:02<00:02, 2.36MiB/s]",
        [],
    ),
    (
        "tqdm 4.70.1 format_meter(3760000, None, 12.5, unit='B', unit_scale=True): bytes, no total",
        "3.76MB [00:12, 301kB/s]",
        [],
    ),
    (
        "huggingface/transformers trainer_callback.py ProgressCallback.on_log: "
        "self.training_bar.write(str(logs))",
        "{'loss': 0.6931, 'grad_norm': 1.2345, 'learning_rate': 4.5e-05, 'epoch': 0.12}",
        [M("epoch", 0.12)],
    ),
    (
        "huggingface/transformers Trainer.train's result (microsoft/SpeechT5 issue log)",
        "TrainOutput(global_step=10000, training_loss=0.4377235143661499, metrics={"
        "'train_runtime': 11359.2176, 'epoch': 9.98})",
        [M("global_step", 10000.0)],
    ),
    (
        "PaddlePaddle docs (dygraph training loop): 'epoch: {}, batch_id: {}, loss is: {}'",
        "epoch: 0, batch_id: 20, loss is: [0.4121], acc is: [0.875]",
        [M("epoch_batch", 20.0, 0.0)],
    ),
    (
        "PaddlePaddle examples' '[Epoch {}, batch {}]' loss lines",
        "[Epoch 0, batch 20] loss: 2.29515",
        [M("epoch_batch", 20.0, 0.0)],
    ),
    (
        "PaddlePaddle hapi ProgressBar (verbose=2): 'step {}/{} - loss: …'",
        "step 20/938 - loss: 0.4573 - acc: 0.8672 - 12ms/step",
        [M("step", 20.0)],
    ),
    (
        "a plain training loop's print(f'iter {i} loss {loss}')",
        "iter 300 loss 1.23",
        [M("iter", 300.0)],
    ),
    ("a plain loop: 'Iteration: 12'", "Iteration: 12, lr 0.1", [M("iter", 12.0)]),
    ("a plain loop: 'step=41'", "rank 0 step=41 loss=0.5", [M("step", 41.0)]),
    ("a line that says no progress", "Loading checkpoint shards: done", []),
    ("'steps' is a count, not a position", "total steps=1000", []),
    ("a ms/step figure is no step", "12ms/step", []),
]


@pytest.mark.parametrize(("where", "line", "want"), GOLDEN, ids=[g[0][:60] for g in GOLDEN])
def test_real_training_lines_give_their_progress_markers(
    where: str, line: str, want: list[Marker]
) -> None:
    assert parse(line) == want, where


def test_torchrun_rank_prefixes_keep_a_nodes_ranks_apart() -> None:
    assert source("[rank3]:Train Epoch: 1 [640/60000 (1%)]") == "3"
    assert source("[default0]:step 5") == "0"
    assert source("step 5") == ""


def test_the_jobs_own_regex_replaces_the_built_in_shapes() -> None:
    own = compile_own(r"done (?P<n>\d+) shards")
    assert parse("done 17 shards, step 3", own) == [M("own", 17.0)]
    assert parse("step 3", own) == []
    assert parse("batch 9 of 10", compile_own(r"batch (\d+) of")) == [M("own", 9.0)]


@pytest.mark.parametrize(
    ("text", "words"),
    [("step (", "not a valid regular expression"), (r"step \d+", "has no group for the count")],
)
def test_a_bad_own_regex_is_refused_with_its_reason(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=re.escape(words)):
        compile_own(text)


def test_a_batch_that_holds_a_marker_line_may_mark() -> None:
    """The judge passes over a batch whose joined lines lack every shape's word: no golden
    line with a marker is ever in such a batch, wherever it sits among plain lines."""
    noise = ["Loading weights", "L3:0000001 " + "x" * 40, ""]
    for where, line, want in GOLDEN:
        if want:
            assert may_mark("\n".join([*noise, line, *noise])), where
            assert may_mark(line), where
    assert not may_mark("\n".join(noise))
