"""All terminal output helpers (rich). Library code never prints; the CLI calls these.

Shared by every area: add functions with small edits, keep imports of heavy modules inside them.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from fleetctl.api.types import (
        CheckReport,
        Inventory,
        JobEvent,
        JobResult,
        Plan,
        SpawnedMonitor,
        StackGroup,
    )
    from fleetctl.cli.columns import Column


# ------------------------------------------------------------------------------------ check

_CHECK_STYLE = {
    "ok": ("✓", "green"),
    "warn": ("!", "yellow"),
    "fail": ("✗", "bold red"),
    "skip": ("–", "dim"),
}


def check_cell(status: str, detail: str, *, width: int = 28) -> str:
    """One table cell as rich markup: symbol + reason; ok details are clipped, failures not."""
    from rich.markup import escape

    symbol, style = _CHECK_STYLE.get(status, ("?", "magenta"))
    if status in ("ok", "skip") and len(detail) > width:
        detail = detail[: width - 1] + "…"
    text = f"{symbol} {escape(detail)}" if detail else symbol
    return f"[{style}]{text}[/]"


def print_check_report(report: CheckReport, console: Console | None = None) -> None:
    """``fleetctl check``: the host × check table, then mesh failures, warnings, the verdict."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from fleetctl.api.helpers import CHECKS
    from fleetctl.cli.console import stdout_console

    console = console or stdout_console()
    # Narrow terminals get symbols only (+ the training address); reasons follow the table.
    compact = console.width < 160
    table = Table(
        box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), collapse_padding=True
    )
    width = max([4, *(len(h) for h in report.hosts)])
    table.add_column("host", style="bold", no_wrap=True, min_width=width)
    for name in CHECKS:
        table.add_column(name, overflow="fold", no_wrap=compact, min_width=len(name))
    if compact:
        table.add_column("training NIC", overflow="fold", min_width=20)
    for host in report.hosts.values():
        cells = [
            check_cell(c.status, "" if compact else c.detail)
            for c in (host.checks[k] for k in CHECKS)
        ]
        if compact:
            facts = report.facts.get(host.name)
            nic = f"{facts.nic} {facts.train_addr}" if facts and facts.train_addr else "–"
            cells.append(escape(nic))
        table.add_row(escape(host.name), *cells)
    console.print(table)
    if report.mesh_failures:
        console.print("[bold]mesh failures[/] (training network, source → destination):")
        for f in report.mesh_failures:
            console.print(f"  [red]✗[/] {escape(str(f))}")
    if report.collective is not None:
        from fleetctl.cli.render_collective import print_collective

        print_collective(report.collective, console)
    if report.mesh_skipped:
        console.print(
            "[dim]not in the mesh test: " + escape("; ".join(report.mesh_skipped)) + "[/]"
        )
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    for name, check, reason in report.failures:
        console.print(f"[red]✗[/] {escape(name)} {check}: {escape(reason)}")
    when = (
        f" (cached result, {max(0, int(_now() - report.checked_at))} s old)"
        if report.cached
        else f" in {report.elapsed:.1f} s"
    )
    verdict = "[bold green]OK[/]" if report.ok else "[bold red]FAILED[/]"
    console.print(f"{verdict}: {escape(report.summary())}{when}")


def _now() -> float:
    import time

    return time.time()


# -------------------------------------------------------------------------------------- run

_NODE_COLOURS = (36, 33, 35, 32, 34, 91, 96, 93, 95, 92, 94, 31)  # ANSI foreground codes


def stack_lines(groups: Sequence[StackGroup]) -> list[str]:
    """``ranks 0,2-5: wait (distributed_c10d.py:3041)`` per group of a hung job's stacks."""
    lines = []
    for g in groups:
        if g.ranks:
            who, numbers = "rank", list(g.ranks)
        else:
            who, numbers = "launcher on node", list(g.launcher_nodes)
        plural = "s" if len(numbers) > 1 else ""
        lines.append(f"{who}{plural} {fold_ranks(numbers)}: {g.frame}")
    return lines


