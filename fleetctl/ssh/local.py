"""This machine as a node, without SSH (the embedded default fleet).

``run`` goes through invoke's ``Context.run`` with a ``Local`` runner tuned for fleetctl (see
``_LocalRunner``); its ``Result`` becomes fleetctl's ``CommandResult`` in ``_command_result``.
``start`` stays on ``subprocess``: invoke's runner owns the child's pipes in its own threads until
the command ends, so it cannot hand out the bidirectional stream (``recv`` with a timeout,
``send`` while it runs) the supervisor protocol needs.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import IO, TYPE_CHECKING

import invoke
from invoke.runners import Local

from fleetctl.errors import RemoteCommandError
from fleetctl.results import CommandResult
from fleetctl.ssh.connection import Command, Connection, Stream, to_shell
from fleetctl.ssh.procstream import ProcessStream

if TYPE_CHECKING:
    from fleetctl.node import Node


class _LocalRunner(Local):
    """invoke's ``Local``, byte-exact and bounded.

    invoke reads a file-like ``in_stream`` one byte per ``input_sleep`` (10 ms) and round-trips
    it through text; it decodes output per 1000-byte chunk (a UTF-8 character across a chunk
    boundary is garbled); and it joins its reader threads without a limit (a background child
    holding stdout open would hang ``run`` past its timeout). Here stdin is written in one go as
    bytes, output is decoded incrementally, and the joins end at the command's deadline.
    """

    _deadline: float | None = None

    def start_timer(self, timeout: int) -> None:
        self._deadline = None if timeout is None else time.monotonic() + timeout
        super().start_timer(timeout)

    def handle_stdin(self, input_: IO, output: IO, echo: bool = False) -> None:
        data = input_.read()
        view = memoryview(data)
        with contextlib.suppress(BrokenPipeError):  # the command did not read its stdin
            while view:
                view = view[os.write(self.process.stdin.fileno(), view) :]
        self.close_proc_stdin()

    def read_proc_output(self, reader: Callable) -> Generator[str, None, None]:
        decoder = codecs.getincrementaldecoder(self.encoding)("replace")
        while True:
            data = reader(self.read_chunk_size)
            text = decoder.decode(data or b"", final=not data)
            if text:
                yield text
            if not data:
                return

    def _thread_join_timeout(self, target: Callable) -> float | None:
        if self._deadline is None:
            return super()._thread_join_timeout(target)
        # A second past the deadline: invoke's timer (it kills the command) has fired by then,
        # so the run counts as timed out instead of returning cut-off output.
        return max(0.0, self._deadline - time.monotonic()) + 1.0


def _command_result(result: invoke.Result) -> CommandResult:
    """invoke's Result as fleetctl's (a signal N is exit code 128+N, as a shell reports it)."""
    code = result.exited if result.exited >= 0 else 128 - result.exited
    return CommandResult(result.command, code, result.stdout, result.stderr)


class LocalConnection(Connection):
    """This machine, without SSH: same commands, run by ``/bin/sh -c``."""

    def __init__(self, node: Node) -> None:
        self.node = node
        # lazy: no invoke.yaml from /etc or ~ changes how fleetctl runs commands
        self._config = invoke.Config(lazy=True, overrides={"runners": {"local": _LocalRunner}})

    def run(
        self, command: Command, *, timeout: float, stdin: bytes | None = None, check: bool = False
    ) -> CommandResult:
        line = to_shell(command)
        try:
            result = invoke.Context(self._config).run(
                line,
                shell="/bin/sh",
                hide=True,
                warn=True,
                timeout=timeout,
                in_stream=io.BytesIO(stdin or b""),  # EOF after it, like /dev/null when None
                encoding="utf-8",
            )
        except invoke.CommandTimedOut as e:
            raise RemoteCommandError(
                self.node.label,
                line,
                None,
                f"{self.node.label}: `{line}` timed out after {timeout:g}s",
            ) from e
        return self._checked(command, _command_result(result), check)

    def start(self, command: Command) -> Stream:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", to_shell(command)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        return ProcessStream(proc)

    def put(self, local: str | Path, remote: str, *, mode: int | None = None) -> None:
        dest = Path(self.expand(remote))
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{dest.name}.{secrets.token_hex(4)}.part")  # see SSHConnection.put
        try:
            shutil.copyfile(local, tmp)
            if mode is not None:
                os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def get(self, remote: str, local: str | Path) -> None:
        shutil.copyfile(self.expand(remote), local)

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        out = []
        with os.scandir(self.expand(remote)) as it:
            for e in it:
                is_dir = e.is_dir(follow_symlinks=False)
                out.append((e.name, is_dir, 0 if is_dir else e.stat(follow_symlinks=False).st_size))
        return out

    @property
    def home(self) -> str:
        return os.path.expanduser("~")

    def close(self) -> None:
        pass
