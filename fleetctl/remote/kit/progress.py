"""Progress markers in a rank's output lines: how far a training script says it has come.

The shapes are those real training scripts print with no help from us (the golden table,
``tests/pure/test_progress_markers.py``, cites where each comes from): pytorch/examples
mnist's ``Train Epoch: 1 [640/60000 (1%)]``, tqdm's bars (``370/1000 [00:12<00:21,
30.1it/s]``), Hugging Face Trainer's logged dicts (``{'loss': 0.69, …, 'epoch': 0.12}``) and
``global_step``, PaddlePaddle's ``epoch: 0, batch_id: 20`` / ``[Epoch 0, batch 20]``, and a
plain ``step N`` / ``iter N`` / ``iteration N``. A job's own regex (``run
--progress-regex``) replaces them all. Pure: no clock, no I/O; the rate judge
(``fleetctl/job/diagnose/progress_rate.py``) turns the markers into rates.

Node module: stdlib only, Python >= 3.8. One parser for both sides: the controller reads an
attached run's streamed lines with it, a detached job's supervisor its own lines
(:class:`Tally`, reported in pace.json for the job's monitor).
"""

from __future__ import annotations

import collections
import re
import time
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
# tqdm's bar: n/total [elapsed<remaining, rate] or n<unit> [elapsed, rate] (no total); with
# unit_scale the counts are 1.20k, 4.50M; the rate is <n><unit>/s, ?<unit>/s or <n>s/<unit>.
# Found by its bracket (a literal " [" the scan skips to), then its count read just before it.
_BAR = re.compile(
    r" \[\d+:\d\d(?::\d\d)?(<[\d:?]+)?"  # [elapsed<remaining
    r"(?:, *(?:(?:[\d.]+|\?)[kMGTPEZY]?([A-Za-z]+)/s|[\d.]+s/([A-Za-z]+)))?"  # , rate
)
_BAR_COUNT = re.compile(r"(\d+(?:\.\d+)?)([kMGTPEZY]?)(?:/\d+(?:\.\d+)?[kMGTPEZY]?|([A-Za-z]+))\Z")
_SCALE = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "Z": 1e21}
_SCALE["Y"] = 1e24
# a bar counting bytes (unit "B", or "iB" for MiB/s) is a download or a copy, not training
_BYTES = ("B", "iB", "bytes")
_STEP = re.compile(r"\b(step|iter|iteration)\b\s*[:=#]?\s*(\d+)", re.IGNORECASE)
# one of these (lower-cased) is in every line a shape above can match: a line with none, most
# of a log, is passed over by substring tests, not seven regex scans
_HINTS = ("epoch", "pass", "step", "iter", "/", "it [")
_BYTE_HINTS = tuple(h.encode() for h in _HINTS)
RESTART = 0.5  # a count below this share of the last one starts over (a new tqdm bar)
RING = 64  # a detached supervisor's lines kept between reports: the newest (the judge's SCAN)
MAX_SERIES = 64  # (rank, shape) counts a node reports, at most
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
    bar = _tqdm(line)
    if bar is not None:
        out.append(bar)
    if not out or all(k.kind == "tqdm" for k in out):
        for m in _STEP.finditer(line):
            kind = "step" if m.group(1).lower() == "step" else "iter"
            if all(k.kind != kind for k in out):
                out.append(Marker(kind, float(m.group(2))))
    return out


def _tqdm(line: str) -> Marker | None:
    """The count of a line's last tqdm bar (of its \\r updates), None without one or when it
    counts bytes (a download is no training progress)."""
    bars = list(_BAR.finditer(line))
    if not bars:
        return None
    m = bars[-1]  # a bar's \\r updates in one line: the newest is the last
    remaining, rate_unit = m.group(1), m.group(2) or m.group(3)
    c = _BAR_COUNT.search(line, max(0, m.start() - 32), m.start())
    if c is None:
        return None
    own_unit = c.group(3)
    if (own_unit is None and remaining is None) or (own_unit and rate_unit is None):
        return None  # n/total wants its remaining time, n<unit> its rate: not a bar
    if (rate_unit or own_unit or "it") in _BYTES:
        return None
    return Marker("tqdm", float(c.group(1)) * _SCALE[c.group(2)])


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


class Count:
    """One rank's markers of one shape as a count that only grows: an epoch's restart of
    mnist's samples or Paddle's batches, or a new tqdm bar, carries the count on."""

    def __init__(self) -> None:
        self.offset, self.last = 0.0, 0.0
        self.epoch: float | None = None
        self.seen = False

    def add(self, m: Marker) -> float | None:
        """The count with ``m``; None when ``m`` goes back (a lagging rank's line,
        interleaved: not progress)."""
        if m.epoch is not None and self.epoch is not None and m.epoch != self.epoch:
            if m.epoch < self.epoch:
                return None
            self.offset += self.last
        elif m.epoch is None and self.seen and m.value < self.last * RESTART:
            self.offset += self.last
        elif m.value < self.last:
            return None
        self.last, self.epoch, self.seen = m.value, m.epoch, True
        return self.offset + m.value


class Tally:
    """A detached job's markers, counted by its supervisor (no controller reads its lines):
    each line it writes that may hold one (substring tests, about a microsecond) is kept with
    its time, the newest ``RING``; each pace report parses them (at most ``RING`` regex
    scans per report, whatever the line rate) into one count per rank and shape, reported
    with the time of the line that said it. Lines come from the output threads, reports from
    the pace thread: a deque's append and popleft are atomic."""

    def __init__(self, own: str | None = None, clock=time.time) -> None:
        self.own = None
        if own:
            try:
                self.own = compile_own(own)
            except ValueError:  # checked by the controller; another Python's re may differ
                self.own = None
        self.ring: collections.deque = collections.deque(maxlen=RING)
        self.counts: dict = {}  # (source, kind) -> [Count, time, count]
        self.clock = clock

    def line(self, text: bytes) -> None:
        if self.own is None:
            low = text.lower()
            if not any(h in low for h in _BYTE_HINTS):
                return
        self.ring.append((self.clock(), text))

    def report(self) -> list:
        """``[[source, kind, time, count], …]``: every count so far (none: [])."""
        while self.ring:
            t, raw = self.ring.popleft()
            text = raw.decode("utf-8", "replace")
            for m in parse(text, self.own):
                key = (source(text), m.kind)
                got = self.counts.get(key)
                if got is None:
                    if len(self.counts) >= MAX_SERIES:
                        continue
                    got = self.counts[key] = [Count(), t, 0.0]
                value = got[0].add(m)
                if value is not None:
                    got[1], got[2] = round(t, 3), value
        return [[k[0], k[1], v[1], v[2]] for k, v in sorted(self.counts.items()) if v[0].seen]
