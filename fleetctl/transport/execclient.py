"""A node whose every command is a process on this machine: the embedded local node
(``/bin/sh -c``) and a node of a Slurm allocation (an ``srun`` step).

ClusterShell's ``ExecClient`` is the model: a subclass only says which argv runs a shell line
there (``argv``); running it to completion under a timeout and streaming it are written once,
here. Plain ``subprocess`` for both: invoke's runner owns the child's pipes in its threads until
the command ends, so it cannot hand out the two-way stream the supervisor needs, and it costs
~50 ms of imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from abc import abstractmethod
from typing import TYPE_CHECKING, ClassVar

from fleetctl.errors import RemoteCommandError
from fleetctl.results import CommandResult
from fleetctl.transport.connection import Command, Connection, Stream, to_shell
from fleetctl.transport.procstream import ProcessStream

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings

KILL_WAIT = 1.0  # after a timeout's kill: how long the output may take to end


class ExecConnection(Connection):
    """Commands as local processes built by ``argv``; output decoded as UTF-8 (``replace``),
    a signal N read as exit code 128+N, as a shell reports it."""

    #: the process gets a session of its own, and a timeout kills the whole session (an srun
    #: step); otherwise it stays in ours, so Ctrl-C reaches it, and a timeout kills it alone
    new_session: ClassVar[bool] = False

    def __init__(self, node: Node, settings: SSHSettings | None = None) -> None:
        self.node = node  # no SSH: ``settings`` does not apply

    @abstractmethod
    def argv(self, line: str) -> list[str]:
        """The local argv that runs the shell line ``line`` on the node."""

    def run(
        self, command: Command, *, timeout: float, stdin: bytes | None = None, check: bool = False
    ) -> CommandResult:
        line = to_shell(command)
        proc = self._popen(line, stderr=subprocess.PIPE)
        try:
            # stdin written whole, then EOF (like /dev/null when None)
            out, err = proc.communicate(stdin or b"", timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self._kill(proc)
            raise RemoteCommandError(
                self.node.label,
                line,
                None,
                f"{self.node.label}: `{line}` timed out after {timeout:g}s",
            ) from e
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        result = CommandResult(
            line, code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        )
        return self._checked(command, result, check)

    def start(self, command: Command) -> Stream:
        return ProcessStream(self._popen(to_shell(command), stderr=subprocess.STDOUT))

    def _popen(self, line: str, *, stderr: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.argv(line),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            start_new_session=self.new_session,
        )

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        """End a command past its timeout. Its output may stay open in a background child
        (``sleep 30 &``): read it for a moment, then close our ends, never wait for it."""
        with contextlib.suppress(ProcessLookupError):
            if self.new_session:
                os.killpg(proc.pid, signal.SIGKILL)  # srun gone: Slurm ends the step
            else:
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=KILL_WAIT)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_WAIT)
