"""A real Slurm on a lab: munged + slurmctld on this machine, one slurmd per lab host.

Why: fleetctl's Slurm mode (``fleetctl.slurm``) must be held to a real ``srun``/``salloc``,
not a fake. Everything lives under ``DIR/slurm/`` (config, munge key and socket, spools, logs);
the daemons are started by PID and stopped by PID (``stop``; ``Lab.down`` calls it too),
then ``DIR/slurm/`` is removed.
No cgroups: ``proctrack/linuxproc``, ``task/none``, ``jobacct_gather/none``. slurmctld listens
on the management bridge's gateway; each slurmd runs inside its host's namespaces, so the
tasks it starts are that host's processes (its PID table, its network).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetctl.errors import LabError
from fleetctl.lab import procs
from fleetctl.lab.constants import STOP_TIMEOUT

if TYPE_CHECKING:
    from fleetctl.lab.core import Lab

READY_TIMEOUT = 30.0
STATE_FILE = "slurm.json"
DAEMONS = ("munged", "slurmctld", "slurmd")
NVIDIA_MAJOR = 195  # the lab's fake GPU device nodes (gres/gpu File=)
#: slurmd refuses to start without cgroup hierarchies ("Unable to initialize cgroup plugin")
#: even with proctrack/linuxproc; a lab host has its own /sys, so mount v1 ones there.
_CGROUP_V1 = (
    '[ "$(stat -f -c %T /sys/fs/cgroup)" = tmpfs ] || '
    "{ mount -t tmpfs cgroup_root /sys/fs/cgroup && "
    "for c in cpu cpuacct cpuset memory devices freezer pids; do mkdir -p /sys/fs/cgroup/$c && "
    "mount -t cgroup -o $c cgroup /sys/fs/cgroup/$c || exit 1; done && "
    "mkdir -p /sys/fs/cgroup/systemd && "
    "mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd; } &&"
)


def installed() -> str | None:
    """None when Slurm and munge are installed, else what is missing."""
    missing = [b for b in (*DAEMONS, "srun", "salloc", "scontrol") if not _which(b)]
    return f"not installed: {', '.join(missing)}" if missing else None


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return int(s.getsockname()[1])


def slurm_dir(lab: Lab) -> Path:
    return lab.dir / "slurm"


def _conf(lab: Lab, d: Path, ctld_port: int, d_port: int, slurmd_timeout: int = 30) -> str:
    gateway = lab.state["mgmt"]["gateway"]
    nodes = "\n".join(
        f"NodeName={h.name} NodeAddr={h.mgmt_addr} CPUs={os.cpu_count() or 1} State=UNKNOWN"
        + (f" Gres=gpu:{h.gpus}" if h.gpus else "")
        for h in lab.hosts
    )
    gpus = any(h.gpus for h in lab.hosts)
    gres = "GresTypes=gpu\n" if gpus else ""
    # 22.05's select/linear refuses every step of a job with gres ("cpu:1 is not a gres"):
    # cons_tres then, each job still given whole nodes (OverSubscribe=EXCLUSIVE)
    select = "select/cons_tres" if gpus else "select/linear"
    exclusive = " OverSubscribe=EXCLUSIVE" if gpus else ""
    # each task finds its host's fake nvidia-smi as an SSH session does (its bin dir on PATH)
    prolog = f"TaskProlog={d}/task_prolog.sh\n" if gpus else ""
    names = ",".join(h.name for h in lab.hosts)
    return f"""# fleetctl lab {lab.name}: written by fleetctl.lab.slurm
ClusterName={lab.name}
SlurmctldHost={socket.gethostname()}({gateway})
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge/munge.socket
StateSaveLocation={d}/ctld
SlurmctldPidFile={d}/ctld/slurmctld.pid
SlurmctldLogFile={d}/ctld/slurmctld.log
SlurmdSpoolDir={d}/nodes/%n
SlurmdPidFile={d}/nodes/%n/slurmd.pid
SlurmdLogFile={d}/nodes/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType={select}
SchedulerType=sched/builtin
ReturnToService=2
SlurmdTimeout={slurmd_timeout}
InactiveLimit=0
KillWait=2
{gres}{prolog}{nodes}
PartitionName=lab Nodes={names} Default=YES MaxTime=INFINITE State=UP{exclusive}
"""


def _gres_conf(lab: Lab, d: Path) -> str:
    """The fake GPUs as ``gres/gpu``, each a device node the lab makes (``DIR/slurm/dev``):
    gres without ``File=`` registers 0 GPUs, and ``File=`` gives each its index, which
    slurmstepd puts in ``CUDA_VISIBLE_DEVICES``/``SLURM_JOB_GPUS`` of the job's steps."""
    lines = []
    for h in lab.hosts:
        if not h.gpus:
            continue
        dev = d / "dev" / h.name
        dev.mkdir(parents=True, exist_ok=True)
        for i in range(h.gpus):  # slurmd takes only a device node ("not a valid character
            f = dev / f"nvidia{i}"  # or block device"): nvidia's major, never opened
            if not f.exists():
                os.mknod(f, stat.S_IFCHR | 0o600, os.makedev(NVIDIA_MAJOR, i))
        lines.append(f"NodeName={h.name} Name=gpu File={dev}/nvidia[0-{h.gpus - 1}]")
    return "".join(ln + "\n" for ln in lines)