def fold_ranks(ranks: list[int]) -> str:
    """``[0, 1, 3, 4, 5, 7]`` -> ``0,1,3-5,7`` (runs of three or more become ranges)."""
    out: list[str] = []
    rs = sorted(set(ranks))
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        if j - i >= 2:
            out.append(f"{rs[i]}-{rs[j]}")
        else:
            out.extend(str(r) for r in rs[i : j + 1])
        i = j + 1
    return ",".join(out)


# Escape sequences a job may print: CSI (ESC [ … final byte), OSC (ESC ] … BEL or ST), DCS/SOS/
# PM/APC strings (ESC P/X/^/_ … ST), and two-byte ESC sequences. Only colours (SGR: CSI … m) are
# harmless on the operator's terminal; OSC can set the title or write the clipboard.
_ESC_SEQ = re.compile(
    r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[PX^_][^\x1b]*(?:\x1b\\)?|[ -~]?)"
)
_SGR = re.compile(r"\x1b\[[0-9;:]*m\Z")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_BYTES = bytes([*range(0x09), *range(0x0B, 0x20), 0x7F])  # _CONTROL's ASCII part


def _no_controls(text: str) -> bool:
    """Whether ``text`` holds none of ``_CONTROL`` (so :func:`terminal_safe` leaves each of
    its lines as it is). ASCII text is tested by bytes.translate, ~20x the regex's speed."""
    if text.isascii():
        raw = text.encode("ascii")
        return len(raw.translate(None, _CONTROL_BYTES)) == len(raw)
    return _CONTROL.search(text) is None


def terminal_safe(line: str) -> str:
    """A job's output line as it may reach the operator's terminal: colours kept, every other
    escape sequence and control character shown escaped (``\\x1b]0;title\\x07``), and of a
    carriage-return-overwritten line (progress bars) only what a terminal would show last.
    The node's console.log keeps the bytes as they were."""
    if "\r" in line:
        parts = [p for p in line.split("\r") if p]
        line = parts[-1] if parts else ""
    out: list[str] = []
    pos = 0
    for m in _ESC_SEQ.finditer(line):
        out.append(_escape_controls(line[pos : m.start()]))
        seq = m.group(0)
        out.append(seq if _SGR.match(seq) else _escape_controls(seq))
        pos = m.end()
    out.append(_escape_controls(line[pos:]))
    return "".join(out)


def _escape_controls(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}", text)


_RANK_TAG = re.compile(r"\[rank (\d+)\] ")


