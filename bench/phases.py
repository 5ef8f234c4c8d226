"""Measurements 2–6 through the real CLI: teardown, lost node, push, log streaming, pipeline.

Timings come from the run folder ``fleetctl run`` writes (events.log timestamps, job.json) and
from the job's own output (a failing rank prints the time it exits); lab hosts share this
machine's clock, so node and controller timestamps compare directly. Controller bytes are the
lab bridge's transmit counter (everything this machine sent to any lab host, headers included),
the same meter for every tool; ``fleetctl push`` also reports its own payload count.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from common import Result, SampleFailed, finish_row, fleetctl_argv, repeat, run_timed, tail

from fleetctl.errors import FleetctlError
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.runfolder import read_job

FAIL_SCRIPT = """
import os, subprocess, sys, time
rank = int(os.environ["FLEET_NODE_RANK"])
if rank == 1:
    time.sleep(float(sys.argv[1]))
    print(f"FAIL_AT {time.time():.6f}", flush=True)
    sys.exit(1)
child = subprocess.Popen(["sleep", "300"])  # a grandchild of the job, must go too
child.wait()
"""

SLEEP_SCRIPT = """
import subprocess
subprocess.Popen(["sleep", "300"]).wait()
"""

NOOP_SCRIPT = "print('ok')\n"

# Every rank prints once, then waits silently in a function forever: a hung job.
STALL_SCRIPT = """
import time
print(f"QUIET_AT {time.time():.6f}", flush=True)
def waiting_for_a_peer():
    time.sleep(600)
