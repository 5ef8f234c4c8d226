"""Measurement 1 (fan-out of ``hostname``) and the SSH-layer profile behind it.

Every tool runs as a fresh process, the way an operator runs it, so its start-up (Python
imports included) counts. Tools take turns inside each repetition, which spreads the noise of a
shared 2-core machine over all of them instead of favouring whoever ran in a quiet second.
Each sample is checked: every host must answer with its own name, else the row fails.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import shlex
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from common import (
    PY,
    Result,
    SampleFailed,
    Timed,
    finish_row,
    fleetctl_argv,
    repeat,
    run_timed,
    tail,
)

from fleetctl.cli.nodeset import fold

SLOW_EXIT = "fleetctl exec, normal interpreter exit (A/B)"

FABRIC_SCRIPT = """
import sys
from fabric import Config, ThreadingGroup
cfg, hosts = sys.argv[1], sys.argv[2].split(",")
g = ThreadingGroup(*hosts, config=Config(runtime_ssh_path=cfg))
for c, r in g.run("hostname", hide=True).items():
    print(f"{c.original_host}: {r.stdout.strip()}")
"""

ASYNCSSH_SCRIPT = """
import asyncio, sys
import asyncssh
key, known, pairs = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
async def one(name, addr):
    async with asyncssh.connect(addr, username="root", client_keys=[key], known_hosts=known,
                                agent_path=None, config=[]) as c:
        r = await c.run("hostname")
        return name, r.stdout.strip()
async def main():
    for name, out in await asyncio.gather(*[one(*p.split("=")) for p in pairs]):
        print(f"{name}: {out}")
