"""A local process's pipes as a node stream (stdout and stderr merged), like an SSH channel:
the embedded local node's and srun's commands stream through it."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess

from fleetctl.transport.connection import Stream


class ProcessStream(Stream):
    """``proc``'s stdin, stdout and exit code behind the Stream interface."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc = proc

    def recv(self, timeout: float) -> bytes | None:
        assert self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        return os.read(fd, 65536)

    def send(self, data: bytes) -> None:
        assert self._proc.stdin is not None
        if self._proc.stdin.closed:  # like a closed SSH channel: OSError, as documented
            raise OSError("stdin closed")
        self._proc.stdin.write(data)
        self._proc.stdin.flush()

    def close_stdin(self) -> None:
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()

    def exit_code(self, timeout: float) -> int | None:
        try:
            code = self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return code if code >= 0 else 128 - code

    def close(self) -> None:
        self.close_stdin()
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def fileno(self) -> int | None:
        out = self._proc.stdout
        return None if out is None or out.closed else out.fileno()
