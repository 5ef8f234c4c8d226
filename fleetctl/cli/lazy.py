"""A click group whose subcommands are imported on first use (click's documented ``LazyGroup``).

Every ``fleetctl`` start pays for what its command imports and nothing else: ``--version`` and
``exec`` never load lab, check, push or job code, and ``--help`` lists every command from the
table's summaries without importing one (a test keeps the summaries equal to the docstrings).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class LazyCommand:
    """Where a subcommand lives: importing ``module`` registers it on the group."""

    module: str
    summary: str | None  # the line ``--help`` lists (the docstring's first sentence); None: hidden


class LazyGroup(click.Group):
    """``click.Group`` that imports a subcommand's module when the command is first asked for."""

    def __init__(self, *args: Any, lazy: Mapping[str, LazyCommand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(self.commands) | set(self.lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            importlib.import_module(self.lazy[cmd_name].module)
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:  # every typed value checked where click reads it (cli/guard.py)
            from fleetctl.cli.guard import install

            install(cmd)
        return cmd

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, but a mistyped command gets a suggestion as a mistyped option does:
        ``No such command 'chek'. Did you mean 'check'?`` (a UsageError: exit 2)."""
        name = args[0] if args else ""
        typed = name and not name.startswith("-") and not ctx.resilient_parsing
        if typed and self.get_command(ctx, name) is None:
            ctx.fail(f"No such command {name!r}.{_suggest(name, self._visible(ctx))}")
        return super().resolve_command(ctx, args)

    def _visible(self, ctx: click.Context) -> list[str]:
        """Names ``--help`` lists, loaded or not (none is imported for this)."""
        loaded = self.commands
        return [
            n
            for n in self.list_commands(ctx)
            if (not loaded[n].hidden if n in loaded else self.lazy[n].summary is not None)
        ]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's listing, with a stand-in carrying the summary for each command not loaded."""
        rows: list[tuple[str, click.Command]] = []
        for name in self.list_commands(ctx):
            cmd = self.commands.get(name)
            if cmd is None:
                summary = self.lazy[name].summary
                cmd = click.Command(name, help=summary, hidden=summary is None)
            if not cmd.hidden:
                rows.append((name, cmd))
        if not rows:
            return
        limit = formatter.width - 6 - max(len(name) for name, _ in rows)
        with formatter.section("Commands"):
            formatter.write_dl([(name, cmd.get_short_help_str(limit)) for name, cmd in rows])


def _suggest(name: str, names: list[str]) -> str:
    """click's wording for a mistyped option (click ≥ 8.4 only looks among the commands
    already imported, so a lazy group would get none)."""
    close = sorted(difflib.get_close_matches(name, names))
    if len(close) == 1:
        return f" Did you mean {close[0]!r}?"
    return f" (Did you mean one of: {', '.join(map(repr, close))}?)" if close else ""
