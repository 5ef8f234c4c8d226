"""The console for data on stdout: a terminal's width, or no width at all for a pipe."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 4096  # a pipe or file has no width: nothing is cut, folded or compacted


def stdout_console() -> Console:
    """A console for stdout that cuts nothing when stdout is not a terminal.

    rich assumes 80 columns for a pipe or file (unless ``COLUMNS`` says otherwise), which cut
    ``fleetctl check > report.txt`` and ``| less`` tables; a terminal keeps its own width.
    """
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPE_WIDTH)
