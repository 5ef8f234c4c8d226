"""The report's plots as geometry: rectangles, ticks and labels in SVG user units, each
with its CSS class and tooltip. :func:`fleetctl.report.render._plot` writes them out as
inline ``<svg>``; nothing here builds markup, so every text is escaped there, once.

Pure and small on purpose: a 64-node job's timeline is a few hundred rectangles, its
collective matrix at most 64×64 cells, whatever the job printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from fleetctl.report.model import Collective, Lane, ProgressRow

WIDTH = 960  # the plot area, user units
LABEL = 150  # left margin for lane names
ROW = 16  # one lane's height
CELL_MAX = 24  # a heatmap cell at most this big


class Rect(NamedTuple):
    x: float
    y: float
    w: float
    h: float
    cls: str
    title: str


class Text(NamedTuple):
    x: float
    y: float
    text: str
    cls: str = ""
    anchor: str = "start"


@dataclass
class Plot:
    """One ``<svg>``: its size, rectangles (spans, cells), marks (thin rects) and texts."""

    width: float
    height: float
    rects: list[Rect] = field(default_factory=list)
    marks: list[Rect] = field(default_factory=list)
    texts: list[Text] = field(default_factory=list)
    label: str = ""  # aria-label


def _x(t: float, t0: float, t1: float) -> float:
    return LABEL + (t - t0) / (t1 - t0) * (WIDTH - LABEL)


def _clock(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def timeline(lanes: list[Lane], t0: float, t1: float) -> Plot:
    """One row per node and attempt: phase spans, the running stretch, teardown and
    collection; the first failure, stalls and slow-node verdicts as marks."""
    plot = Plot(WIDTH, 24 + ROW * len(lanes), label="timeline per node")
    for i, lane in enumerate(lanes):
        y = 20 + i * ROW
        name = f"#{lane.attempt} " if any(x.attempt > 1 for x in lanes) else ""
        name += f"{lane.rank} {lane.host}" + (" (spare)" if lane.spare else "")
        plot.texts.append(
            Text(LABEL - 4, y + ROW - 5, name, "lane" + (" bad" if lane.culprit else ""), "end")
        )
        for s in lane.spans:
            x0, x1 = _x(s.start, t0, t1), _x(s.end, t0, t1)
            title = (
                f"{lane.host}: {s.label}: {_clock(s.end - s.start)} from +{_clock(s.start - t0)}"
            )
            plot.rects.append(
                Rect(round(x0, 1), y + 2, round(max(x1 - x0, 1.0), 1), ROW - 4, s.kind, title)
            )
        for m in lane.marks:
            x = _x(m.at, t0, t1)
            plot.marks.append(
                Rect(
                    round(x - 1.5, 1),
                    y,
                    3,
                    ROW,
                    m.kind,
                    f"{lane.host}: {m.label} at +{_clock(m.at - t0)}",
                )
            )
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = LABEL + frac * (WIDTH - LABEL)
        anchor = "start" if frac == 0 else "end" if frac == 1 else "middle"
        plot.texts.append(Text(round(x, 1), 12, f"+{_clock(frac * (t1 - t0))}", "axis", anchor))
    return plot


def heatmap(coll: Collective) -> Plot:
    """The collective's per-link busbw as an N×N matrix (row: sender, column: receiver),
    coloured by its share of the median link; slow hosts' names marked."""
    n = max(len(coll.hosts), 1)
    cell = max(4, min(CELL_MAX, (WIDTH - LABEL) // n))
    plot = Plot(LABEL + cell * n + 4, LABEL // 2 + cell * n + 4, label="collective matrix")
    top = LABEL // 2
    index = {h: i for i, h in enumerate(coll.hosts)}
    slow = coll.slow
    for h, i in index.items():
        cls = "lane bad" if h in slow else "lane"
        plot.texts.append(Text(LABEL - 4, top + i * cell + cell * 0.7, h, cls, "end"))
        if cell >= 10:
            plot.texts.append(Text(LABEL + i * cell + cell / 2, top - 4, str(i), "axis", "middle"))
    for (src, dst), bw in coll.links.items():
        if src not in index or dst not in index:
            continue
        share = bw / coll.median if coll.median > 0 else 1.0
        level = "h0" if share < 0.5 else "h1" if share < 0.8 else "h2" if share < 1.1 else "h3"
        if coll.threshold and bw < coll.threshold:
            level += " low"
        x, y = LABEL + index[dst] * cell, top + index[src] * cell
        plot.rects.append(Rect(x, y, cell - 1, cell - 1, level, f"{src} → {dst}: {bw:.3g} GB/s"))
    return plot


def lanes(rows: list[ProgressRow], t0: float, t1: float) -> Plot:
    """Per rank: its node's run as a bar, shaded by its line rate (against the busiest
    rank's), and its node's last progress-file touch as a mark."""
    top = max((r.rate or 0.0 for r in rows), default=0.0) or 1.0
    plot = Plot(WIDTH, 8 + ROW * len(rows), label="progress lanes per rank")
    for i, r in enumerate(rows):
        y = 4 + i * ROW
        name = (f"#{r.attempt} " if r.attempt > 1 else "") + f"rank {r.rank} {r.host}"
        plot.texts.append(Text(LABEL - 4, y + ROW - 5, name, "lane", "end"))
        rate = r.rate
        if r.start is not None and r.end is not None:
            x0, x1 = _x(r.start, t0, t1), _x(r.end, t0, t1)
            share = (rate or 0.0) / top
            level = "p0" if share < 0.25 else "p1" if share < 0.6 else "p2"
            words = f"{r.lines} lines" + (f", {rate:.2g}/s" if rate is not None else "")
            plot.rects.append(
                Rect(
                    round(x0, 1),
                    y + 3,
                    round(max(x1 - x0, 1.0), 1),
                    ROW - 6,
                    level,
                    f"rank {r.rank}: {words}",
                )
            )
        if r.last_touch is not None and t0 <= r.last_touch <= t1:
            x = _x(r.last_touch, t0, t1)
            plot.marks.append(
                Rect(
                    round(x - 1, 1),
                    y,
                    2,
                    ROW,
                    "touch",
                    f"{r.host}: last progress touch at +{_clock(r.last_touch - t0)}",
                )
            )
    return plot
