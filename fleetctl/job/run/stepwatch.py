"""``run --elastic``: the common mistake of an elastic script, seen in its output — a spare
whose ranks start from step (or epoch) 0 while the others resumed from a checkpoint.

Where the job prints its step (``step=41``, ``Step 41/1000``, ``epoch: 3``, ``iter 120``,
``global_step=41``), each node slot's latest value is kept per word (a step is compared with a
step, an epoch with an epoch). The first such line of a spare decides, once: a value of 0 or 1
(0- or 1-based counting) while another slot's latest is at least 2 further means the spare
started afresh (its script did not load the newest checkpoint on start). A job that prints no
step says nothing. Pure: fed lines, returns what to say.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "step"/"epoch"/"iter"/"iteration" as a word of its own (``global_step`` counts: ``_`` is no
# letter; ``steps``/``max_steps`` do not), then an optional ``=``/``:``/``#`` and the number
STEP = re.compile(r"(?<![A-Za-z])(step|epoch|iteration|iter)(?![A-Za-z])\s*[:=#]?\s*(\d+)", re.I)
DOC = "docs/commands/run.md, Elastic jobs"


def steps(line: str) -> dict[str, int]:
    """The step-like numbers a line prints, by word (the first of each): ``{"step": 41}``."""
    out: dict[str, int] = {}
    for m in STEP.finditer(line):
        word = m.group(1).lower()
        out.setdefault("iter" if word.startswith("iter") else word, int(m.group(2)))
    return out


@dataclass(frozen=True)
class FreshStart:
    """A spare that started at ``value`` while the others were at ``others``."""

    rank: int
    spare: str
    word: str
    value: int
    others: int

    def line(self) -> str:
        return (
            f"{self.spare} (spare) started at {self.word} {self.value} while the others are at "
            f"{self.word} {self.others}: does the script load the newest checkpoint on every "
            f"start? see {DOC}"
        )


class StepWatch:
    """Each slot's latest step-like values, and the spares whose first step is still to come."""

    def __init__(self) -> None:
        self.latest: dict[int, dict[str, int]] = {}
        self.waiting: dict[int, str] = {}  # slot -> the spare that took it, before its first step

    def spare(self, rank: int, name: str) -> None:
        """Spare ``name`` took slot ``rank``: the lost node's values go, the spare's first
        step is watched."""
        self.latest.pop(rank, None)
        self.waiting[rank] = name

    def gone(self, rank: int) -> None:
        """Slot ``rank`` left the job (``--min-nodes``): its values speak for nobody."""
        self.latest.pop(rank, None)
        self.waiting.pop(rank, None)

    def lines(self, rank: int, lines: tuple[str, ...] | list[str]) -> FreshStart | None:
        """Slot ``rank`` printed ``lines``: a FreshStart the first time a spare's first step
        shows it started afresh, else None."""
        out = None
        for line in lines:
            found = steps(line)
            if not found:
                continue
            name = self.waiting.pop(rank, None)
            if name is not None and out is None:
                out = self._judge(rank, name, found)
            self.latest.setdefault(rank, {}).update(found)
        return out

    def _judge(self, rank: int, name: str, found: dict[str, int]) -> FreshStart | None:
        for word, value in found.items():
            others = [v[word] for r, v in self.latest.items() if r != rank and word in v]
            if value <= 1 and others and max(others) >= value + 2:
                return FreshStart(rank, name, word, value, max(others))
        return None
