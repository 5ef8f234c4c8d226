"""Measurement: what fleetctl costs a job under Slurm (issue 24, item 7).

Two pairs, each taking turns inside every repetition (the noise of a shared machine spread
over both), on a real Slurm started on the lab (``fleetctl.lab.slurm``: munged, slurmctld, one
slurmd per host) and a no-op job on 3 nodes:

* submitted: a bare ``sbatch -W --nodes=3`` of a script that runs ``srun python3 -c pass``,
  against ``fleetctl run --slurm --nodes 3 --launcher plain noop.py`` (submit, queue wait,
  the run inside with its check, push and teardown, the output followed); goal ≤ 1.5 s more;
* inside an allocation (``salloc -N3 --no-shell``): a bare ``srun -N3 python3 -c pass``
  against ``fleetctl run --launcher plain noop.py`` with that allocation's variables, and the
  job steps such a run starts with no cached check (3: a probe per node, which claims node
  0's port and is then handed the supervisor).

A bare ``sbatch -W`` sleeps 2 s before it first asks whether its job has ended (then 8 s
more): a no-op job that ends within 2 s measures 2.0 s, one that Slurm starts late 10 s. So
the bare job is also measured as ``sbatch`` then ``scontrol show job`` every 0.1 s until it
has ended: submit, scheduling, the job, with no poll of sbatch's in it.

Where slurmctld starts the job is its own affair, so each submitted row also says the time
from the job's start (slurmctld's ``sched: Allocate`` line in its log, ms resolution) to the
command's return: that part is what the command and its job cost, with no scheduling in it.

Every sample starts from a Slurm at rest: its nodes idle and the last sample ended more than
3.2 s ago. slurmctld schedules batch jobs at most every ``batch_sched_delay`` (3 s by
default): a job submitted sooner after the last one started waits for the next pass (up to
3 s, bare or not), so without the rest the row measured after another gets that wait.

Code and run folders live in the lab's folder, which every lab host sees (a shared home).
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import statistics
import subprocess
import time
from typing import Any

from common import PY, Result, SampleFailed, Timed, finish_row, repeat, run_timed, tail

NODES = 3
STARTED = "from the job's start to the return s"
REST = 3.2  # s since the last job ended: slurmctld's batch_sched_delay (3 s) has passed
NOOP = "pass\n"
BARE_SCRIPT = "#!/bin/sh\nsrun python3 -c pass\n"


class SlurmBench:
    """Bare Slurm against fleetctl, submitted and inside an allocation."""

    def __init__(self, lab: Any, fl: list[str]) -> None:
        self.lab, self.fl = lab, fl

    def run(self, repeats: int) -> list[Result]:
        from fleetctl.lab.slurm import SlurmLab, installed, stop

        why = installed()
        if why:
            raise RuntimeError(f"Slurm {why} (apt-get install slurm-wlm munge)")
        if len(self.lab.hosts) < NODES:
            raise RuntimeError(f"needs a lab of {NODES} hosts")
        slurm = SlurmLab.start(self.lab)
        try:
            return self._measure(slurm, repeats)
        finally:
            stop(self.lab)
            shutil.rmtree(self.lab.dir / "bench-slurm", ignore_errors=True)

    def _measure(self, slurm: Any, repeats: int) -> list[Result]:
        work = self.lab.dir / "bench-slurm"
        shutil.rmtree(work, ignore_errors=True)
        (work / "code").mkdir(parents=True)
        (work / "code" / "noop.py").write_text(NOOP)
        (work / "bare.sh").write_text(BARE_SCRIPT)
        env = {**slurm.env(), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        self.env, self.work = env, work
        bare = Result("slurm", f"bare `sbatch -W --nodes={NODES}` (srun python3 -c pass)", NODES)
        polled = Result("slurm", "the same bare job: `sbatch`, its end polled every 0.1 s", NODES)
        sub = Result("slurm", f"fleetctl run --slurm --nodes {NODES}: no-op script", NODES)
        for _ in range(repeats):  # each from a Slurm at rest (not timed): see _at_rest
            self._at_rest(slurm, bare, self._bare_sbatch)
            self._at_rest(slurm, polled, self._bare_polled)
            self._at_rest(slurm, sub, self._submitted)
        if bare.samples and sub.samples:
            more = sub.stats()[0] - bare.stats()[0]  # type: ignore[index]
            sub.extra["over bare sbatch -W s (goal <= 1.5)"] = [round(more, 3)]
        if polled.samples and sub.samples:
            more = sub.stats()[0] - polled.stats()[0]  # type: ignore[index]
            sub.extra["over bare, polled s"] = [round(more, 3)]
        if polled.extra.get(STARTED) and sub.extra.get(STARTED):
            more = statistics.median(sub.extra[STARTED]) - statistics.median(polled.extra[STARTED])
            sub.extra["over bare, polled, once started s"] = [round(more, 3)]
        job, nodelist = slurm.allocate(NODES)
        try:
            alloc = {**env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": nodelist}
            srun = Result("slurm", f"inside salloc: bare `srun -N{NODES} python3 -c pass`", NODES)
            inside = Result("slurm", "inside salloc: fleetctl run (plain, no-op)", NODES)
            for _ in range(repeats):
                repeat(srun, 1, lambda: self._srun(job), finish=False)
                repeat(inside, 1, lambda: self._inside(alloc), finish=False)
            if srun.samples and inside.samples:
                more = inside.stats()[0] - srun.stats()[0]  # type: ignore[index]
                inside.extra["over bare srun s"] = [round(more, 3)]
            inside.extra["srun steps (fresh check)"] = [self._steps(alloc)]
        finally:
            slurm.cancel(job)
        sub.note = "the run inside checks, pushes, launches and tears down as any fleetctl run"
        return [finish_row(r) for r in (bare, polled, sub, srun, inside)]

    def _at_rest(self, slurm: Any, row: Result, sample: Any) -> None:
        """One sample once the nodes are idle (SlurmLab.wait_idle) and ``REST`` s have passed
        since the last sample ended (its job started before that): the job is scheduled at
        submit, as the first of a quiet cluster is, not at slurmctld's next batch pass."""
        slurm.wait_idle()
        left = getattr(self, "_ended", 0.0) + REST - time.monotonic()
        if left > 0:
            time.sleep(left)
        self._job: str | None = None
        begun = len(row.samples)
        try:
            repeat(row, 1, sample, finish=False)
        finally:
            self._ended, ended_at = time.monotonic(), time.time()
        started = self._started_at(slurm, self._job)
        if len(row.samples) > begun and started is not None:
            row.extra.setdefault(STARTED, []).append(round(ended_at - started, 3))

    @staticmethod
    def _started_at(slurm: Any, job: str | None) -> float | None:
        """When slurmctld allocated ``job`` its nodes (epoch s), from its log."""
        if job is None:
            return None
        log = slurm.dir / "ctld" / "slurmctld.log"
        m = re.search(rf"^\[(\S+)\] sched: Allocate JobId={job} ", log.read_text(), re.M)
        if not m:
            return None
        return datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()

    def _sbatch(self, flag: str, timeout: float) -> Timed:
        """``sbatch FLAG`` of the bare script on NODES nodes, timed; a failure fails the sample."""
        t = run_timed(
            ["sbatch", flag, f"--nodes={NODES}", f"--output={self.work}/bare-%j.out",
             str(self.work / "bare.sh")],
            env=self.env, cwd=str(self.work), timeout=timeout,
        )  # fmt: skip
        if t.proc.returncode != 0:
            raise SampleFailed(f"sbatch {flag} exit {t.proc.returncode}: {tail(t.proc.stderr)}")
        return t

    def _bare_sbatch(self) -> float:
        t = self._sbatch("-W", 120)
        m = re.search(r"Submitted batch job (\d+)", t.proc.stdout)
        self._job = m.group(1) if m else None
        return t.seconds

    def _bare_polled(self) -> float:
        """sbatch, then the job's state every 0.1 s until it has ended (no sbatch -W poll):
        ended as ``run --slurm``'s follower judges it (a terminal state)."""
        from fleetctl.slurm.queue import TERMINAL

        t0 = time.perf_counter()
        t = self._sbatch("--parsable", 60)
        job = self._job = t.proc.stdout.strip().split(";")[0]
        deadline = t0 + 120
        while time.perf_counter() < deadline:
            p = subprocess.run(
                ["scontrol", "show", "job", "-o", job],
                capture_output=True, text=True, env=self.env, timeout=30,
            )  # fmt: skip
            state = re.search(r"\bJobState=(\S+)", p.stdout)
            if p.returncode != 0 or (state and state.group(1) in TERMINAL):
                if not state or state.group(1) != "COMPLETED":
                    raise SampleFailed(f"bare job {job}: {p.stdout.strip() or p.stderr.strip()}")
                return time.perf_counter() - t0
            time.sleep(0.1)
        raise SampleFailed(f"bare job {job} did not end within 120 s")

    def _submitted(self) -> float:
        t = run_timed(
            [*self.fl, "run", "--slurm", "--nodes", str(NODES), "--launcher", "plain",
             "--runs-dir", str(self.work / "runs"), "noop.py"],
            env=self.env, cwd=str(self.work / "code"), timeout=180,
        )  # fmt: skip
        if t.proc.returncode != 0:
            why = f"exit {t.proc.returncode}: {tail(t.proc.stderr)}"
            raise SampleFailed(f"fleetctl run --slurm {why}")
        m = re.search(r"submitted as Slurm job (\d+)", t.proc.stderr)
        self._job = m.group(1) if m else None
        return t.seconds

    def _srun(self, job: str) -> float:
        t = run_timed(
            ["srun", f"--jobid={job}", f"-N{NODES}", "--overlap", PY, "-c", "pass"],
            env=self.env, timeout=60,
        )  # fmt: skip
        if t.proc.returncode != 0:
            raise SampleFailed(f"srun exit {t.proc.returncode}: {tail(t.proc.stderr)}")
        return t.seconds

    def _steps(self, env: dict[str, str]) -> int:
        """Job steps one run starts with no cached check (as in every new batch job): each
        costs slurmctld round trips. Counted by an ``srun`` in front of the real one."""
        real = shutil.which("srun") or "srun"
        bin_, log = self.work / "count-bin", self.work / "steps.log"
        bin_.mkdir(exist_ok=True)
        (bin_ / "srun").write_text(f'#!/bin/sh\necho step >> {log}\nexec {real} "$@"\n')
        (bin_ / "srun").chmod(0o755)
        cache = self.work / "fresh-cache"
        shutil.rmtree(cache, ignore_errors=True)
        log.unlink(missing_ok=True)
        path = f"{bin_}:{env.get('PATH') or os.environ.get('PATH', '')}"
        self._inside({**env, "PATH": path, "FLEETCTL_CACHE_DIR": str(cache)})
        return len(log.read_text().splitlines())

    def _inside(self, env: dict[str, str]) -> float:
        t = run_timed(
            [*self.fl, "run", "--launcher", "plain", "--runs-dir", str(self.work / "runs-in"),
             "noop.py"],
            env=env, cwd=str(self.work / "code"), timeout=120,
        )  # fmt: skip
        if t.proc.returncode != 0 or not re.search(r"succeeded", t.proc.stderr):
            raise SampleFailed(f"fleetctl run exit {t.proc.returncode}: {tail(t.proc.stderr)}")
        return t.seconds
