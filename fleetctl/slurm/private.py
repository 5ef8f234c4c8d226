"""``run --slurm --slurm-no-shared-fs``: follow a batch job whose run folder this machine
cannot see, and pull that folder home before the batch script exits.

Why srun steps: without a shared filesystem the only way to the batch host that a cluster
grants a job's owner is a step of the job (``srun --jobid J --overlap``), as the run inside
reaches its nodes. Two ``tail -F`` steps stream the script's output and error files here
(each line also appended to the local ``slurm.out``/``slurm.err``, so ``fleetctl logs`` reads
them as with a shared folder); the script's last stderr line (``ENDED_MARK`` + the inside
run's exit code) says the run inside has ended and written its folder; one ``tar`` step
brings that folder here; a ``touch`` of ``FETCHED`` lets the script exit (it waits at most
``FETCH_WAIT`` s, then removes its private files either way).

What lands here is written by the run folder's one writer (``RunFolder``, above this layer:
:class:`Home`): the tar unpacked, job.json moved to name this folder, through its record.
"""

from __future__ import annotations

import contextlib
import queue
import shlex
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Protocol

from fleetctl.slurm.batch import ENDED_MARK, ERROR_FILE, FETCHED, OUTPUT_FILE, SlurmError
from fleetctl.slurm.queue import JobInfo
from fleetctl.slurm.submit import (
    COMMAND_TIMEOUT,
    POLL,
    STATE_EVERY,
    STATE_EVERY_ENDED,
    Emit,
    SlurmClient,
    SlurmEvent,
)
from fleetctl.transport.srun import srun_argv

PULL_TIMEOUT = 600.0  # the tar step of the whole run folder
STOP_TIMEOUT = 10.0  # a tail step after the job ended (Slurm ends it with the job)


class Home(Protocol):
    """The run folder here that the batch host's is pulled into (``RunFolder`` is one)."""

    path: Path

    def receive(self, tar: IO[bytes]) -> str | None:
        """Unpack another copy of this folder from its tar stream, its files winning; why the
        stream broke, or None."""
        ...

    def relocate_job(self, inside: str) -> None:
        """job.json as written in folder ``inside`` names this one instead."""
        ...