class SlurmLab:
    """The Slurm of one lab: its config and the environment its clients need."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.dir = slurm_dir(lab)

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    def env(self) -> dict[str, str]:
        """Environment for ``srun``/``salloc``/``scontrol`` (and fleetctl) on this machine."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # ------------------------------------------------------------------ up
    @classmethod
    def start(
        cls, lab: Lab, timeout: float = READY_TIMEOUT, *, slurmd_timeout: int = 30
    ) -> SlurmLab:
        """Start munged, slurmctld and every host's slurmd; wait until all nodes are idle.
        ``slurmd_timeout``: slurm.conf's ``SlurmdTimeout`` (a dead node's ``NOT_RESPONDING``
        comes ~15 s after it stops answering with 10, ``DOWN`` ~30 s)."""
        why = installed()
        if why:
            raise LabError(f"lab {lab.name}: Slurm {why} (apt-get install slurm-wlm munge)")
        self = cls(lab)
        if self.dir.exists():
            stop(lab)
            shutil.rmtree(self.dir, ignore_errors=True)  # stop removed it already
        for sub in ("munge", "ctld", *(f"nodes/{h.name}" for h in lab.hosts)):
            (self.dir / sub).mkdir(parents=True, mode=0o700)
        gateway = lab.state["mgmt"]["gateway"]
        ports = (_free_port(gateway), _free_port(gateway))
        self.conf.write_text(_conf(lab, self.dir, *ports, slurmd_timeout=slurmd_timeout))
        (self.dir / "gres.conf").write_text(_gres_conf(lab, self.dir))
        prolog = self.dir / "task_prolog.sh"
        bins = lab.dir / "hosts"  # a lab folder: no quoting needed
        prolog.write_text(f'#!/bin/sh\necho "export PATH={bins}/$SLURMD_NODENAME/bin:$PATH"\n')
        prolog.chmod(0o755)
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        state: dict[str, Any] = {"pids": {}}
        try:
            m = self.dir / "munge"
            self._spawn(
                state,
                "munged",
                [
                    _which("munged") or "munged",
                    "-F",
                    "--force",
                    f"--key-file={key}",
                    f"--socket={m}/munge.socket",
                    f"--pid-file={m}/munged.pid",
                    f"--log-file={m}/munged.log",
                    f"--seed-file={m}/munged.seed",
                ],
            )
            _wait(lambda: (m / "munge.socket").exists(), timeout, "munged socket", self)
            self._spawn(
                state,
                "slurmctld",
                [_which("slurmctld") or "slurmctld", "-D", "-c", "-i", "-f", str(self.conf)],
            )
            slurmd = shlex.join([_which("slurmd") or "slurmd", "-D", "-f", str(self.conf)])
            expose = self._expose_source()
            for h in lab.hosts:
                line = f"{_CGROUP_V1} {expose}exec {slurmd} -N {h.name}"
                self._spawn(state, f"slurmd:{h.name}", lab.nsenter_argv(h.name, ["sh", "-c", line]))
            _wait(self._all_idle, timeout, "every slurmd idle", self)
        except BaseException:
            _stop_pids(state)
            raise
        return self

    def _expose_source(self) -> str:
        """A shell prefix for each slurmd: ``run --slurm``'s batch script runs this fleetctl on
        a lab host, whose private ``/tmp`` hides a checkout there (a clone under /tmp, or an
        editable install pointing into one). Such a tree is copied into the lab's Slurm folder
        and shown at its own path by a symlink in each host's private folder, as a shared home
        shows it on a cluster. Nothing to do for a tree the hosts already see."""
        from fleetctl.lab.core import HOST_PRIVATE  # core imports this module's users

        root = Path(__file__).resolve().parents[2]
        where = str(root)
        if not any(where == h or where.startswith(h + "/") for h in HOST_PRIVATE):
            return ""
        copy = self.dir / "source"
        shutil.copytree(
            root / "fleetctl",
            copy / "fleetctl",
            ignore=shutil.ignore_patterns("__pycache__"),
            symlinks=True,
        )
        link = f"mkdir -p {shlex.quote(str(root.parent))} && "
        return link + f"ln -sfn {shlex.quote(str(copy))} {shlex.quote(where)} && "

    def _spawn(self, state: dict[str, Any], key: str, argv: list[str]) -> None:
        log = open(self.dir / f"{key.replace(':', '-')}.out", "ab")  # noqa: SIM115
        with log:
            p = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,
            )
        state["pids"][key] = [p.pid, procs.start_time(p.pid)]
        tmp = self.dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.dir / STATE_FILE)

    def _all_idle(self) -> bool:
        out = self.scontrol("show", "node", "-o", check=False)
        states = re.findall(r"\bState=(\S+)", out)
        return len(states) == len(self.lab.hosts) and all(s.startswith("IDLE") for s in states)

    def wait_idle(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every node is idle again (a job just ended leaves them COMPLETING a moment;
        one submitted then waits for slurmctld's next scheduling pass, seconds later)."""
        _wait(self._all_idle, timeout, "every node idle", self)

    def scontrol(self, *args: str, check: bool = True) -> str:
        p = subprocess.run(
            ["scontrol", *args], capture_output=True, text=True, env=self.env(), timeout=10
        )
        if check and p.returncode != 0:
            raise LabError(f"scontrol {' '.join(args)}: {p.stderr.strip()}")
        return p.stdout

    # ------------------------------------------------------------------ jobs
    def allocate(self, n: int, *extra: str, timeout: float = 30.0) -> tuple[str, str]:
        """``salloc -N n --no-shell [EXTRA…]``: the allocation's (job id, node list)."""
        p = subprocess.run(
            ["salloc", f"--nodes={n}", "--no-shell", f"--immediate={int(timeout)}", *extra],
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout + 5,
        )
        m = re.search(r"Granted job allocation (\d+)", p.stderr + p.stdout)
        if p.returncode != 0 or not m:
            raise LabError(f"salloc -N {n}: {(p.stderr or p.stdout).strip()}")
        job = m.group(1)
        out = self.scontrol("show", "job", "-o", job)
        nodes = re.search(r"\bNodeList=(\S+)", out)
        if not nodes:
            raise LabError(f"scontrol show job {job}: no NodeList in {out!r}")
        return job, nodes.group(1)

    def kill_slurmd(self, host: str) -> None:
        """SIGKILL ``host``'s slurmd (by its recorded PID; the job steps' slurmstepd live on,
        as on a node whose daemon died): a fault for lost-node tests."""
        state = json.loads((self.dir / STATE_FILE).read_text())
        pid, started = state["pids"][f"slurmd:{host}"]
        if not procs.same_process(pid, started):
            raise LabError(f"lab {self.lab.name}: slurmd of {host} is not running")
        pending = [(c, procs.start_time(c)) for c in procs.children(pid)]
        for c, _ in pending:
            procs.kill(c)
        stuck = procs.wait_gone(pending, STOP_TIMEOUT)
        if stuck:
            raise LabError(f"lab {self.lab.name}: slurmd of {host} still running: {stuck}")

    def cancel(self, job: str) -> None:
        subprocess.run(["scancel", job], capture_output=True, env=self.env(), timeout=10)


def _wait(ok: Any, timeout: float, what: str, slurm: SlurmLab) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            logs = sorted(slurm.dir.glob("*.out"))
            tail = " | ".join(
                f"{p.name}: {p.read_text(errors='replace').strip()[-300:]}" for p in logs
            )
            raise LabError(
                f"lab {slurm.lab.name}: Slurm not ready ({what}) in {timeout:g}s; {tail}"
            )
        time.sleep(0.1)


def _stop_pids(state: dict[str, Any]) -> list[str]:
    """Kill every recorded daemon (verified by start time); slurmd's nsenter takes its child."""
    stopped: list[str] = []
    pending: list[tuple[int, int | None]] = []
    for key, (pid, started) in state.get("pids", {}).items():
        if not procs.same_process(pid, started):
            continue
        kids = [(c, procs.start_time(c)) for c in procs.children(pid)]
        for c, st in kids:
            procs.kill(c)
            pending.append((c, st))
        procs.kill(pid)
        pending.append((pid, started))
        stopped.append(f"{key} pid {pid}")
    stuck = procs.wait_gone(pending, STOP_TIMEOUT)
    if stuck:
        raise LabError(f"Slurm daemons still running: pids {stuck}")
    return stopped


def stop(lab: Lab, progress: Callable[[str], None] | None = None) -> list[str]:
    """Stop the lab's Slurm daemons by PID (idempotent); what was stopped."""
    path = slurm_dir(lab) / STATE_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if progress is not None:
        progress(f"stopping Slurm's daemons: up to {STOP_TIMEOUT:g} s")
    stopped = _stop_pids(state)
    shutil.rmtree(slurm_dir(lab), ignore_errors=True)  # config, key, spools, logs: all of it
    return stopped