asyncio.run(main())
"""


class FanoutBench:
    """The lab's hosts, per-N inventories, and one runner per tool."""

    def __init__(self, lab: Any, work: Path) -> None:
        self.lab = lab
        self.work = work
        self.cfg = str(lab.ssh_config)
        self.names = [h.name for h in lab.hosts]
        self.addr = {h.name: h.mgmt_addr for h in lab.hosts}
        self.ansible_home = work / "ansible"
        self.ansible_home.mkdir(exist_ok=True)
        (work / "ansible.cfg").write_text("[defaults]\n")

    # -- inputs ---------------------------------------------------------------------------
    def inventory(self, n: int) -> str:
        """The lab's hosts.yml cut to its first n hosts (every tool reads the same hosts)."""
        path = self.work / f"hosts_{n}.yml"
        if not path.exists():
            doc = yaml.safe_load(Path(self.lab.inventory_path).read_text())
            hosts = doc["all"]["children"]["nodes"]["hosts"]
            keep = {k: hosts[k] for k in list(hosts)[:n]}
            doc["all"]["children"]["nodes"]["hosts"] = keep
            path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return str(path)

    def hosts(self, n: int) -> list[str]:
        return self.names[:n]

    def check(self, timed: Timed, n: int, pattern: str = "{h}: {h}") -> tuple[float, dict]:
        """Every host answered with its own name, exactly once; else the sample fails."""
        p = timed.proc
        want = {pattern.format(h=h) for h in self.hosts(n)}
        got = [x.strip() for x in p.stdout.splitlines() if x.strip()]
        if p.returncode != 0 or not want.issubset(got):
            missing = fold(sorted(x.split(":")[0] for x in want - set(got)))
            raise SampleFailed(
                f"exit {p.returncode}, missing {missing or '-'}: {tail(p.stderr or p.stdout)}"
            )
        return timed.seconds, {"client CPU s": timed.cpu}

    # -- tools ----------------------------------------------------------------------------
    def tools(self, n: int, *, extra: bool = True) -> dict[str, Callable[[], tuple[float, dict]]]:
        hosts = self.hosts(n)
        wlist = fold(hosts)
        inv = self.inventory(n)
        fl = fleetctl_argv()
        pdsh_env = dict(os.environ, PDSH_SSH_ARGS_APPEND=f"-F {self.cfg}")
        ans_env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(self.work / "ansible.cfg"),
            ANSIBLE_HOME=str(self.ansible_home),
            ANSIBLE_LOCAL_TEMP=str(self.ansible_home / "tmp"),
            # Cold connections like every other tool: no ControlPersist master left from the
            # previous repetition (ansible's default would reuse it for 60 s).
            ANSIBLE_SSH_ARGS="-o ControlMaster=no -o ControlPersist=no",
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_STDOUT_CALLBACK="default",
        )
        ssh_loop = (
            " ".join(f'echo "{h}: $(ssh -F {shlex.quote(self.cfg)} {h} hostname)" &' for h in hosts)
            + " wait"
        )

        def ansible(forks: int | None) -> tuple[float, dict]:
            argv = ["ansible", "-i", inv, "all", "-m", "raw", "-a", "hostname"]
            if forks:
                argv += ["-f", str(forks)]
            t = run_timed(argv, env=ans_env)
            ok = t.proc.stdout.count("| CHANGED | rc=0")
            if t.proc.returncode != 0 or ok != n:
                raise SampleFailed(f"exit {t.proc.returncode}, {ok}/{n} ok: {tail(t.proc.stdout)}")
            return t.seconds, {"client CPU s": t.cpu}

        runners: dict[str, Callable[[], tuple[float, dict]]] = {
            "fleetctl exec": lambda: self.check(
                run_timed([*fl, "exec", "-i", inv, "--", "hostname"]), n
            ),
            "pdsh -R ssh": lambda: self.check(
                run_timed(["pdsh", "-R", "ssh", "-f", "64", "-w", wlist, "hostname"], env=pdsh_env),
                n,
            ),
            "clush": lambda: self.check(
                run_timed(["clush", "-f", "64", "-w", wlist, "-o", f"-F {self.cfg}", "hostname"]), n
            ),
            "ansible -m raw (default forks 5)": lambda: ansible(None),
            "ansible -m raw -f 64": lambda: ansible(64),
            "parallel ssh (bash &)": lambda: self.check(run_timed(["bash", "-c", ssh_loop]), n),
        }
        if extra:
            # A/B of the CLI's fast exit: the same command through main(argv), which leaves by
            # a normal SystemExit and so pays the interpreter's module teardown.
            slow = "import sys; from fleetctl.cli import main; main(sys.argv[1:])"
            runners[SLOW_EXIT] = lambda: self.check(
                run_timed([PY, "-c", slow, "exec", "-i", inv, "--", "hostname"]), n
            )
            runners["fabric ThreadingGroup"] = lambda: self.check(
                run_timed([PY, "-c", FABRIC_SCRIPT, self.cfg, ",".join(hosts)]), n
            )
            if _importable("asyncssh"):
                pairs = ",".join(f"{h}={self.addr[h]}" for h in hosts)
                runners["asyncssh (asyncio)"] = lambda: self.check(
                    run_timed(
                        [
                            PY,
                            "-c",
                            ASYNCSSH_SCRIPT,
                            str(self.lab.key_path),
                            str(self.lab.known_hosts),
                            pairs,
                        ]
                    ),
                    n,
                )
        return runners

    def fanout(self, sizes: list[int], repeats: int, *, warmup: bool = True) -> list[Result]:
        """Measurement 1: every tool × every N, tools interleaved within each repetition."""
        results: list[Result] = []
        for n in sizes:
            runners = self.tools(n)
            rows = {name: Result("fanout", name, n) for name in runners}
            if not _importable("asyncssh"):
                results.append(
                    Result(
                        "fanout",
                        "asyncssh (asyncio)",
                        n,
                        failed="not measured: asyncssh is not installed",
                    )
                )
            if warmup:  # page cache, ansible's first-run setup: not part of any sample
                for fn in runners.values():
                    with contextlib.suppress(SampleFailed, subprocess.TimeoutExpired):
                        fn()
            for _ in range(repeats):
                for name, fn in runners.items():
                    row = rows[name]
                    if not (row.failures >= 2 and not row.samples):  # broken: stop trying
                        repeat(row, 1, fn, finish=False)
            results.extend(finish_row(r) for r in rows.values())
            results.append(self.open_floor(n, repeats))
        return results

    def open_floor(self, n: int, repeats: int) -> Result:
        """``hostname`` over connections that are already open (what later phases of a run pay)."""
        from fleetctl.plan.inventory import load_inventory
        from fleetctl.ssh.execute import execute
        from fleetctl.ssh.fanout import FanOut
        from fleetctl.transport.connection import SSHSettings

        row = Result("fanout", "fleetctl, connections already open (in-process)", n)
        nodes = load_inventory(self.inventory(n)).nodes
        with FanOut(nodes, SSHSettings()) as fleet:
            conn = fleet.connect()
            if not conn.ok:
                row.failed = f"connect failed: {list(conn.failed.values())[:1]}"
                return row

            def once() -> tuple[float, dict]:
                c0 = _self_cpu()
                r = execute(fleet, "hostname", timeout=30)
                if not r.ok or any(x.stdout.strip() != x.node for x in r.runs):
                    raise SampleFailed(f"{[x.status for x in r.failed][:2]}")
                return r.seconds, {"client CPU s": _self_cpu() - c0}

            once()
            repeat(row, repeats, once)
        return row


