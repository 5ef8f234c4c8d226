"""Sending the code snapshot (rsync, or an SFTP content-hash delta) and the env archive
(SFTP through ``.part`` + rename), and the one finalize command that puts both in place."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import NodePushError
from fleetctl.phases import codesync
from fleetctl.phases.envpack import human_bytes
from fleetctl.phases.push.peers import _FetchFailed
from fleetctl.phases.push.state import _one_line, _State

if TYPE_CHECKING:
    from fleetctl.transport.connection import Connection


class _Transfer:
    """The transfer stages of :class:`~fleetctl.phases.push.phase._Push` (a mixin)."""

    # code ----------------------------------------------------------------------------------
    def _rsync_reaches(self, conn: Connection) -> bool:
        """rsync sends the code: the options allow it, this machine has it, and it can reach
        the node (``Connection.can_rsync``: not a Slurm node, which has no SSH for its shell)."""
        return self.options.use_rsync and self._have_local_rsync and conn.can_rsync

    def _send_code(self, st: _State, conn: Connection) -> None:
        snap = self.snap
        if snap is None or st.code_present or st.code_pending is not None:
            return
        tmp = f".tmp-{snap.digest}-{secrets.token_hex(4)}"
        pending: dict[str, Any] = {"digest": snap.digest, "tmp": tmp, "manifest": snap.manifest}
        if st.rsync and self._rsync_reaches(conn):
            st.result.bytes_sent += self._rsync(st, conn, tmp)
            st.result.code_method = "rsync"
        else:
            why = (
                "rsync not found on the node"
                if not st.rsync
                else "rsync not found on this machine"
                if not self._have_local_rsync
                else "rsync disabled"  # by the options, or rsync cannot reach the node (Slurm)
            )
            st.result.warnings.append(f"{why}: code sent over SFTP (content-hash delta)")
            prev = st.prev_manifest or {}
            reuse = [rel for rel, e in snap.manifest.items() if prev.get(rel) == e]
            changed = [rel for rel in snap.manifest if prev.get(rel) != snap.manifest[rel]]
            with tempfile.TemporaryDirectory(prefix="fleetctl-push-") as td:
                tar_path = Path(td) / "code.tar.gz"
                with tarfile.open(tar_path, "w:gz", compresslevel=6) as tf:
                    for rel in changed:
                        tf.add(snap.root / rel, arcname=rel, recursive=False)
                name = tmp + ".tar"
                st.result.bytes_sent += self._upload(
                    st, conn, tar_path, f"{st.workdir}/code/{name}", "code"
                )
            pending.update(tar=name, prev=st.code_prev if reuse else None, reuse=reuse)
            st.result.code_method = "sftp"
        st.code_pending = pending

    def _rsync(self, st: _State, conn: Connection, tmp: str) -> int:
        snap, node = self.snap, st.node
        assert snap is not None
        dest = f"{st.workdir}/code/{tmp}"
        link = f"{st.workdir}/code/{st.code_prev}" if st.code_prev else None
        with tempfile.NamedTemporaryFile("wb", prefix="fleetctl-files-", delete=False) as f:
            f.write(b"\0".join(rel.encode("utf-8", "surrogateescape") for rel in snap.files))
            listing = f.name
        timeout = self.options.transfer_timeout
        argv = codesync.rsync_argv(
            conn.rsync_target(dest + "/"),
            snap.root,
            files_from=listing,
            link_dest=link,
            io_timeout=int(min(timeout, 300)),
        )
        self.emit(node.name, "code", 0, snap.total_bytes)
        try:
            code, out, err = _run_streaming(
                argv, timeout, lambda done: self.emit(node.name, "code", done, snap.total_bytes)
            )
        finally:
            os.unlink(listing)
        if code != 0:
            with contextlib.suppress(Exception):
                self._remote(
                    node, conn, "cleanup", {"workdir": st.workdir, "code_paths": [tmp]}, 60
                )
            last = (err.strip().splitlines() or [f"exit {code}"])[-1]
            full = "No space left on device" in err
            raise NodePushError(
                node.label,
                f"rsync of the code failed (exit {code}): {last}",
                stage="code",
                enospc=full,
            )
        m = re.search(r"Total bytes sent:\s*([\d,.]+)", out)
        return int(re.sub(r"[,.]", "", m.group(1))) if m else 0

    # env -----------------------------------------------------------------------------------
    def _upload(self, st: _State, conn: Connection, local: Path, remote: str, stage: str) -> int:
        """SFTP ``local`` to ``remote`` (absolute) through ``.part`` + rename; bytes sent."""
        size = local.stat().st_size
        node = st.node
        self.emit(node.name, stage, 0, size)

        def tick(done: int, total: int) -> None:
            self.emit(node.name, stage, done, total or size)

        try:
            conn.upload(local, remote, tick)  # through remote.part, by the node's transport
        except Exception as e:
            free = None
            with contextlib.suppress(Exception):
                base, name = remote.rsplit("/", 1)
                key = "env_paths" if base.endswith("/envs") else "code_paths"
                free = self._remote(
                    node, conn, "cleanup", {"workdir": st.workdir, key: [name, name + ".part"]}, 60
                ).get("free")
            enospc = getattr(e, "errno", None) == 28 or (free is not None and free < size)
            what = "env archive" if stage == "upload" else "code"
            if enospc:
                msg = (
                    f"disk full while uploading the {what} to {remote.rsplit('/', 1)[0]} "
                    f"({human_bytes(free or 0)} free); partial files removed"
                )
            else:
                msg = f"upload of the {what} failed: {_one_line(e)}; partial files removed"
            raise NodePushError(node.label, msg, stage="upload", enospc=enospc) from e
        return size

    def _send_and_finalize(self, st: _State, conn: Connection) -> None:
        """Stage A: code for all; direct/seed upload and one finalize for all but fetchers."""
        self._send_code(st, conn)
        if st.node.name in self._fetchers:
            return  # code is renamed into place by the fetch's finalize
        env: dict[str, Any] | None = None
        arch = st.archive
        if arch is not None and not st.env_present:
            seed = any(st is s for s in self._seeds.get(arch.sha256, []))
            name = f".tmp-{arch.sha256[:16]}-{secrets.token_hex(4)}.archive"
            st.result.bytes_sent += self._upload(
                st, conn, arch.path, f"{st.workdir}/envs/{name}", "upload"
            )
            env = {"sha": arch.sha256, "archive": name, "size": arch.size, "keep_archive": seed}
            st.result.env_method = "sftp"
            if seed:
                st.kept_archive = name
        self._finalize(st, conn, env)

    def _finalize(self, st: _State, conn: Connection, env: dict[str, Any] | None) -> None:
        if st.code_pending is None and env is None:
            return
        node = st.node
        self.emit(node.name, "finalize")
        cfg: dict[str, Any] = {
            "workdir": node.workdir,
            "check_torch": self.options.check_torch,
            "verify_timeout": self.options.verify_timeout,
        }
        if st.code_pending is not None:
            cfg["code"] = st.code_pending
        if env is not None:
            cfg["env"] = env
        out = self._remote(node, conn, "finalize", cfg, self.options.transfer_timeout)
        if st.code_pending is not None:
            st.result.code_dir, st.code_pending = out["code_dir"], None
        if env is None:
            return
        if out.get("env_error"):
            st.kept_archive = None
            if out.get("env_stage") == "fetch" and not out.get("enospc"):
                raise _FetchFailed(out["env_error"])
            if out.get("enospc"):
                raise NodePushError(
                    node.label,
                    f"disk full in {st.workdir}/envs during {out.get('env_stage')} "
                    f"({human_bytes(int(out.get('free') or 0))} free): {out['env_error']}; "
                    "partial files removed",
                    stage=out.get("env_stage", "unpack"),
                    enospc=True,
                )
            raise NodePushError(
                node.label,
                f"env {out.get('env_stage')} failed: {out['env_error']}; partial files removed",
                stage=out.get("env_stage", "unpack"),
            )
        st.result.env_dir = out["env_dir"]
        st.verify = out.get("verify")
        if out.get("fetched"):
            st.result.env_source = out["fetched"].get("peer")


_PROGRESS = re.compile(rb"^\s*([\d,.]+)\s+\d+%")


def _run_streaming(
    argv: list[str], timeout: float, on_bytes: Callable[[int], None]
) -> tuple[int, str, str]:
    """Run rsync, reporting ``--info=progress2`` byte counts; kill it at the deadline."""
    import select

    with tempfile.TemporaryFile() as errf:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=errf,
            start_new_session=True,
        )
        assert proc.stdout is not None
        out = bytearray()
        pending = b""
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rsync did not finish in {timeout:g}s")
                ready, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
                if not ready:
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
                pending += chunk
                *lines, pending = re.split(rb"[\r\n]", pending)
                for line in lines:
                    m = _PROGRESS.match(line)
                    if m:
                        on_bytes(int(re.sub(rb"[,.]", b"", m.group(1))))
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except BaseException:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(timeout=10)
            raise
        finally:
            proc.stdout.close()
        errf.seek(0)
        err = errf.read().decode(errors="replace")
    return code, out.decode(errors="replace"), err