waiting_for_a_peer()
"""

LOG_SCRIPT = """
import os, sys, time
rank = int(os.environ["FLEET_NODE_RANK"])
rate, seconds = int(sys.argv[1]), float(sys.argv[2])
total = int(rate * seconds)
pad = "x" * 40
out = sys.stdout
t0 = time.monotonic()
batch = max(1, rate // 100)
for i in range(0, total, batch):
    out.write("".join(f"L{rank}:{j:07d} {pad}\\n" for j in range(i, min(i + batch, total))))
    out.flush()
    ahead = t0 + (i + batch) / rate - time.monotonic()
    if ahead > 0:
        time.sleep(ahead)
"""

LINE_RE = re.compile(r"L(\d+):(\d{7}) x{40}")
EVENT_RE = re.compile(r"^(\S+Z) (\S+) ?(.*)$")


def parse_iso(ts: str) -> float:
    return (
        dt.datetime.strptime(ts, "%Y-%m-%dT%H:%M:%S.%fZ")
        .replace(tzinfo=dt.timezone.utc)
        .timestamp()
    )


def events(folder: Path) -> list[tuple[float, str, str]]:
    """events.log as (time, kind, text)."""
    out = []
    for line in (folder / "events.log").read_text().splitlines():
        m = EVENT_RE.match(line)
        if m:
            out.append((parse_iso(m.group(1)), m.group(2), m.group(3)))
    return out


@contextlib.contextmanager
def sized_lab(n: int, prefix: str, workdir: str) -> Any:
    """A lab of ``n`` hosts (2 networks), a scratch folder and the hosts' inventory with
    ``workdir``: ``(lab, bench, inventory, folder)``; the lab is taken down after. The A/B
    scripts' per-size loop (bench/ab.py, bench/ab_check.py)."""
    import tempfile

    from fleetctl.lab import Lab

    lab = Lab.up(n, networks=2)
    try:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            bench = PhaseBench(lab, Path(tmp), quick=False)
            yield lab, bench, bench.inventory(n, workdir), Path(tmp)
    finally:
        lab.down()


class PhaseBench:
    """Runs ``fleetctl run``/``push`` on the lab with per-measurement inventories and workdirs."""

    def __init__(self, lab: Any, work: Path, *, quick: bool) -> None:
        self.lab, self.work, self.quick = lab, work, quick
        self.fl = fleetctl_argv()
        self.env = dict(os.environ)
        self.env.pop("SSH_AUTH_SOCK", None)
        self.env.setdefault("FLEETCTL_SSH_CONFIG", "/dev/null")
        self.env["FLEETCTL_CACHE_DIR"] = str(work / "cache")

    # -- helpers --------------------------------------------------------------------------
    def n(self, want: int) -> int:
        return min(want, len(self.lab.hosts))

    def inventory(self, n: int, workdir: str) -> str:
        """The lab's hosts.yml cut to n hosts, each with ``fleetctl_workdir`` = workdir."""
        name = re.sub(r"\W", "_", workdir.strip("/"))
        path = self.work / f"inv_{n}_{name}.yml"
        doc = yaml.safe_load(Path(self.lab.inventory_path).read_text())
        hosts = doc["all"]["children"]["nodes"]["hosts"]
        keep = {k: dict(hosts[k], fleetctl_workdir=workdir) for k in list(hosts)[:n]}
        doc["all"]["children"]["nodes"]["hosts"] = keep
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return str(path)

    def code_dir(self, name: str, files: dict[str, str]) -> Path:
        d = self.work / f"code-{name}"
        d.mkdir(exist_ok=True)
        for rel, text in files.items():
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            (d / rel).write_text(text)
        return d

    def node_root(self, host: str) -> Path:
        """A node's private /root/.fleetctl seen from this machine (the lab binds it)."""
        return Path(self.lab.host_dir(host)) / "fleetctl"

    def node_path(self, host: str, workdir: str) -> Path:
        assert workdir.startswith("/root/.fleetctl/")
        return self.node_root(host) / workdir[len("/root/.fleetctl/") :]

    def tx_bytes(self) -> int:
        return int(Path(f"/sys/class/net/{self.lab.mgmt_bridge}/statistics/tx_bytes").read_text())

    def run_job(
        self,
        n: int,
        script: str,
        args: list[str],
        *,
        name: str,
        extra: list[str] | None = None,
        timeout: float = 180,
        during: Any = None,
        stdout_path: Path | None = None,
    ) -> dict[str, Any]:
        """``fleetctl run`` → its exit code, run folder, events, job.json, wall time, rusage."""
        code = self.code_dir(name, {"job.py": script})
        runs = self.work / f"runs-{name}"
        inv = self.inventory(n, f"/root/.fleetctl/bench-{name}")
        argv = [
            *self.fl,
            "run",
            "-i",
            inv,
            "--launcher",
            "plain",
            "--code-dir",
            str(code),
            "--runs-dir",
            str(runs),
            *(extra or []),
            str(code / "job.py"),
            *args,
        ]
        before = set(runs.iterdir()) if runs.exists() else set()
        out = open(stdout_path or os.devnull, "w")  # noqa: SIM115 - closed below
        t0 = time.time()
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.work,
            stdin=subprocess.DEVNULL,
        )
        err_chunks: list[str] = []
        reader = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
        reader.start()
        timer = threading.Timer(timeout, lambda: proc.send_signal(signal.SIGINT))
        timer.start()
        hwm = [0]
        poller = threading.Thread(target=_poll_hwm, args=(proc.pid, hwm), daemon=True)
        poller.start()
        status = None
        try:
            if during is not None:
                during(proc, runs, before)
            _, status, rusage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            timer.cancel()
            out.close()
            if status is None:
                proc.kill()
                proc.wait()
        wall = time.time() - t0
        reader.join(5)
        folders = [p for p in runs.iterdir() if p not in before] if runs.exists() else []
        folders = [p for p in folders if "." not in p.name]  # a retry's JOB.2: JOB's sibling
        if len(folders) != 1:
            raise SampleFailed(
                f"fleetctl run exit {proc.returncode}, no run folder: {tail(''.join(err_chunks))}"
            )
        folder = folders[0]
        return {
            "rc": proc.returncode,
            "folder": folder,
            "events": events(folder),
            "job": read_job(folder / "job.json"),
            "wall": wall,
            "t0": t0,
            "cpu": rusage.ru_utime + rusage.ru_stime,
            "maxrss_mb": rusage.ru_maxrss / 1024,
            "hwm_mb": hwm[0] / 1024,
            "stderr": "".join(err_chunks),
            "why": _why("".join(err_chunks), folder),
        }

    # -- 2. teardown ----------------------------------------------------------------------
    def teardown(self, repeats: int) -> list[Result]:
        n = self.n(8)
        row = Result("teardown", "fleetctl run: rank 1 exits 1, others sleep", n)
        delay = "1" if self.quick else "2"

        def once() -> tuple[float, dict]:
            r = self.run_job(n, FAIL_SCRIPT, [delay], name="teardown")
            if r["rc"] != 3:
                raise SampleFailed(f"expected exit 3, got {r['rc']}: {r['why']}")
            console = next(r["folder"].glob("1-*/console.log"), None)
            m = re.search(r"FAIL_AT (\d+\.\d+)", console.read_text()) if console else None
            if m is None:
                raise SampleFailed("rank 1's FAIL_AT line not in its collected console.log")
            fail_at = float(m.group(1))
            job: JobRecord = r["job"]
            if job.first_failure is None or job.first_failure.time is None:
                raise SampleFailed(f"exit 3 with no first failure in job.json: {r['why']}")
            seen = parse_iso(job.first_failure.time)
            verified = [
                t for t, k, text in r["events"] if k == "teardown" and text.startswith("verified")
            ]
            if not verified:
                raise SampleFailed("teardown not verified: " + r["why"])
            td = job.teardown or {}
            return verified[0] - fail_at, {
                "exit → failure seen s": seen - fail_at,
                "teardown call s": td.get("seconds"),
                "fleetctl run wall s": r["wall"],
            }

        row.note = (
            "from rank 1's own exit timestamp to the `teardown verified` event "
            "(every node scanned: no process with the job's FLEET_JOB_ID left)"
        )
        return [repeat(row, repeats, once)]

    # -- 3. lost node ---------------------------------------------------------------------
    def lost_node(self, repeats: int) -> list[Result]:
        n = self.n(8)
        if n < 2:
            raise RuntimeError("needs at least 2 lab hosts")
        victim = self.lab.hosts[n - 1].name
        row = Result("lost", f"fleetctl run: cut {victim}'s link while every rank sleeps", n)
        cut: dict[str, float] = {}

        def during(proc: subprocess.Popen, runs: Path, before: set) -> None:
            deadline = time.time() + 60
            while time.time() < deadline and proc.poll() is None:
                folders = [p for p in runs.iterdir() if p not in before] if runs.exists() else []
                if folders and (folders[0] / "job.json").exists():
                    with contextlib.suppress(FleetctlError):
                        job = read_job(folders[0] / "job.json")
                        if job.nodes and all(x.state == "running" for x in job.nodes):
                            break
                time.sleep(0.05)
            else:
                return
            time.sleep(0.5)
            cut["t"] = time.time()
            self.lab.cut_link(victim)

        def once() -> tuple[float, dict]:
            cut.clear()
            try:
                r = self.run_job(n, SLEEP_SCRIPT, [], name="lost", during=during)
            finally:
                if cut:
                    self.lab.heal_link(victim)
            if "t" not in cut:
                raise SampleFailed(f"the job never had every rank running: {r['why']}")
            lost = [t for t, k, text in r["events"] if k == "lost"]
            stopping = [
                t for t, k, text in r["events"] if k == "teardown" and text.startswith("stopping")
            ]
            td = r["job"].teardown or {}
            if not lost or not stopping or not td:
                raise SampleFailed(f"no lost/teardown events (exit {r['rc']}): {r['why']}")
            finished = stopping[0] + float(td["seconds"])
            return finished - cut["t"], {
                "cut → lost detected s": lost[0] - cut["t"],
                "teardown call s": td["seconds"],
                "cut → fleetctl exited s": r["t0"] + r["wall"] - cut["t"],
            }

        row.note = (
            "from the link cut to teardown finished on the other nodes (the `stopping` "
            "event + teardown's own duration); default --lost-timeout 5"
        )
        return [repeat(row, repeats, once)]

    # -- 3b. stall -------------------------------------------------------------------------
    def stall(self, repeats: int) -> list[Result]:
        n = self.n(8)
        stall = 2.0 if self.quick else 3.0
        row = Result("stall", f"fleetctl run --stall-timeout {stall:g}: every rank silent", n)

        def once() -> tuple[float, dict]:
            r = self.run_job(
                n, STALL_SCRIPT, [], name="stall", extra=["--stall-timeout", f"{stall:g}"]
            )
            if r["rc"] != 3 or not str(r["job"].verdict or "").startswith("stalled"):
                raise SampleFailed(f"expected a stalled exit 3, got {r['rc']}: {r['why']}")
            quiet = [
                float(m.group(1))
                for p in r["folder"].glob("*/console.log")
                for m in re.finditer(r"QUIET_AT (\d+\.\d+)", p.read_text())
            ]
            if len(quiet) != n:
                raise SampleFailed(f"{len(quiet)} of {n} ranks printed QUIET_AT")
            threshold = max(quiet) + stall  # the last line anyone printed, plus the timeout
            notices = [(t, text) for t, k, text in r["events"] if k == "notice"]
            dump_start = next((t for t, text in notices if text.startswith("dumping")), None)
            dumped = [t for t, text in notices if "stacks:" in text]
            if dump_start is None or not dumped:
                raise SampleFailed("no stack dump events: " + r["why"])
            methods = [x.get("methods") or {} for x in r["job"].stack_nodes or []]
            return r["t0"] + r["wall"] - threshold, {
                "threshold → stalled seen s": next(
                    t for t, k, text in r["events"] if k == "failure"
                )
                - threshold,
                "stack dump, all nodes in parallel s": max(dumped) - dump_start,
                "processes dumped by py-spy": sum(m.get("py-spy", 0) for m in methods),
            }

        row.note = (
            "from the stall threshold (the last rank's last line + the timeout) to fleetctl's "
            "exit: stalled seen, every process's stack dumped, teardown verified, logs collected"
        )
        return [repeat(row, repeats, once)]

    # -- 4. push --------------------------------------------------------------------------
    def push(self, repeats: int) -> list[Result]:
        n = self.n(16)
        out: list[Result] = []
        hosts = [h.name for h in self.lab.hosts[:n]]
        cfg = str(self.lab.ssh_config)
        wd = "/root/.fleetctl/bench-push"
        inv = self.inventory(n, wd)
        files = {f"pkg/mod{i:03d}.py": f"# module {i}\n" + "x = 1\n" * 400 for i in range(200)}
        files["train.py"] = "print('train')\n"
        code = self.code_dir("push", files)
        rsync_dest = "/root/.fleetctl/bench-rsync/"

        def fleet_push(*extra: str) -> tuple[float, dict]:
            b0 = self.tx_bytes()
            t = run_timed(
                [*self.fl, "push", "-i", inv, "--json", "--keep", "2", *extra],
                env=self.env,
                cwd=str(self.work),
                timeout=900,
            )
            sent = self.tx_bytes() - b0
            if t.proc.returncode != 0:
                raise SampleFailed(
                    f"fleetctl push exit {t.proc.returncode}: "
                    f"{tail(t.proc.stderr or t.proc.stdout)}"
                )
            rep = json.loads(t.proc.stdout)
            return t.seconds, {
                "controller MB (bridge)": sent / 1e6,
                "payload MB (push report)": rep.get("controller_bytes", 0) / 1e6,
                "client CPU s": t.cpu,
            }

        def par_rsync() -> tuple[float, dict]:
            loop = (
                " ".join(
                    f"rsync -a --delete --stats -e {shlex.quote('ssh -F ' + cfg)} "
                    f"{shlex.quote(str(code))}/ {h}:{rsync_dest} >{self.work}/rsync-{h}.log 2>&1 &"
                    for h in hosts
                )
                + " wait"
            )
            b0 = self.tx_bytes()
            t = run_timed(["bash", "-c", loop], timeout=900)
            sent = self.tx_bytes() - b0
            logs = [(self.work / f"rsync-{h}.log").read_text() for h in hosts]
            if any("Total bytes sent" not in x for x in logs):
                raise SampleFailed(
                    "rsync failed: " + tail(next(x for x in logs if "Total bytes sent" not in x))
                )
            return t.seconds, {"controller MB (bridge)": sent / 1e6, "client CPU s": t.cpu}

        def par_scp(archive: Path) -> tuple[float, dict]:
            loop = (
                " ".join(
                    f"scp -q -F {shlex.quote(cfg)} {shlex.quote(str(archive))} "
                    f"{h}:/root/.fleetctl/bench-env.tar.gz &"
                    for h in hosts
                )
                + " wait"
            )
            b0 = self.tx_bytes()
            t = run_timed(["bash", "-c", loop], timeout=900)
            if t.proc.returncode != 0:
                raise SampleFailed(f"scp: {tail(t.proc.stderr)}")
            return t.seconds, {
                "controller MB (bridge)": (self.tx_bytes() - b0) / 1e6,
                "client CPU s": t.cpu,
            }

        # no-op: both tools already hold this exact tree
        fleet_push("--code", str(code))
        par_rsync()
        out.append(
            repeat(
                Result("push", "no-op code push: fleetctl push", n),
                repeats,
                lambda: fleet_push("--code", str(code)),
            )
        )
        out.append(
            repeat(
                Result("push", "no-op code push: parallel rsync -a (ssh)", n), repeats, par_rsync
            )
        )

        # a big change: a fresh incompressible file each sample (else the 2nd is a no-op)
        mb = 2 if self.quick else 200
        big = code / "data" / "big.bin"
        big.parent.mkdir(exist_ok=True)
        rows = {
            "fleetctl": Result("push", f"{mb} MB change: fleetctl push", n),
            "rsync": Result("push", f"{mb} MB change: parallel rsync -a (ssh)", n),
        }
        reps = repeats if self.quick else min(repeats, 3)
        for _ in range(reps):
            _write_random(big, mb)
            repeat(rows["fleetctl"], 1, lambda: fleet_push("--code", str(code)), finish=False)
            repeat(rows["rsync"], 1, par_rsync, finish=False)
        for r in rows.values():
            r.note = f"each sample a new {mb} MB file"
        out.extend(finish_row(r) for r in rows.values())
        big.unlink()

        # env archive distribution
        archive = self.env_archive(1 if self.quick else 64)
        size_mb = archive.stat().st_size / 1e6

        def clear_envs() -> None:
            for h in hosts:
                shutil.rmtree(self.node_path(h, wd) / "envs", ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    (self.node_root(h) / "bench-env.tar.gz").unlink()

        rows = {
            "fleetctl": Result(
                "push",
                f"env archive ({size_mb:.0f} MB) to every host: fleetctl push (peer default)",
                n,
            ),
            "scp": Result("push", f"env archive ({size_mb:.0f} MB): parallel scp", n),
        }
        for _ in range(repeats):
            clear_envs()
            repeat(
                rows["fleetctl"],
                1,
                lambda: fleet_push("--no-code", "--env", str(archive)),
                finish=False,
            )
            clear_envs()
            repeat(rows["scp"], 1, lambda: par_scp(archive), finish=False)
        clear_envs()
        rows["fleetctl"].note = "fleetctl unpacks and verifies the env too; scp only copies"
        out.extend(finish_row(r) for r in rows.values())
        return out

    def env_archive(self, noise_mb: int) -> Path:
        from fleetctl.testing.envbuild import build_env, build_fake_nccl

        work = self.work / "envbuild"
        lib = build_fake_nccl(work / "nccl" / "libnccl.so.2")
        return build_env(work, nccl_lib=lib, noise_mb=noise_mb, tag="bench").archive

    # -- 5. log streaming -----------------------------------------------------------------
    def logs(self, repeats: int) -> list[Result]:
        n = self.n(16)
        if self.quick:
            return [self._logs(n, 200, 2.0, repeats)]
        # the target rate, then a fifth of it: where streaming holds and where it breaks
        return [self._logs(n, 5000, 10.0, repeats), self._logs(n, 1000, 10.0, min(repeats, 3))]

    def _logs(self, n: int, rate: int, seconds: float, repeats: int) -> Result:
        row = Result("logs", f"{n} nodes × {rate} lines/s × {seconds:g} s via fleetctl run", n)
        expected = {(r, i) for r in range(n) for i in range(int(rate * seconds))}

        def once() -> tuple[float, dict]:
            stream = self.work / "logs-stream.txt"
            r = self.run_job(
                n,
                LOG_SCRIPT,
                [str(rate), str(seconds)],
                name="logs",
                extra=["--tail", "all"],
                stdout_path=stream,
                timeout=300,
            )
            if r["rc"] != 0:  # still count the lines: losing them is what this measures
                failures.append(f"fleetctl run exit {r['rc']}: {r['why']}")
            streamed = _lines_in(stream)
            collected: set[tuple[int, int]] = set()
            for log in r["folder"].glob("*/console*.log"):  # collected, else what streamed
                collected |= _lines_in(log)
            return r["wall"], {
                "fleetctl exit code": r["rc"],
                "lines expected": len(expected),
                "lost in live stream": len(expected - streamed),
                "lost in collected logs": len(expected - collected),
                "controller CPU s": r["cpu"],
                "fleetctl peak RSS MB": r["hwm_mb"],
            }

        failures: list[str] = []
        repeat(row, repeats, once)
        row.note = "time column = whole `fleetctl run` wall time"
        if failures:
            row.note += f"; {len(failures)} run(s) did not exit 0, first: {failures[0]}"
        return row

    # -- 5b. before ------------------------------------------------------------------------
    def before(self, repeats: int) -> list[Result]:
        """``run --before fab.py:prepare`` whose task prints MB of 100-byte lines on each node:
        the rate at which a task's output reaches the terminal and before.log."""
        n, mb = (1, 2) if self.quick else (min(4, self.n(4)), 20)
        row = Result("before", f"{n} node(s) × {mb} MB of task output via run --before", n)
        lines = mb * 10**6 // 101
        line = "x" * 100
        fab = self.work / "before-fab.py"
        fab.write_text(
            "from fabric import task\n\n@task\ndef prepare(c):\n"
            f"    c.run('yes {line} | head -n {lines}')\n"
        )

        def once() -> tuple[float, dict]:
            stream = self.work / "before-stream.txt"
            r = self.run_job(
                n,
                "print('ok')\n",
                [],
                name="before",
                extra=["--before", f"{fab}:prepare"],
                stdout_path=stream,
                timeout=600,
            )
            if r["rc"] != 0:
                raise SampleFailed(f"fleetctl run exit {r['rc']}: {r['why']}")
            streamed = _count(stream, lambda x: x.endswith(line))
            kept = sum(_count(log, lambda x: x == line) for log in r["folder"].glob("*/before.log"))
            if streamed != n * lines or kept != n * lines:
                raise SampleFailed(f"{n * lines} lines: {streamed} streamed, {kept} in before.log")
            return r["wall"], {
                "MB/s to the terminal": round(n * lines * 101 / 1e6 / r["wall"], 2),
                "controller CPU s": r["cpu"],
            }

        repeat(row, repeats, once)
        row.note = "time column = whole `fleetctl run` wall time (the job itself is a no-op)"
        return [row]

    # -- 6. pipeline ----------------------------------------------------------------------
    def pipeline(self, repeats: int) -> list[Result]:
        n = self.n(8)
        row = Result(
            "pipeline", "fleetctl run no-op job (check + no-op push + launch + collect)", n
        )
        self.run_job(n, NOOP_SCRIPT, [], name="pipeline")  # code now present: pushes are no-ops
        samples = iter(range(1_000_000))

        def once() -> tuple[float, dict]:
            # a cache of its own per sample, so the run's check really runs (a passing check is
            # reused for 120 s: the phase would time the cache)
            self.env["FLEETCTL_CACHE_DIR"] = str(self.work / f"cache-pipeline-{next(samples)}")
            r = self.run_job(n, NOOP_SCRIPT, [], name="pipeline")
            if r["rc"] != 0:
                raise SampleFailed(f"exit {r['rc']}: {r['why']}")
            ev = r["events"]

            def first(kind: str, prefix: str = "") -> float | None:
                return next((t for t, k, x in ev if k == kind and x.startswith(prefix)), None)

            marks = {
                "start": r["t0"],
                "check": first("phase", "checking"),
                "push": first("phase", "pushing"),
                "launch": first("phase", "launching"),
                "exited": max((t for t, k, _ in ev if k == "exit"), default=None),
                "collect": first("phase", "collecting"),
                "done": first("done"),
                "end": r["t0"] + r["wall"],
            }
            if any(v is None for v in marks.values()):
                missing = [k for k, v in marks.items() if v is None]
                raise SampleFailed(f"events.log lacks {missing}")
            names = list(marks)
            split = {f"{a}→{b} s": marks[b] - marks[a] for a, b in itertools.pairwise(names)}
            return r["wall"], split

        row.note = (
            "start→check: CLI start-up; check→push: connect + preflight; push→launch: "
            "no-op push + plan; launch→exited: launch to last exit; exited→collect: "
            "teardown verify; collect→done: log collection; done→end: exit"
        )
        cache = self.env["FLEETCTL_CACHE_DIR"]
        try:
            return [repeat(row, repeats, once)]
        finally:
            self.env["FLEETCTL_CACHE_DIR"] = cache


def _why(stderr: str, folder: Path) -> str:
    """fleetctl's last words plus the last events of the run: enough to see what went wrong."""
    try:
        ev = (folder / "events.log").read_text().splitlines()[-4:]
    except OSError:
        ev = []
    return f"{tail(stderr)} / events: " + " | ".join(x[11:] for x in ev)


def _poll_hwm(pid: int, out: list[int]) -> None:
    """Peak RSS of the fleetctl process itself (VmHWM, kB), read until it exits."""
    path = f"/proc/{pid}/status"
    while True:
        try:
            text = Path(path).read_text()
        except OSError:
            return
        m = re.search(r"VmHWM:\s+(\d+) kB", text)
        if m is None:  # a zombie: gone already
            return
        out[0] = max(out[0], int(m.group(1)))
        time.sleep(0.05)


def _count(path: Path, match: Any) -> int:
    with open(path, errors="replace") as f:
        return sum(1 for x in f if match(x.rstrip()))


def _lines_in(path: Path) -> set[tuple[int, int]]:
    got: set[tuple[int, int]] = set()
    with open(path, errors="replace") as f:
        for line in f:
            m = LINE_RE.search(line)
            if m:
                got.add((int(m.group(1)), int(m.group(2))))
    return got


def _write_random(path: Path, mb: int) -> None:
    with open(path, "wb") as f:
        for _ in range(mb):
            f.write(os.urandom(1 << 20))