class LiveLog:
    """``fleetctl run``'s live output: job lines on stdout as ``[rank host] text``, one whole
    line per write (never interleaved), coloured per node on a tty; everything else on stderr.

    ``tail``: ``all`` (every node), a rank (only that node, like paddle's rank-0 console) or
    ``none`` (no job lines; the summary still shows the failing node's last lines).
    """

    def __init__(
        self,
        *,
        tail: str = "all",
        colour: bool | None = None,
        out: Any = None,
        err: Any = None,
        raw: bool = False,
    ) -> None:
        import sys

        self.raw = raw  # --raw-output: the job's bytes, control sequences and all
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.tail = tail
        self.colour = self.out.isatty() if colour is None else colour
        self.err_colour = self.err.isatty() if colour is None else colour

    def _prefix(self, rank: int | None, host: str | None, colour: bool) -> str:
        """``[rank host]``: the node's rank for its launcher's lines, the global rank for a
        rank's own (``[rank G] …`` from the supervisor's per-rank tail)."""
        if rank is None:
            return ""
        text = f"[{rank} {host}]"
        if colour:
            code = _NODE_COLOURS[rank % len(_NODE_COLOURS)]
            text = f"\x1b[{code}m{text}\x1b[0m"
        return text + " "

    def shows(self, rank: int | None) -> bool:
        if self.tail == "none":
            return False
        return self.tail == "all" or rank is None or str(rank) == self.tail

    def job_lines(self, ev: JobEvent) -> str:
        """A ``line``/``lines`` event as the text written: each line made terminal-safe (unless
        raw) after its prefix, a rank's own ``[rank G]`` line with its global rank.

        A batch with no control character and no rank tag (most of a log flood) is made by
        C-level joins alone: ``terminal_safe`` would return each line as it is, and the
        per-line work cost ~4 µs a line (3 s of the log bench's controller CPU)."""
        lines = ev.lines if ev.kind == "lines" else (ev.text,)
        joined = "\n".join(lines)
        safe = self.raw or _no_controls(joined)
        mine = self._prefix(ev.rank, ev.host, self.colour)
        if safe and "[rank " not in joined:
            return mine + ("\n" + mine).join(lines) + "\n"
        if not safe:
            lines = tuple(terminal_safe(line) for line in lines)
        theirs: dict[str, str] = {}  # a rank's own line: its global rank leads
        out = []
        for line in lines:
            m = _RANK_TAG.match(line) if line.startswith("[rank ") else None
            if m is None:
                out.append(mine + line)
                continue
            tag = m.group(1)
            if tag not in theirs:
                theirs[tag] = self._prefix(int(tag), ev.host, self.colour)
            out.append(theirs[tag] + line[m.end() :])
        return "\n".join(out) + "\n"

    def __call__(self, ev: JobEvent) -> None:
        if ev.kind in ("line", "lines"):
            if self.shows(ev.rank):
                # one write and one flush per batch: whole lines, never interleaved
                self.out.write(self.job_lines(ev))
                self.out.flush()
            return
        if ev.kind in ("started",) and not ev.text:
            return
        label = {
            "phase": "",
            "teardown": "teardown: ",
            "warning": "warning: ",
            "failure": "FAILED FIRST: ",
            "lost": "lost: ",
            "exit": "exited: ",
            "collect": "",
            "notice": "",
            "started": "",
            "done": "job ",
        }.get(ev.kind, "")
        if ev.kind == "exit" and ev.code == 0:
            label = "finished: "
        line = f"fleetctl: {self._prefix(ev.rank, ev.host, self.err_colour)}{label}{ev.text}"
        self.err.write(line.rstrip() + "\n")
        self.err.flush()


def detached_lines(
    result: JobResult, monitor: SpawnedMonitor | None, *, monitor_wanted: bool
) -> list[str]:
    """What to tell the user about a job left running detached, and who watches it."""
    jid = result.job_id
    lines = [
        f"fleetctl: job {jid} detached on {len(result.nodes)} node(s); follow with "
        f"`fleetctl logs -f {jid}`, end with `fleetctl stop {jid}`"
    ]
    if not monitor_wanted:
        lines.append(
            "fleetctl: no monitor (--no-monitor): a failure is not acted on; "
            f"`fleetctl collect {jid}` brings the logs home"
        )
    elif monitor is not None and monitor.registered:
        lines.append(
            f"fleetctl: watched by monitor pid {monitor.pid}: on the first failure it stops "
            f"the job everywhere; logs come home when it ends (monitor log: {monitor.log})"
        )
    elif monitor is not None:
        why = "exited" if monitor.exit_code is not None else "did not report in time"
        lines.append(
            f"fleetctl: warning: the job monitor (pid {monitor.pid}) {why}; see {monitor.log}. "
            f"The job runs unwatched: `fleetctl monitor {jid}` retries"
        )
    return lines


# ------------------------------------------------------------------------------------- push


