"""Run the ``fleetctl`` CLI from tests: in-process by default, as a real process where needed.

``run_cli`` calls ``fleetctl.cli.main`` (all of the CLI's error handling, exit codes and
``fleetctl: error: …`` lines) with stdio captured by click's ``CliRunner`` isolation, so a test
reads exit code, stdout, stderr and JSON without starting an interpreter (httpie's style).
``run_cli_process`` / ``start_cli_process`` start ``python -m fleetctl`` for the tests that
need a real process: signals to the controller, ``--detach``, the console entry itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner

FLEETCTL = (sys.executable, "-m", "fleetctl")


@dataclass(frozen=True)
class CliResult:
    """One CLI invocation's outcome, as a user's shell sees it."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def json(self) -> Any:
        """stdout parsed as one JSON document (``--json`` output)."""
        return json.loads(self.stdout)


def run_cli(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    stdin: str | None = None,
    cwd: str | Path | None = None,
) -> CliResult:
    """``fleetctl ARGS…`` in this process; ``env`` values of None unset a variable.

    Not for commands that must outlive the call or receive signals: use ``start_cli_process``.
    """
    from fleetctl.cli import main

    old_cwd = os.getcwd() if cwd is not None else None
    runner = CliRunner()
    code: object = 0
    with runner.isolation(input=stdin, env=env) as (out, err, _):
        try:
            if cwd is not None:
                os.chdir(cwd)
            main(list(args))
        except SystemExit as e:
            code = e.code
        finally:
            if old_cwd is not None:
                os.chdir(old_cwd)
        stdout, stderr = out.getvalue(), err.getvalue()
    return CliResult(_exit_code(code), stdout.decode(), stderr.decode())


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _process_env(env: Mapping[str, str | None] | None) -> dict[str, str]:
    out = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def run_cli_process(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    stdin: str | None = None,
    cwd: str | Path | None = None,
    timeout: float = 120,
) -> CliResult:
    """``python -m fleetctl ARGS…`` as its own process (the console entry: fast exit, SIGTERM
    handler), waited for at most ``timeout`` seconds; ``env`` is added to this process's."""
    p = subprocess.run(
        [*FLEETCTL, *args],
        input=stdin or "",
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_process_env(env),
        cwd=cwd,
    )
    return CliResult(p.returncode, p.stdout, p.stderr)


def start_cli_process(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    cwd: str | Path | None = None,
    **popen: Any,
) -> subprocess.Popen[str]:
    """``python -m fleetctl ARGS…`` started, not waited for (the caller signals and reaps it).

    stdin is /dev/null and output is captured as text unless ``popen`` says otherwise.
    """
    popen.setdefault("stdin", subprocess.DEVNULL)
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([*FLEETCTL, *args], text=True, env=_process_env(env), cwd=cwd, **popen)


def all_commands() -> Iterator[tuple[str, click.Command]]:
    """Every ``fleetctl`` command and subcommand as (``"lab fault"``-style path, command): the
    tables that check every option of every command walk the real tree, so a new command is in
    them without a line of test."""
    from fleetctl.cli import COMMANDS, cli

    ctx = click.Context(cli)

    def walk(path: str, cmd: click.Command) -> Iterator[tuple[str, click.Command]]:
        yield path, cmd
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                yield from walk(f"{path} {name}", sub)

    for name in sorted(COMMANDS):
        cmd = cli.get_command(ctx, name)
        assert cmd is not None, name
        yield from walk(name, cmd)
