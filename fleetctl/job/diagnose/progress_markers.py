"""Progress markers in a rank's output lines: how far a training script says it has come.

The shapes are those real training scripts print with no help from us (the golden table,
``tests/pure/test_progress_markers.py``, cites where each comes from): pytorch/examples
mnist's ``Train Epoch: 1 [640/60000 (1%)]``, tqdm's bars (``370/1000 [00:12<00:21,
30.1it/s]``), Hugging Face Trainer's logged dicts (``{'loss': 0.69, …, 'epoch': 0.12}``) and
``global_step``, PaddlePaddle's ``epoch: 0, batch_id: 20`` / ``[Epoch 0, batch 20]``, and a
plain ``step N`` / ``iter N`` / ``iteration N``. A job's own regex (``run
--progress-regex``) replaces them all. Pure: no clock, no I/O; the rate judge
(``progress_rate.py``) turns the markers into rates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A shape's name, in order of preference when one node's lines hold several: the more
# specific shape says more (a Trainer run prints its dicts and tqdm bars; the dicts' epoch is
# the job's, the bars are also evaluation's).
KINDS = ("own", "mnist", "epoch_batch", "global_step", "epoch", "tqdm", "step", "iter")
UNITS = {
    "own": "progress",
    "mnist": "samples",
    "epoch_batch": "batches",
    "global_step": "steps",
    "epoch": "epochs",
    "tqdm": "it",
    "step": "steps",
    "iter": "iterations",
}

_MNIST = re.compile(r"Train Epoch: *(\d+) *\[(\d+)/(\d+)")
_EPOCH_BATCH = re.compile(
    r"\b(?:epoch|pass)[\s:=]*(\d+)\s*,\s*(?:batch|batch_id|batch_idx|step)[\s:=]*(\d+)",
    re.IGNORECASE,
)
_GLOBAL_STEP = re.compile(r"\bglobal_step\b['\"]?\s*[:=]\s*(\d+)")
_HF_EPOCH = re.compile(r"\A\s*\{.*'epoch': *([0-9]+(?:\.[0-9]+)?)")
# n/total [elapsed<remaining, rate] or n<unit> [elapsed, rate] (no total)
_TQDM = re.compile(r"(?:(\d+)/\d+ \[[\d:]+<|(\d+)it \[[\d:]+, )")
_STEP = re.compile(r"\b(step|iter|iteration)\b\s*[:=#]?\s*(\d+)", re.IGNORECASE)
# one of these (lower-cased) is in every line a shape above can match: a line with none, most
# of a log, is passed over by substring tests, not seven regex scans
_HINTS = ("epoch", "pass", "step", "iter", "/", "it [")
# torchrun's per-rank prefixes (``[rank3]:``, ``[default0]:``): a node's ranks kept apart
_PREFIX = re.compile(r"\A\[(?:rank|default)?(\d+)\]:")


@dataclass(frozen=True)
class Marker:
    """One progress figure. ``value``: the count the line states (within its ``epoch`` when
    the shape restarts it each epoch: mnist's samples, Paddle's batches)."""

    kind: str
    value: float
    epoch: float | None = None


def source(line: str) -> str:
    """Which rank of a node said it: torchrun's prefix, or "" (one stream)."""
    m = _PREFIX.match(line)
    return m.group(1) if m else ""


def may_mark(text: str) -> bool:
    """Whether ``text`` — a line, or lines joined by newlines — may hold a marker of the
    shapes above: it has one of their words. No word spans a newline, so a batch that has
    none is passed over whole by a few C-level substring tests."""
    low = text.lower()
    return any(h in low for h in _HINTS)


def parse(line: str, own: re.Pattern[str] | None = None) -> list[Marker]:
    """Every marker of a line, one per shape at most (the last of a tqdm line's ``\\r``
    updates). ``own``: the job's regex, whose group ``n`` (or first group) is the count;
    given, it is the only shape."""
    if own is not None:
        got = own.search(line)
        if got is None:
            return []
        text = got.group("n") if "n" in own.groupindex else got.group(1)
        num = _number(text)
        return [] if num is None else [Marker("own", num)]
    if not may_mark(line):
        return []
    out: list[Marker] = []
    m = _MNIST.search(line)
    if m:
        out.append(Marker("mnist", float(m.group(2)), float(m.group(1))))
    m = _EPOCH_BATCH.search(line)
    if m and not out:
        out.append(Marker("epoch_batch", float(m.group(2)), float(m.group(1))))
    m = _GLOBAL_STEP.search(line)
    if m:
        out.append(Marker("global_step", float(m.group(1))))
    m = _HF_EPOCH.search(line)
    if m:
        out.append(Marker("epoch", float(m.group(1))))
    bars = list(_TQDM.finditer(line))
    if bars:
        last = bars[-1]
        out.append(Marker("tqdm", float(last.group(1) or last.group(2))))
    if not out or all(k.kind == "tqdm" for k in out):
        for m in _STEP.finditer(line):
            kind = "step" if m.group(1).lower() == "step" else "iter"
            if all(k.kind != kind for k in out):
                out.append(Marker(kind, float(m.group(2))))
    return out


def _number(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def compile_own(text: str) -> re.Pattern[str]:
    """The job's regex (``--progress-regex``), checked: it compiles and has a group for the
    count (``(?P<n>…)`` or its first group). ``ValueError`` with the reason, else."""
    try:
        pattern = re.compile(text)
    except re.error as e:
        raise ValueError(f"{text!r} is not a valid regular expression: {e}") from None
    if pattern.groups < 1:
        raise ValueError(f"{text!r} has no group for the count: write (\\d+) or (?P<n>\\d+)")
    return pattern
