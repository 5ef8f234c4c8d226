"""What log collection brought home, and what it did not: the run summary's lines and
``fleetctl collect``'s per-node lines."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.api.types import NodeCollect, NodeOutcome


def node_problem_lines(nodes: Sequence[NodeOutcome]) -> list[str]:
    """Nodes that said something went wrong besides the job (``disk full on <run dir>``):
    their console.log has gaps, fleetctl's streamed copy does not."""
    from fleetctl.api.helpers import STREAMED_CONSOLE

    lines = []
    for n in nodes:
        if n.problem:
            copy = f"{n.folder}/{STREAMED_CONSOLE}" if n.folder else STREAMED_CONSOLE
            lines.append(
                f"node {n.rank} ({n.host}): {n.problem}; its console.log misses output, "
                f"every line that streamed is in {copy}"
            )
    return lines


def collect_summary_lines(collected: Sequence[NodeCollect], job_id: str) -> list[str]:
    """Nothing when every node's logs are home whole; else who is missing what, and why.

    ``LOGS INCOMPLETE for node 2 (node3): log transfer from the node broke: …`` comes first:
    it means the run folder does not hold everything the job wrote. Files left on purpose
    (over the cap, excluded) follow, with how to fetch them.
    """
    from fleetctl.api.helpers import INCOMPLETE_REASONS, STREAMED_CONSOLE, not_collected_line

    lines: list[str] = []
    for c in collected:
        if c.incomplete:
            gaps = [f for f in c.not_collected if f["reason"] in INCOMPLETE_REASONS]
            why = (
                c.skipped
                or c.error
                or (
                    f"{gaps[0]['path']}: {gaps[0]['detail']}"
                    if gaps
                    else "some files did not arrive"
                )
            )
            copy = Path(c.folder) / STREAMED_CONSOLE
            if copy.is_file():
                why += f"; every line that streamed is in {copy}"
            lines.append(f"LOGS INCOMPLETE for node {c.rank} ({c.host}): {why}")
    over = False
    for c in collected:  # a console.log gap alone is said by its LOGS INCOMPLETE line
        if any(f["reason"] not in ("missing", "short") for f in c.not_collected):
            lines.append(f"node {c.rank} ({c.host}): {not_collected_line(c)}")
            over = over or any(f["reason"] == "over cap" for f in c.not_collected)
    if any(c.incomplete for c in collected):
        lines.append(f"`fleetctl collect {job_id}` fetches what is missing (nothing twice)")
    elif over:
        lines.append(
            f"`fleetctl collect {job_id} --collect-max SIZE` fetches the files over the cap"
        )
    return lines


def collect_lines(results: Sequence[NodeCollect]) -> list[str]:
    """``fleetctl collect``: one line per node, then what was not collected and why."""
    from fleetctl.api.helpers import format_size, not_collected_line

    lines = []
    for c in results:
        if c.skipped or c.error:
            what = c.skipped or c.error
        elif c.unreachable:  # its record stands: say so, and nothing was copied now
            why = c.unreachable.strip().splitlines()[0][:120] if c.unreachable.strip() else "?"
            what = (
                f"{len(c.files)} file(s) home, whole since the job ended; not reachable now ({why})"
            )
        else:
            what = f"{len(c.files)} file(s) home, {format_size(c.bytes)} copied now" + (
                f" ({c.attempts} attempts)" if c.attempts > 1 else ""
            )
        lines.append(f"  [{c.rank} {c.host}] {what}")
        if c.not_collected:
            lines.append(f"  [{c.rank} {c.host}] {not_collected_line(c)}")
    return lines