def _self_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _importable(module: str) -> bool:
    p = subprocess.run([PY, "-c", f"import {module}"], capture_output=True)
    return p.returncode == 0


# --------------------------------------------------------------------------- SSH-layer profile


class _KexLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.kex: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("Kex: "):
            self.kex.append(msg[5:].strip())


def ssh_profile(lab: Any, work: Path, repeats: int, *, quick: bool = False) -> list[Result]:
    """Where one connection's time goes: start-up imports, handshake (kex, key type, fabric
    wrapper vs bare paramiko), client CPU of OpenSSH's default kex, and one remote command."""
    import paramiko

    from fleetctl.plan.inventory import load_inventory
    from fleetctl.transport.connection import SSHSettings
    from fleetctl.transport.ssh import SSHConnection

    out: list[Result] = []
    node = load_inventory(lab.inventory_path).nodes[0]
    rounds = 1 if quick else max(repeats, 3) * 4

    # Start-up: what a fresh `fleetctl` pays before its first packet.
    fl = fleetctl_argv()
    startups = {
        "python -c pass (interpreter)": [PY, "-c", "pass"],
        "python -c 'import paramiko'": [PY, "-c", "import paramiko"],
        "python -c 'import fabric'": [PY, "-c", "import fabric"],
        "python -c 'import fleetctl.cli' (every command)": [PY, "-c", "import fleetctl.cli"],
        "fleetctl --version": [*fl, "--version"],
        "fleetctl exec --help": [*fl, "exec", "--help"],
        "python -c 'import asyncssh'": [PY, "-c", "import asyncssh"],
    }
    for name, argv in startups.items():
        row = Result("startup", name)

        def once(argv: list[str] = argv) -> tuple[float, dict]:
            t = run_timed(argv)
            if t.proc.returncode != 0:
                raise SampleFailed(f"exit {t.proc.returncode}: {tail(t.proc.stderr)}")
            return t.seconds, {"CPU s": t.cpu}

        out.append(repeat(row, rounds, once))

    # Handshakes, one at a time (no contention): wall and this process's CPU per connection.
    rsa = work / "id_rsa"
    if not rsa.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "rsa", "-b", "3072", "-N", "", "-f", str(rsa)], check=True
        )
        with open(lab.dir / "authorized_keys", "a") as f:  # the bench's own lab: its own key file
            f.write(Path(str(rsa) + ".pub").read_text())
    kexlog = _KexLog()
    tlog = logging.getLogger("paramiko.transport")
    tlog.addHandler(kexlog)
    old_level = tlog.level
    tlog.setLevel(logging.DEBUG)
    curve_only = {
        "kex": [k for k in paramiko.Transport._preferred_kex if not k.startswith("curve25519")]
    }

    def raw(disabled: dict | None, key: str) -> Callable[[], tuple[float, dict]]:
        def once() -> tuple[float, dict]:
            c0, t0 = _self_cpu(), time.perf_counter()
            c = paramiko.SSHClient()
            c.load_host_keys(str(lab.known_hosts))
            c.set_missing_host_key_policy(paramiko.RejectPolicy())
            c.connect(
                node.address,
                username="root",
                key_filename=key,
                look_for_keys=False,
                allow_agent=False,
                disabled_algorithms=disabled,
                timeout=10,
            )
            dt, cpu = time.perf_counter() - t0, _self_cpu() - c0
            c.close()
            return dt, {"CPU s": cpu}

        return once

    def fleetctl_conn() -> tuple[float, dict]:
        c0, t0 = _self_cpu(), time.perf_counter()
        c = SSHConnection(node, SSHSettings())
        dt, cpu = time.perf_counter() - t0, _self_cpu() - c0
        c.close()
        return dt, {"CPU s": cpu}

    try:
        cases = {
            "paramiko default kex list (mlkem768x25519 first), ed25519 key": raw(
                None, str(lab.key_path)
            ),
            "paramiko curve25519-sha256 only, ed25519 key": raw(curve_only, str(lab.key_path)),
            "paramiko default kex, RSA-3072 key": raw(None, str(rsa)),
            "fleetctl SSHConnection (paramiko, fleetctl.transport.dial)": fleetctl_conn,
        }
        for name, fn in cases.items():
            kexlog.kex.clear()
            fn()
            row = repeat(Result("handshake", name), rounds, fn)
            row.note = f"kex {kexlog.kex[-1]}" if kexlog.kex else ""
            out.append(row)
    finally:
        tlog.removeHandler(kexlog)
        tlog.setLevel(old_level)

    # OpenSSH client, one connection + `true`: client CPU of its default kex vs curve25519.
    for kex in ("default", "sntrup761x25519-sha512@openssh.com", "curve25519-sha256"):
        argv = ["ssh", "-F", str(lab.ssh_config)]
        if kex != "default":
            argv += ["-o", f"KexAlgorithms={kex}"]
        argv += [node.name, "true"]

        def once(argv: list[str] = argv) -> tuple[float, dict]:
            t = run_timed(argv)
            if t.proc.returncode != 0:
                raise SampleFailed(f"exit {t.proc.returncode}: {tail(t.proc.stderr)}")
            return t.seconds, {"CPU s": t.cpu}

        out.append(repeat(Result("openssh", f"ssh node1 true, kex {kex}"), rounds, once))

    # One remote command over an open connection: sshd + the login shell's rc files.
    out.extend(_remote_commands(node, rounds, "lab's minimal ~/.bashrc"))
    # A command that closes its output early, then runs on: the client must sleep, not spin,
    # until the exit status comes (SSHConnection.run once woke ~23,000 times for this).
    with SSHConnection(node, SSHSettings()) as c:

        def closes_early() -> tuple[float, dict]:
            c0, t0 = _self_cpu(), time.perf_counter()
            r = c.run("exec >&- 2>&-; sleep 0.5", timeout=30)
            if r.exit_code != 0:
                raise SampleFailed(f"exited {r.exit_code}")
            return time.perf_counter() - t0, {"client CPU s": _self_cpu() - c0}

        row = Result("remote", "command closing its stdout, then running 0.5 s: client CPU")
        out.append(repeat(row, max(1, rounds // 4), closes_early))
    from fleetctl.lab import Lab

    heavy = Lab.up(1, networks=1, machine_bashrc=True)  # this machine's own ~/.bashrc
    try:
        hnode = load_inventory(heavy.inventory_path).nodes[0]
        out.extend(_remote_commands(hnode, rounds, "this machine's ~/.bashrc", ("true",)))
    finally:
        heavy.down()
    return out


def _remote_commands(
    node: Any, rounds: int, label: str, cmds: tuple[str, ...] = ("true", "exec true", "hostname")
) -> list[Result]:
    from fleetctl.transport.connection import SSHSettings
    from fleetctl.transport.ssh import SSHConnection

    out: list[Result] = []
    with SSHConnection(node, SSHSettings()) as c:
        for cmd in cmds:

            def once(cmd: str = cmd) -> float:
                t0 = time.perf_counter()
                r = c.run(cmd, timeout=30)
                if r.exit_code != 0:
                    raise SampleFailed(f"`{cmd}` exited {r.exit_code}")
                return time.perf_counter() - t0

            row = Result("remote", f"one command over an open connection: {cmd} ({label})")
            out.append(repeat(row, rounds, once))
    return out


def make_work() -> Path:
    return Path(tempfile.mkdtemp(prefix="fleetctl-bench-"))
