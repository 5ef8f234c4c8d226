"""Shared pieces of the benchmark: samples, timed child processes, machine facts.

Every number in docs/benchmarks.md comes from a ``Result`` filled here by a real run; a
measurement that cannot run records ``not measured: <reason>`` instead of a number.
"""

from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The interpreter running the bench, as its path says: a pyenv shim is never sys.executable (the
# shim execs the real one), and resolving a venv's bin/python symlink would leave the venv (and
# its paramiko) behind: every sample then failed with "No module named 'paramiko'".
PY = sys.executable


def fleetctl_argv() -> list[str]:
    """How to start the CLI the way users do: the installed console script, not a shim."""
    script = Path(sys.executable).parent / "fleetctl"
    try:
        first = script.read_bytes().split(b"\n", 1)[0]
    except OSError:
        first = b""
    if first.startswith(b"#!") and b"python" in first:
        return [str(script)]
    return [PY, "-m", "fleetctl"]


def measure_this_checkout() -> str:
    """Make every ``fleetctl`` the bench starts import this checkout's package.

    The console script imports whatever ``pip install -e`` last pointed at, possibly another
    clone: then this checkout goes first on PYTHONPATH for every child. Returns what is
    measured, for the report's facts."""
    src = Path(__file__).resolve().parent.parent
    argv = fleetctl_argv()
    probe = "import fleetctl, os; print(os.path.dirname(os.path.dirname(fleetctl.__file__)))"
    py = argv[0] if argv[0] == PY else _script_python(argv[0])
    got = subprocess.run(
        [py, "-c", probe], capture_output=True, text=True, cwd="/", timeout=60
    ).stdout.strip()
    if Path(got or "/nonexistent").resolve() == src:
        return f"{src} (installed)"
    paths = [str(src), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    return f"{src} (on PYTHONPATH; the installed one is {got or 'none'})"


def _script_python(script: str) -> str:
    first = Path(script).read_bytes().split(b"\n", 1)[0]
    return first[2:].decode().strip().split()[0]


@dataclass
class Result:
    """One row of a table: a tool at a size, its timed samples (seconds) and extra columns."""

    group: str
    tool: str
    n: int | None = None
    samples: list[float] = field(default_factory=list)
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    failed: str | None = None  # why every sample failed (the row then shows no timing)
    failures: int = 0  # samples that failed (their reason: first_failure)
    first_failure: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.samples) if self.samples and not self.failed else None

    def stats(self) -> tuple[float, float, float] | None:
        if not self.samples or self.failed:
            return None
        return statistics.median(self.samples), min(self.samples), max(self.samples)


class SampleFailed(Exception):
    """A run of a tool gave a wrong answer (missing hosts, non-zero exit): no timing recorded."""


@dataclass
class Timed:
    seconds: float
    cpu: float  # user+sys of the child and everything it waited for
    maxrss_kb: int
    proc: subprocess.CompletedProcess[str]


def run_timed(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    cwd: str | None = None,
    input: str | None = None,
) -> Timed:
    """Run a child to completion; wall time, its CPU (getrusage of children) and peak RSS."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        list(argv),
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Timed(seconds, cpu, after.ru_maxrss, proc)


def repeat(
    result: Result,
    times: int,
    fn: Callable[[], float | tuple[float, dict[str, Any]]],
    *,
    finish: bool = True,
) -> Result:
    """Call ``fn`` ``times`` times. A failed sample is counted and its reason kept (never
    dropped silently); stats cover the samples that succeeded (see ``finish_row``)."""
    for _ in range(times):
        try:
            got = fn()
        except SampleFailed as e:
            _failed(result, str(e))
            continue
        except subprocess.TimeoutExpired as e:
            _failed(result, f"timed out after {e.timeout:g}s")
            continue
        if isinstance(got, tuple):
            seconds, extra = got
            for k, v in extra.items():
                result.extra.setdefault(k, []).append(v)
        else:
            seconds = got
        result.samples.append(seconds)
    return finish_row(result) if finish else result


def finish_row(result: Result) -> Result:
    """A row where every sample failed shows no timing; partial failures are named in notes."""
    if result.failures and not result.samples:
        result.failed = f"all {result.failures} samples failed: {result.first_failure}"
    elif result.failures:
        msg = f"{result.failures} other sample(s) FAILED: {result.first_failure}"
        result.note = f"{result.note}; {msg}" if result.note else msg
    return result


def _failed(result: Result, why: str) -> None:
    result.failures += 1
    if result.first_failure is None:
        result.first_failure = why


def tail(text: str, lines: int = 3) -> str:
    got = [x for x in text.strip().splitlines() if x.strip()]
    return " | ".join(got[-lines:])[:300]


def _first_line(argv: Sequence[str]) -> str:
    exe = shutil.which(argv[0])
    if exe is None:
        return "not installed"
    try:
        p = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    text = (p.stdout + p.stderr).strip()
    return text.splitlines()[0] if text else "unknown"


def _py_version(module: str) -> str:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return "not installed"


def machine_facts() -> dict[str, str]:
    """What the numbers were measured on: CPU, memory, kernel, OpenSSH and every tool's version."""
    facts: dict[str, str] = {}
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts["CPU"] = f"{os.cpu_count()} × {cpu} (nproc {len(os.sched_getaffinity(0))})"
    m = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    facts["memory"] = f"{int(m.group(1)) / 1024 / 1024:.1f} GiB" if m else "unknown"
    facts["kernel"] = platform.release()
    facts["OpenSSH"] = _first_line(["ssh", "-V"])
    facts["python"] = platform.python_version()
    for mod in ("fleetctl", "paramiko", "fabric", "cryptography", "asyncssh", "ansible-core"):
        facts[mod] = _py_version(mod)
    facts["pdsh"] = _first_line(["pdsh", "-V"])
    facts["clush"] = _first_line(["clush", "--version"])
    facts["rsync"] = _first_line(["rsync", "--version"])
    facts["load average at start"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return facts