class PushProgress:
    """``fleetctl push``: one live progress bar per node (stderr), fed by push's callback.

    Thread-safe (rich's Progress is); a no-op display when ``enabled`` is False (not a tty),
    which does not even import rich (~40 ms before the first connection otherwise).
    """

    def __init__(self, nodes: list[str], *, enabled: bool, console: Console | None = None) -> None:
        self.enabled = enabled
        self.progress: Any = None
        self.tasks: dict[str, Any] = {}
        if not enabled:
            return
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("{task.fields[node]:<12}"),
            TextColumn("{task.description:<9}"),
            BarColumn(),
            TextColumn("{task.fields[size]:>21}"),
            TextColumn("{task.fields[note]}"),
            console=console or Console(stderr=True),
            transient=False,
        )
        self.tasks = {
            n: self.progress.add_task("waiting", node=n, note="", size="", total=None)
            for n in nodes
        }

    def __call__(self, event: Any) -> None:
        from fleetctl.api.helpers import human_bytes

        task = self.tasks.get(event.node)
        if task is None:
            return
        if event.stage == "done":
            self.progress.update(
                task,
                description="[green]done[/]",
                completed=1,
                total=1,
                size="",
                note=event.message,
            )
        elif event.stage == "failed":
            self.progress.update(
                task,
                description="[red]failed[/]",
                completed=0,
                total=1,
                size="",
                note=event.message[:70],
            )
        elif event.total:
            size = f"{human_bytes(event.done)}/{human_bytes(event.total)}"
            self.progress.update(
                task,
                description=event.stage,
                completed=event.done,
                total=event.total,
                size=size,
                note=event.message,
            )
        else:
            self.progress.update(
                task, description=event.stage, total=None, size="", note=event.message
            )

    def __enter__(self) -> PushProgress:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()


