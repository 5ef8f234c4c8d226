"""``--collective``: the benchmark's table (busbw per host, GB/s), slow links, hung hosts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

    from fleetctl.api.types import CollectiveReport

STACK_LINES = 40  # per hung host; the whole dump is in --json


def _gb(v: float | None) -> str:
    return "–" if v is None else f"{v:.3g}"


def print_collective(rep: CollectiveReport, console: Console) -> None:
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if not rep.order:
        console.print("[dim]collective: not run (fewer than 2 hosts passed the check)[/]")
        return
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True
    )
    for col in ("host", "busbw", "send", "recv", "all-reduce", "intra-node", "ib", ""):
        table.add_column(col, no_wrap=True)
    bad = set(rep.failed_hosts)
    for host in rep.order:
        n = rep.nodes.get(host) or {}
        ib = n.get("ib") or []
        ib_text = ", ".join(f"{p['state']} {p.get('rate') or '?'}" for p in ib) if ib else "–"
        mark = "[red]✗[/]" if host in bad else "[green]✓[/]"
        table.add_row(
            escape(host),
            _gb(n.get("busbw")),
            _gb(n.get("send")),
            _gb(n.get("recv")),
            _gb(n.get("allreduce_busbw")),
            _gb(n.get("intra_busbw")),
            escape(ib_text),
            mark,
        )
    ar = rep.allreduce
    head = (
        f"[bold]collective[/] (busbw GB/s; median link {rep.median:.3g}, threshold "
        f"{rep.threshold:.3g}"
    )
    if ar:
        mib, busbw = ar["bytes"] / (1 << 20), ar["busbw"]
        head += f"; all-reduce of {mib:g} MiB over {ar['ranks']} hosts: {busbw:.3g}"
    console.print(head + f"; {rep.elapsed:.1f} s):")
    console.print(table)
    for host, stacks in rep.hung.items():
        lines = stacks.splitlines()
        more = len(lines) - STACK_LINES
        console.print(f"[red]hung:[/] {escape(host)}")
        for line in lines[:STACK_LINES]:
            console.print(f"  [dim]{escape(line)}[/]")
        if more > 0:
            console.print(f"  [dim]… {more} more line(s) in --json[/]")
