"""Measurement: what fleetctl costs a job under Slurm (issue 24, item 7).

Two pairs, each taking turns inside every repetition (the noise of a shared machine spread
over both), on a real Slurm started on the lab (``fleetctl.lab.slurm``: munged, slurmctld, one
slurmd per host) and a no-op job on 3 nodes:

* submitted: a bare ``sbatch -W --nodes=3`` of a script that runs ``srun python3 -c pass``,
  against ``fleetctl run --slurm --nodes 3 --launcher plain noop.py`` (submit, queue wait,
  the run inside with its check, push and teardown, the output followed); goal ≤ 1.5 s more;
* inside an allocation (``salloc -N3 --no-shell``): a bare ``srun -N3 python3 -c pass``
  against ``fleetctl run --launcher plain noop.py`` with that allocation's variables, and the
  job steps such a run starts with no cached check (4: a probe per node, handed the
  supervisor, and node 0's port claim).

Code and run folders live in the lab's folder, which every lab host sees (a shared home).
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Any

from common import PY, Result, SampleFailed, finish_row, repeat, run_timed, tail

NODES = 3
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
        sub = Result("slurm", f"fleetctl run --slurm --nodes {NODES}: no-op script", NODES)
        for _ in range(repeats):  # each from idle nodes (not timed): see SlurmLab.wait_idle
            slurm.wait_idle()
            repeat(bare, 1, self._bare_sbatch, finish=False)
            slurm.wait_idle()
            repeat(sub, 1, self._submitted, finish=False)
        if bare.samples and sub.samples:
            more = sub.stats()[0] - bare.stats()[0]  # type: ignore[index]
            sub.extra["over bare sbatch -W s (goal <= 1.5)"] = [round(more, 3)]
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
        return [finish_row(r) for r in (bare, sub, srun, inside)]

    def _bare_sbatch(self) -> float:
        t = run_timed(
            ["sbatch", "-W", f"--nodes={NODES}", f"--output={self.work}/bare-%j.out",
             str(self.work / "bare.sh")],
            env=self.env, cwd=str(self.work), timeout=120,
        )  # fmt: skip
        if t.proc.returncode != 0:
            raise SampleFailed(f"sbatch -W exit {t.proc.returncode}: {tail(t.proc.stderr)}")
        return t.seconds

    def _submitted(self) -> float:
        t = run_timed(
            [*self.fl, "run", "--slurm", "--nodes", str(NODES), "--launcher", "plain",
             "--runs-dir", str(self.work / "runs"), "noop.py"],
            env=self.env, cwd=str(self.work / "code"), timeout=180,
        )  # fmt: skip
        if t.proc.returncode != 0:
            why = f"exit {t.proc.returncode}: {tail(t.proc.stderr)}"
            raise SampleFailed(f"fleetctl run --slurm {why}")
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