def print_push_report(
    report: Any, failures: dict[str, str] | None = None, console: Console | None = None
) -> None:
    """``fleetctl push``: per-node table (code, env, NCCL, bytes), warnings, failures."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from fleetctl.api.helpers import human_bytes

    console = console or Console()
    table = Table(box=box.SIMPLE, show_header=True, header_style="bold")
    for col in ("node", "code", "env", "NCCL", "python", "sent", "time"):
        table.add_column(col)
    for name, n in report.nodes.items():
        env = n.env_method or "–"
        if n.env_source:
            env += f" ← {n.env_source}"
        table.add_row(
            name,
            n.code_method or "–",
            env,
            n.nccl_version or "–",
            n.python_version or "–",
            human_bytes(n.bytes_sent),
            f"{n.seconds:.1f}s",
        )
    for name in failures or {}:
        table.add_row(name, "[bold red]✗[/]", "", "", "", "", "", style="red")
    console.print(table)
    if report.code_dir:
        console.print(f"code: ~workdir/{report.code_dir}")
    shas = sorted(set(report.env_sha256.values()))
    if shas:
        console.print("env: " + ", ".join(f"envs/{s[:16]}…" for s in shas))
    line = f"controller sent {human_bytes(report.controller_bytes)}"
    if report.archive_bytes:
        line += f" (archive {human_bytes(report.archive_bytes)}"
        line += f", {report.peer_fetches} peer fetches)" if report.peer_fetches else ")"
    console.print(line + f" in {report.seconds:.1f}s")
    for w in report.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    for why in (failures or {}).values():
        console.print(f"[bold red]✗[/] {escape(why)}")


# ------------------------------------------------------------------------------------- plan


def print_plan(plan: Plan, *, inventory: str | None = None, console: Console | None = None) -> None:
    """``fleetctl run --dry-run``: the plan-wide values, one row per node, each node's command.

    Commands are shown shell-quoted (``shlex.join``) exactly as they would run, except that an
    argument that is long and the same on every node (paddle's ``--ips=…``) is shown once above
    them and as ``‹argv N›`` in each (``--json`` writes it once under ``shared`` the same way);
    the env shown is node 0's fleetctl/user part (every node's full env is in ``--json``).
    """
    import shlex

    from rich.markup import escape
    from rich.text import Text

    from fleetctl.api.helpers import shared_positions
    from fleetctl.cli.columns import Column, print_table
    from fleetctl.cli.console import stdout_console

    console = console or stdout_console()
    where = inventory or "this machine (no inventory)"
    console.print(
        f"[bold]job[/] {escape(plan.job_id)}  [bold]launcher[/] {plan.launcher}  "
        f"[bold]master[/] {escape(plan.master_addr)}:{plan.rdzv_port}  "
        f"[bold]world[/] {plan.nnodes} node(s) x {plan.procs} = {plan.world_size}  "
        f"[dim]({escape(where)})[/]"
    )
    columns = [Column(c) for c in ("host", "ssh address", "training address", "nic", "run folder")]
    rows = [
        [str(n.node_rank), n.host, n.address, n.train_addr, n.nic or "–", n.run_dir]
        for n in plan.nodes
    ]
    print_table(console, [Column("rank", "right"), *columns], rows)
    shared = shared_positions([n.argv for n in plan.nodes])
    for i in shared:
        what = shlex.quote(plan.nodes[0].argv[i])
        console.print(Text(f"‹argv {i}› on every node: {what}", style="dim"), soft_wrap=True)
    files = {tuple(n.files) for n in plan.nodes}
    same_files = len(plan.nodes) > 1 and len(files) == 1
    lines: list[Text] = []
    for n in plan.nodes:
        words = [f"‹argv {i}›" if i in shared else shlex.quote(a) for i, a in enumerate(n.argv)]
        lines.append(Text.assemble((f"[{n.node_rank} {n.host}]", "bold"), " $ ", " ".join(words)))
        if not same_files:
            lines += [Text(f"    writes {rel} in the run folder", style="dim") for rel in n.files]
    if lines:
        console.print(Text("\n").join(lines), soft_wrap=True)
    if same_files and plan.nodes[0].files:
        names = ", ".join(plan.nodes[0].files)
        console.print(Text(f"every node writes {names} in its run folder", style="dim"))
    if plan.nodes:
        first = plan.nodes[0]
        keys = [k for k in first.env if k.startswith(("MASTER_", "FLEET_JOB", "NCCL_", "GLOO_"))]
        keys += [k for k in plan.user_env if k not in keys]
        shown = " ".join(f"{k}={shlex.quote(first.env[k])}" for k in keys)
        console.print(f"env (node 0): {escape(shown)}", soft_wrap=True)
    console.print("[dim]dry run: nothing was started[/]")


# -------------------------------------------------------------------------------- inventory


def inventory_rows(inv: Inventory) -> tuple[list[Column], list[list[str]]]:
    """The ``fleetctl inventory`` table: one row per node in rank order."""
    from fleetctl.cli.columns import Column

    columns = [
        Column("rank", "right"),
        Column("host"),
        Column("address"),
        Column("port", "right"),
        Column("user"),
        Column("nic"),
        Column("gpus", "right"),
        Column("workdir"),
    ]
    rows = []
    for rank, n in enumerate(inv.nodes):
        address = "local" if n.local else n.address
        if n.train_addr:
            address += f" (train {n.train_addr})"
        rows.append(
            [
                str(rank),
                n.name,
                address,
                "" if n.local else str(n.port),
                n.user or "",
                n.nic or "",
                "" if n.gpus is None else str(n.gpus),
                n.workdir,
            ]
        )
    return columns, rows


def print_inventory(inv: Inventory, console: Console | None = None) -> None:
    """``fleetctl inventory``: the node table and how many nodes were selected."""
    from fleetctl.cli.columns import print_table
    from fleetctl.cli.console import stdout_console

    console = console or stdout_console()
    title = f"{inv.path or 'this machine (no inventory)'}"
    if inv.limit:
        title += f"  --limit {inv.limit}"
    columns, rows = inventory_rows(inv)
    print_table(console, columns, rows, title=title)
    n = len(inv.nodes)
    console.print(f"{n} node{'s' if n != 1 else ''}, digest {inv.digest[:12]}", style="dim")
