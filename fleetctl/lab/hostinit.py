"""PID 1 of one lab host: set up its private mounts and hostname, run sshd, reap zombies.

Stdlib only and run as ``python -I -S hostinit.py HOST_JSON`` inside fresh mount/UTS/PID
namespaces (``unshare --mount --uts --pid --fork --mount-proc``) that ``nsenter`` placed in
the host's network namespace. Being PID 1 of its own PID namespace gives the host a real
process table (``ps`` shows only this host) and a real "crash": killing this process makes
the kernel kill everything on the host. Killing only the sshd child is a different fault.

Signals: SIGUSR1 starts sshd if it is not running (the "restart sshd" fault); SIGTERM/SIGINT
stop sshd and exit. sshd is never restarted on its own, so a killed sshd stays dead.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import time

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def log(msg: str) -> None:
    sys.stderr.write(f"hostinit[{os.getpid()}] {time.strftime('%H:%M:%S')} {msg}\n")
    sys.stderr.flush()


def mount(src: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    rc = _libc.mount(
        src.encode(),
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} -> {target} ({fstype}): {os.strerror(err)}")


def umount(target: str) -> None:
    if _libc.umount2(target.encode(), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount {target}: {os.strerror(err)}")


def detach_nsfs() -> None:
    """Drop copies of other namespaces' bind mounts (``/run/netns/*``) from this host's view.

    Otherwise this mount namespace would pin every network namespace that existed when the
    host started, and another lab's ``ip netns del`` could never really free its namespaces.
    """
    with open("/proc/self/mountinfo") as f:
        lines = f.read().splitlines()
    targets = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fstype = right.split(" ", 1)[0]
        if fstype == "nsfs":
            targets.append(left.split(" ")[4].encode().decode("unicode_escape"))
    for target in reversed(targets):
        try:
            umount(target)
        except OSError as e:
            log(f"warning: {e}")


def setup(cfg: dict) -> None:
    socket.sethostname(cfg["hostname"])
    # unshare --propagation private already made every mount private; be explicit anyway.
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    detach_nsfs()
    cgroups = cgroup_mounts()
    # The host's own /sys, so /sys/class/net lists its own NICs (best effort).
    try:
        mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as e:
        log(f"warning: {e}")
    remount_cgroups(cgroups)
    if cfg.get("keep_root"):
        hide_root(cfg["keep_root"])
    for src, dst in cfg["binds"]:
        mount(src, dst, None, MS_BIND)
    try:
        mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    except OSError as e:
        log(f"warning: {e}")
    mount_mqueue()
    os.chdir("/")


def mount_mqueue() -> None:
    """/dev/mqueue, as systemd mounts it on real hosts: rootless podman's ``--ipc host`` binds
    it into the container and fails without it (best effort: the mountpoint is made on this
    machine's /dev, which every host shares; the mount is this host's)."""
    try:
        os.makedirs("/dev/mqueue", exist_ok=True)
        mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError as e:
        log(f"warning: {e}")


def cgroup_mounts() -> list:
    """This machine's cgroup hierarchies under /sys/fs/cgroup as (path, fstype, options)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, tail = pre.split(), post.split()
            if len(fields) > 4 and len(tail) > 2 and tail[0] in ("cgroup", "cgroup2"):
                opts = ",".join(o for o in tail[2].split(",") if o not in ("rw", "ro"))
                if fields[4].startswith("/sys/fs/cgroup"):
                    found.append((fields[4], tail[0], opts))
    return found


def remount_cgroups(cgroups: list) -> None:
    """The fresh /sys hides the cgroup hierarchies: mount them again, as runc (podman inside
    a lab host) needs them (best effort: a host without them only lacks containers)."""
    if not cgroups:
        return
    try:
        if all(path != "/sys/fs/cgroup" for path, _, _ in cgroups):
            mount("cgroup-root", "/sys/fs/cgroup", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755")
        for path, fstype, opts in cgroups:
            os.makedirs(path, exist_ok=True)
            mount(fstype, path, fstype, MS_NOSUID | MS_NODEV | MS_NOEXEC, opts or None)
    except OSError as e:
        log(f"warning: {e}")


def hide_root(keep: list) -> None:
    """A login user's host: root's home becomes an empty tmpfs (0755) but for ``keep`` (the
    lab's Python, e.g. /root/.pyenv), bound back at the same paths so interpreters and venvs
    built on them work unchanged for the user."""
    fds = [(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY)) for path in keep]
    mount("fleetctl-lab-root", "/root", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path, fd in fds:
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)


class Init:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.sshd_pid: int | None = None

    def start_sshd(self) -> None:
        if self.sshd_pid is not None:
            return
        argv = self.cfg["sshd_argv"]
        log_fd = os.open(self.cfg["sshd_log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        pid = os.fork()
        if pid == 0:  # child: clean signal state, then become sshd
            try:
                for sig in (
                    signal.SIGCHLD,
                    signal.SIGUSR1,
                    signal.SIGTERM,
                    signal.SIGINT,
                    signal.SIGHUP,
                ):
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.setsid()
                null = os.open("/dev/null", os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                os.execve(argv[0], argv, self.cfg["sshd_env"])
            finally:
                os._exit(127)
        os.close(log_fd)
        self.sshd_pid = pid
        log(f"started sshd pid {pid}")

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.sshd_pid:
                log(f"sshd pid {pid} exited (status {status})")
                self.sshd_pid = None

    def stop(self) -> None:
        if self.sshd_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.sshd_pid, signal.SIGTERM)
        log("stopping")

    def run(self) -> int:
        watched = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
        for sig in watched:  # handlers make the signals deliverable to a namespace's PID 1
            signal.signal(sig, lambda *_: None)
        signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        self.start_sshd()
        while True:
            info = signal.sigwaitinfo(watched)
            if info.si_signo == signal.SIGCHLD:
                self.reap()
            elif info.si_signo == signal.SIGUSR1:
                self.reap()
                self.start_sshd()
            elif info.si_signo in (signal.SIGTERM, signal.SIGINT):
                self.stop()
                return 0


def main() -> int:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    try:
        setup(cfg)
    except OSError as e:
        log(f"setup failed: {e}")
        return 1
    log(f"host {cfg['hostname']} ready")
    return Init(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
