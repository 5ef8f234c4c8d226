"""``fleetctl exec``: an ad-hoc command on every node, like pdsh/clush, over fleetctl's SSH layer.

Output: each node's lines prefixed ``node1: …`` as nodes finish (stderr lines go to stderr);
``-b/--gather`` prints identical output once under its folded node set (``node[1-3,5]``) in
rank order, like ``clush -b``. Failures are summarised on stderr, folded by status.
Exit status: 0 when every node exited 0; 124 when it timed out on any node (stopped there with
everything it started); 3 when any node failed or was unreachable
(like pdsh/clush without -S; per-node codes are in the output and in ``--json``). ``-S``
returns the largest remote exit code instead (255 for a node where the command could not run).

Imports stay light at module level: every ``fleetctl`` start imports this module, and the
SSH stack (paramiko) is only loaded when a command really connects.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from fleetctl.cli import cli
from fleetctl.cli.options import (
    Seconds,
    SSHOptions,
    inventory_option,
    limit_option,
    open_fleet,
    ssh_options,
)

if TYPE_CHECKING:
    from fleetctl.api.types import ExecResult, NodeRun


def _prefixed(name: str, text: str) -> str:
    lines = text.splitlines()
    return "".join(f"{name}: {line}\n" for line in lines)


def _print_run(run: NodeRun) -> None:
    """Streaming mode: one node's output, prefixed, as soon as that node is done."""
    if run.stdout:
        sys.stdout.write(_prefixed(run.node, run.stdout))
        sys.stdout.flush()
    if run.stderr:
        sys.stderr.write(_prefixed(run.node, run.stderr))
    if run.error is not None:
        sys.stderr.write(f"{run.node}: error: {run.error}\n")
    if run.stderr or run.error is not None:
        sys.stderr.flush()


def _print_gathered(result: ExecResult) -> None:
    """clush -b: identical output printed once under the folded set of nodes that produced it."""
    from fleetctl.cli.nodeset import fold

    out = []
    for names, run in result.gathered():
        header = fold(names)
        if run.status != "ok":
            header += f" ({run.status})"
        out.append(f"{'-' * 15}\n{header}\n{'-' * 15}\n")
        out.append(run.stdout if run.stdout.endswith("\n") or not run.stdout else run.stdout + "\n")
        if run.stderr:
            out.append(_prefixed("stderr", run.stderr))
    sys.stdout.write("".join(out))
    sys.stdout.flush()


def _print_failures(result: ExecResult) -> None:
    """One stderr line per distinct failure, its nodes folded: ``node[4,7]: exit 1``."""
    from fleetctl.cli.nodeset import fold

    by_status: dict[str, list[str]] = {}
    for node, status in result.failed.items():
        by_status.setdefault(status, []).append(node)
    for status, names in by_status.items():
        sys.stderr.write(f"fleetctl: {fold(names)}: {status}\n")
    sys.stderr.flush()


class _ExecCommand(click.Command):
    """Notes whether COMMAND came after an explicit ``--``: only then were words after it that
    look like exec's options surely meant for the remote program."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        raw = list(args)  # click's parser consumes the list it is given
        rest = super().parse_args(ctx, args)
        n = len(ctx.params.get("command") or ())
        ctx.meta[_AFTER_DASHDASH] = 0 < n < len(raw) and raw[-n - 1] == "--"
        return rest


_AFTER_DASHDASH = "fleetctl.exec.after_dashdash"


def _misplaced(command: tuple[str, ...], ctx: click.Context) -> list[str]:
    """Warnings for a COMMAND that reads like pdsh's habit (``exec 'df -h' --limit gpu1``):
    exec's options after COMMAND are words of it, and with more than one word a first word
    with spaces is a program name, no longer a shell line. Both run, so both only warn."""
    out = []
    if len(command) > 1 and any(c.isspace() for c in command[0]):
        out.append(
            f"{command[0]!r} is run as one program name, not as a shell line: only a lone "
            f"argument is a shell line, and {len(command) - 1} more "
            f"follow{'s' if len(command) == 2 else ''} it"
        )
    if not ctx.meta.get(_AFTER_DASHDASH):
        names = {  # long ones only: `tail -f`, `grep -i` are the remote program's own
            o
            for p in ctx.command.params
            if isinstance(p, click.Option)
            for o in (*p.opts, *p.secondary_opts)
            if o.startswith("--")
        }
        found = [w for w in command[1:] if w.split("=", 1)[0] in names]
        if found:
            out.append(
                f"{' '.join(found)} after the command {'are' if len(found) > 1 else 'is'} "
                "passed to it, not to exec: exec's options go before the command "
                "(fleetctl exec --limit PATTERN -- COMMAND)"
            )
    return out


@cli.command(
    "exec",
    cls=_ExecCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@inventory_option
@limit_option
@ssh_options(fanout_help="Nodes connected and run at once.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object with every node's result."
)
@click.option(
    "--timeout",
    type=Seconds(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Seconds the command may run on each node; then it is stopped there with everything "
    "it started (SIGTERM, 2 s, SIGKILL) and the exit status is 124.",
)
@click.option(
    "-b",
    "--gather",
    is_flag=True,
    help="Fold identical output under node sets (like clush -b), in rank order.",
)
@click.option(
    "-S",
    "--max-rc",
    is_flag=True,
    help="Exit with the largest remote exit code (255: not run) instead of 3.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_command(
    inventory: str | None,
    limit: str | None,
    as_json: bool,
    timeout: float,
    gather: bool,
    max_rc: bool,
    command: tuple[str, ...],
    ssh: SSHOptions,
) -> None:
    """Run COMMAND on every node; output prefixed by node name.

    One argument is a remote shell line (`fleetctl exec -- 'df -h | tail -1'`); several are
    quoted one by one and reach the program literally (`fleetctl exec -- echo 'a b;c'`).
    Options go before COMMAND: after it they are words of it (a warning says so).
    Exit status 0 if every node succeeded, 3 if any failed or was unreachable (see -S).
    """
    from fleetctl.errors import ExecFailed

    for warning in _misplaced(command, click.get_current_context()):
        click.echo(f"fleetctl: warning: {warning}", err=True)
    stream = not (as_json or gather)
    fleet = open_fleet(inventory, limit, ssh)
    result = fleet.exec(command, timeout=timeout, on_result=_print_run if stream else None)
    if as_json:
        data = result.to_dict()
        data["exit_code"] = result.max_rc if max_rc else result.exit_code
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        sys.stdout.flush()
    elif gather:
        _print_gathered(result)
    if not result.ok and not as_json:
        _print_failures(result)
    code = result.max_rc if max_rc else result.exit_code
    if code:
        late = [r for r in result.runs if r.timed_out]
        if late:
            what = f"exec timed out on {len(late)} of {len(result.runs)} nodes"
            if len(result.failed) > len(late):
                what += f" and failed on {len(result.failed) - len(late)}"
            raise ExecFailed(what, code)
        raise ExecFailed(f"exec failed on {len(result.failed)} of {len(result.runs)} nodes", code)
