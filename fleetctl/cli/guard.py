"""The one check every text value of every command passes where click reads it.

A value typed on the command line (or taken from the environment) that holds a control
character (a newline ends an ``#SBATCH`` or shell line and starts another; NUL and escapes
corrupt a path or the terminal), that is empty, or that starts with ``-`` (``--image --nodes
2``: the next flag taken as the value) is refused as a usage error naming the option, exit 2,
before the command runs. ``install`` puts the check on every command as its module loads
(``fleetctl.cli.lazy``), so a new option is covered without a line here; values handed
verbatim to the user's own program are named in ``VERBATIM`` (or their type says
``verbatim``: click's UNPROCESSED, ``NAME=VALUE`` pairs whose names the record checks).
docs/security.md states the rule; tests/pure/test_bad_input_table.py holds every option to it.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

import click

from fleetctl.errors import UsageError

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

# (command, parameter) whose values go to the user's program or shell as given: not checked
VERBATIM = {
    ("run", "script_args"),
    ("exec", "command"),
    ("provision", "ansible_args"),
    ("ssh", "command"),  # lab ssh
}
# options whose values are themselves flags: a leading "-" is their shape, not a mistake
FLAGS = {"--launcher-arg", "--sbatch-arg"}


def install(cmd: click.Command) -> None:
    """Check the values of ``cmd`` (and of the subcommands a group holds) as they are parsed."""
    if getattr(cmd, "_fleetctl_guarded", False):
        return
    parse = cmd.parse_args

    def parse_args(ctx: click.Context, args: list[str]) -> list[str]:
        rest = parse(ctx, args)
        check(ctx)
        return rest

    cmd.parse_args = parse_args  # type: ignore[method-assign]
    cmd._fleetctl_guarded = True  # type: ignore[attr-defined]
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            install(sub)


def check(ctx: click.Context) -> None:
    """Refuse a typed text value that is empty, holds a control character or starts with
    ``-``: click.BadParameter naming the option (exit 2)."""
    command = ctx.command.name or ""
    for param in ctx.command.params:
        name = param.name or ""
        t = param.type
        if (command, name) in VERBATIM or getattr(t, "verbatim", False):
            continue
        if isinstance(t, click.types.UnprocessedParamType):
            continue
        source = ctx.get_parameter_source(name)
        if source not in (
            click.core.ParameterSource.COMMANDLINE,
            click.core.ParameterSource.ENVIRONMENT,
        ):
            continue
        for value in _values(ctx.params.get(name)):
            flag = bool(FLAGS.intersection(param.opts))
            why = problem(value, flag=flag, option=isinstance(param, click.Option))
            if why:
                raise click.BadParameter(why, ctx=ctx, param=param)
            if isinstance(t, click.Path):
                _not_a_loop(value, param)


def problem(value: str, *, flag: bool = False, option: bool = True) -> str | None:
    """Why ``value`` cannot be a command-line value, or None."""
    if value == "":
        return "an empty value"
    bad = _CONTROL_RE.search(value)
    if bad:
        return f"{value!r} holds a control character ({bad.group()!r})"
    if option and not flag and value.startswith("-"):
        return f"{value!r} starts with '-' (a flag where a value belongs?)"
    return None


def _not_a_loop(path: str, param: click.Parameter) -> None:
    """A symlink loop is no file and no folder: refused here, naming the path and the option,
    not a traceback (or a silent "missing") later."""
    try:
        os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            flag = "/".join(param.opts)
            raise UsageError(f"{path}: cannot read: {os.strerror(e.errno)} ({flag})") from None
    except ValueError:
        pass


def _values(value: Any) -> list[str]:
    if isinstance(value, (tuple, list)):
        return [str(v) for v in value if isinstance(v, str)]
    return [value] if isinstance(value, str) else []
