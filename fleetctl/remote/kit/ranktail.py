"""A supervisor's copy of each local rank's own output files (torchrun ``--redirects``):
whole lines per rank, prefixed ``[rank G]``, into the stream and console.log.

Node module: stdlib only, Python >= 3.8. A mixin of ``supervision.Supervisor``, whose state
(``spec``, ``run_dir``, ``tail_lock``, ``rank_files``, ``echo_path``, ``echo_lines``,
``begun``) and ``begin``/``emit`` it uses.
"""

from __future__ import annotations

import os
import threading

from .ranks import rank_log_files

MAX_LINE = 65536


class RankTail:
    def tail_ranks(self, done: threading.Event) -> None:
        """Each local rank's own output files (torchrun ``--redirects``), line by line, as
        ``[rank G] line``: whole lines per rank in the stream and console.log, whatever mix of
        partial writes the ranks make. A partial line waits for its end (or the job's end)."""
        cfg = self.spec.rank_logs or {}
        root = os.path.join(self.run_dir, str(cfg.get("dir") or ""))
        base = int(cfg.get("base") or 0)
        while True:
            last = done.wait(0.1)
            for path, local in rank_log_files(root, cfg):
                with self.tail_lock:
                    if path not in self.rank_files:
                        self.rank_files[path] = [0, b"", b"[rank %d] " % (base + local)]
            for path in list(self.rank_files):
                self._tail_path(path, final=last)
            if last:
                return

    def _tail_path(self, path: str, *, final: bool) -> None:
        with self.tail_lock:
            st = self.rank_files.get(path)
            if st is None and path == self.echo_path and os.path.exists(path):
                base = int((self.spec.rank_logs or {}).get("base") or 0)
                st = self.rank_files[path] = [0, b"", b"[rank %d] " % base]
            if st is not None:
                self._tail_one(path, st, final=final)

    def _tail_one(self, path: str, st: list, *, final: bool) -> None:
        try:
            with open(path, "rb") as f:
                f.seek(st[0])
                data = f.read(1 << 20)
        except OSError:
            return
        st[0] += len(data)
        if data and not self.begun:
            self.begin()
        buf = st[1] + data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            self.emit(st[2] + buf[: nl + 1], ends=True)
            if path == self.echo_path:
                self.echo_lines.append(buf[:nl])
            buf = buf[nl + 1 :]
        if len(buf) >= MAX_LINE:  # bounded: a very long line goes on in pieces
            self.emit(st[2] + buf, ends=False)
            buf = b""
        if final and buf:  # the rank's last, unterminated line: whole in the log too
            self.emit(st[2] + buf, ends=True, log=st[2] + buf + b"\n")
            buf = b""
        st[1] = buf
        if final and len(data) == 1 << 20:  # more after a big burst: keep draining
            self._tail_one(path, st, final=True)
