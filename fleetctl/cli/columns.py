"""Column tables for listings with one row per node: ``fleetctl inventory``, ``run --dry-run``.

rich's ``Table`` measures, wraps, pads and crops every cell as a renderable of its own (about
70 µs a cell here): a 5,000-host inventory is 40,000 cells, seconds before the first line, and
a slower machine took 15 s. Here the column widths come from one pass over the cell strings
and each row is formatted once, as plain text (cells are never read as markup). The look is
rich's ``SIMPLE_HEAD`` box: header, rule, rows. On a narrow terminal the widest columns give
way first and a cell longer than its column folds onto more lines: nothing is cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rich.console import Console

PAD = 1  # spaces either side of a cell (rich's padding=(0, 1)); columns are also one apart
RULE = "─"


@dataclass(frozen=True)
class Column:
    """A column: its header and how its cells line up."""

    header: str
    justify: Literal["left", "right"] = "left"


def column_widths(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int
) -> list[int]:
    """Each column's width: its widest cell, then, when the table is wider than ``width``, the
    widest columns narrowed first, never below their header (or 4 cells)."""
    from rich.cells import cell_len

    widths = [cell_len(c.header) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            n = len(cell) if cell.isascii() else cell_len(cell)
            if n > widths[i]:
                widths[i] = n
    room = width - _frame(len(columns))
    if sum(widths) <= room:
        return widths
    floors = [min(w, max(cell_len(c.header), 4)) for c, w in zip(columns, widths, strict=True)]
    lo, hi = 0, max(widths)  # the largest cap at which capped widths fit: binary search
    while lo < hi:
        cap = (lo + hi + 1) // 2
        if sum(max(f, min(w, cap)) for f, w in zip(floors, widths, strict=True)) <= room:
            lo = cap
        else:
            hi = cap - 1
    return [max(f, min(w, lo)) for f, w in zip(floors, widths, strict=True)]


def table_lines(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int
) -> tuple[str, str, list[str]]:
    """(header line, rule line, row lines) laid out to fit ``width`` terminal cells."""
    widths = column_widths(columns, rows, width)
    header = _line([c.header for c in columns], columns, widths)
    rule = " " + RULE * (sum(widths) + _frame(len(columns)) - 2)
    out: list[str] = []
    for row in rows:
        out.extend(_row_lines(row, columns, widths))
    return header, rule, out


def print_table(
    console: Console,
    columns: Sequence[Column],
    rows: Sequence[Sequence[str]],
    *,
    title: str | None = None,
) -> None:
    """Print the table on ``console``: optional title, bold header, rule, rows."""
    from rich.text import Text

    header, rule, lines = table_lines(columns, rows, console.width)
    if title is not None:
        console.print(Text(title, style="italic"), soft_wrap=True)
    console.print(Text(header, style="bold"), soft_wrap=True)
    console.print(Text(rule), soft_wrap=True)
    if lines:  # one Text for every row: rich renders it as a single block
        console.print(Text("\n".join(lines)), soft_wrap=True)


def _frame(ncols: int) -> int:
    """Cells a row spends outside its cells: edges, padding, one space between columns."""
    return 2 + 2 * PAD * ncols + (ncols - 1)


def _row_lines(row: Sequence[str], columns: Sequence[Column], widths: list[int]) -> list[str]:
    if all(len(c) <= w and c.isascii() for c, w in zip(row, widths, strict=True)):
        return [_line(row, columns, widths)]  # the common case: one line, nothing to fold
    from rich.cells import chop_cells

    parts = [chop_cells(c, w) if c else [""] for c, w in zip(row, widths, strict=True)]
    height = max(len(p) for p in parts)
    return [
        _line([p[k] if k < len(p) else "" for p in parts], columns, widths) for k in range(height)
    ]


def _line(cells: Sequence[str], columns: Sequence[Column], widths: list[int]) -> str:
    from rich.cells import cell_len

    out = []
    for cell, col, w in zip(cells, columns, widths, strict=True):
        fill = " " * (w - (len(cell) if cell.isascii() else cell_len(cell)))
        out.append(fill + cell if col.justify == "right" else cell + fill)
    pad = " " * PAD
    return (" " + pad + (pad + " " + pad).join(out)).rstrip()