class PrivateFollower:
    """One submitted job's output, followed through its batch host, and its pull."""

    def __init__(
        self,
        slurm: SlurmClient,
        job: str,
        home: Home,
        *,
        output: str,
        error: str,
        inside_folder: str,
    ) -> None:
        self.slurm, self.job, self.home = slurm, job, home
        self.output, self.error, self.inside_folder = output, error, inside_folder
        self.ended_code: int | None = None  # the inside run's, from the script's last line
        self.pulled = False
        self._lines: queue.Queue[tuple[str, str]] = queue.Queue()
        self._tails: list[subprocess.Popen[bytes]] = []
        self._readers: list[threading.Thread] = []

    def _step(self, host: str, line: str) -> list[str]:
        # not --unbuffered: that gives the task a pty (tar refuses to write to a terminal,
        # and a pty turns line ends into CRLF); pipes pass whole lines as they come
        return [a for a in srun_argv(self.job, host, line) if a != "--unbuffered"]

    def start(self, host: str) -> None:
        """A ``tail -F`` step per file on the batch host, each line queued as it comes."""
        for kind, path, name in (
            ("line", self.output, OUTPUT_FILE),
            ("errline", self.error, ERROR_FILE),
        ):
            line = f"exec tail -n +1 -F {shlex.quote(path)} 2>/dev/null"
            p = subprocess.Popen(
                self._step(host, line),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=self.slurm.env,
            )
            self._tails.append(p)
            assert p.stdout is not None
            t = threading.Thread(
                target=self._read,
                args=(kind, p.stdout, self.home.path / name),
                daemon=True,
                name=f"fleetctl-slurm-tail-{kind}",
            )
            t.start()
            self._readers.append(t)

    def _read(self, kind: str, pipe: IO[bytes], copy: Path) -> None:
        with contextlib.suppress(OSError, ValueError), open(copy, "ab") as f:
            for raw in pipe:
                text = raw.rstrip(b"\n").decode("utf-8", "replace")
                if kind == "errline" and text.startswith(ENDED_MARK):
                    with contextlib.suppress(ValueError):
                        self.ended_code = int(text[len(ENDED_MARK) :].strip())
                    self._lines.put(("ended", text))
                    continue
                f.write(raw if raw.endswith(b"\n") else raw + b"\n")
                f.flush()
                self._lines.put((kind, text))

    def drain(self, emit: Emit) -> bool:
        """Pass on the lines that came; True once the script said the run inside ended."""
        ended = False
        while True:
            try:
                kind, text = self._lines.get_nowait()
            except queue.Empty:
                return ended
            if kind == "ended":
                ended = True
            else:
                emit(SlurmEvent(kind, self.job, text))

    def pull(self, host: str) -> None:
        """The run folder from the batch host into the local one (the inside run's files
        win: its job.json replaces the queued record), then the script may exit."""
        line = f"exec tar -C {shlex.quote(self.inside_folder)} -cf - ."
        p = subprocess.Popen(
            self._step(host, line),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.slurm.env,
        )
        assert p.stdout is not None
        timer = threading.Timer(PULL_TIMEOUT, p.kill)
        timer.start()
        try:
            broke = self.home.receive(p.stdout)
            _, err = p.communicate(timeout=COMMAND_TIMEOUT)
        finally:
            timer.cancel()
        if broke or p.returncode != 0:
            why = broke or err.decode("utf-8", "replace").strip()[-300:]
            raise SlurmError(f"Slurm job {self.job}: pulling the run folder from {host}: {why}")
        self.home.relocate_job(self.inside_folder)
        self.pulled = True
        done = subprocess.run(
            self._step(host, f"exec touch {shlex.quote(self.inside_folder)}/{FETCHED}"),
            capture_output=True,
            env=self.slurm.env,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:  # the script then waits FETCH_WAIT s: worth saying
            raise SlurmError(
                f"Slurm job {self.job}: telling the batch script the pull is done failed: "
                + done.stderr.decode("utf-8", "replace").strip()[-300:]
            )

    def stop(self) -> None:
        for p in self._tails:
            if p.poll() is None:
                p.terminate()
        for p in self._tails:
            try:
                p.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(STOP_TIMEOUT)
        for t in self._readers:
            t.join(2.0)


def follow_private(
    slurm: SlurmClient,
    job: str,
    info: JobInfo,
    follower: PrivateFollower,
    emit: Emit,
    *,
    deadline: float | None = None,
) -> JobInfo:
    """Stream the job's lines from its batch host, pull its run folder once the run inside
    has ended, and return Slurm's last word once the job has left (or at ``deadline``,
    ``time.monotonic()``, the last state seen)."""
    host = info.batch_host
    while host is None:  # RUNNING without a batch host yet: ask again
        time.sleep(POLL)
        now = slurm.show(job)
        if now is None or now.done:
            return now or JobInfo(job, "COMPLETED")
        host = now.batch_host
    if not follower._tails:
        follower.start(host)
    asked = 0.0
    last = info
    while True:  # the caller stops the tails (a Ctrl-C still follows until the pull)
        if follower.drain(emit) and not follower.pulled:
            follower.pull(host)
            emit(SlurmEvent("pulled", job, host))
        every = STATE_EVERY_ENDED if follower.ended_code is not None else STATE_EVERY
        if time.monotonic() - asked >= every:
            asked = time.monotonic()
            now = slurm.show(job)
            if now is None or now.done:
                follower.drain(emit)
                return now or JobInfo(job, "COMPLETED")
            last = now
        if deadline is not None and time.monotonic() > deadline:
            return last
        time.sleep(POLL)
