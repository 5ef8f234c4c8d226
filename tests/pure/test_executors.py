"""One ``Job`` over two executors: the direct one and the sbatch one have the interface
``fleetctl.api.executor.Executor`` names (mypy checks it where ``Job`` holds one; this checks
the method sets and signatures at run time), and ``Job`` hands every call to its executor
without asking which kind it holds."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fleetctl.api import Job, LogLine, RunResult
from fleetctl.api.direct import Direct
from fleetctl.api.executor import Executor, WaitTimeout
from fleetctl.api.submitted import Queued, Submitted
from fleetctl.errors import FleetctlError, JobFailed
from fleetctl.job.records.files import SlurmRecord
from fleetctl.job.records.jobrecord import JobRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.slurm.queue import JobInfo

JOB_PY = Path(__file__).resolve().parents[2] / "fleetctl" / "api" / "job.py"
MEMBERS = sorted(n for n in vars(Executor) if not n.startswith("_"))


class _Queue:
    """A Slurm whose job stays queued until ``left``; records cancels."""

    def __init__(self) -> None:
        self.left = False
        self.cancels: list[str] = []

    def queued(self, job: str, *, steps: bool = False) -> bool:
        return not self.left

    def show(self, job: str) -> JobInfo | None:
        return None if self.left else JobInfo(job, "PENDING", "Priority")

    def position(self, job: str) -> int | None:
        return 3

    def cancel(self, job: str, *, graceful: bool = False, timeout: float = 0) -> None:
        self.cancels.append(job)
        self.left = True


def _run(tmp_path: Path, status: str = "queued") -> RunFolder:
    run = RunFolder.create(tmp_path, "j1")
    run.write_job(JobRecord(job_id="j1", status=status, folder=str(run.path), executor="sbatch"))
    run.write_slurm(SlurmRecord(job_id="42", state="PENDING"), "#!/bin/sh\n")
    return run


def _executors(tmp_path: Path) -> list[Any]:
    run = _run(tmp_path)
    return [
        Direct.found("j1", tmp_path, None),
        Submitted(run, "42", SlurmRecord(job_id="42"), client=_Queue()),  # type: ignore[arg-type]
    ]


def test_the_protocol_names_what_job_hands_on() -> None:
    assert MEMBERS == [
        "details", "done", "error", "job_id", "kind", "lines", "monitor", "run_folder",
        "status", "stop", "submitted", "wait",
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["direct", "sbatch"])
def test_each_executor_has_every_member_with_the_protocols_signature(
    tmp_path: Path, kind: str
) -> None:
    ex = {e.kind: e for e in _executors(tmp_path)}[kind]
    for name in MEMBERS:
        want = inspect.getattr_static(Executor, name)
        got = inspect.getattr_static(ex, name)  # an instance's attribute, a property, a method
        if inspect.isfunction(want):
            assert inspect.isfunction(got), f"{kind}.{name} is not a method"
            a, b = inspect.signature(want), inspect.signature(got)
            assert list(a.parameters) == list(b.parameters), f"{kind}.{name}{b} is not {a}"
            for p, q in zip(a.parameters.values(), b.parameters.values(), strict=True):
                assert (p.kind, p.default) == (q.kind, q.default), f"{kind}.{name}: {q} ≠ {p}"
        else:
            assert not inspect.isfunction(got), f"{kind}.{name} should be an attribute"
    assert ex.job_id == "j1" and ex.run_folder == tmp_path / "j1"
    assert (ex.submitted is ex) == (kind == "sbatch")
    assert ex.details is None and ex.monitor is None  # nothing ran in this process


def test_job_asks_no_question_of_its_executor_kind() -> None:
    """job.py compares no executor name and tests no executor's type: it dispatches."""
    tree = ast.parse(JOB_PY.read_text())
    named = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in ("sbatch", "direct")
    ]
    assert named == []
    checks = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "isinstance"
    ]
    assert checks == []


class _Recorder:
    """An executor that records what ``Job`` hands it."""

    kind = "direct"
    job_id = "j1"
    run_folder = Path("/runs/j1")
    done = True
    details = None
    monitor = None
    submitted = None

    def __init__(self, result: RunResult, error: FleetctlError | None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.result, self.err = result, error

    def lines(self, timeout: float | None = None) -> Iterator[LogLine]:
        self.calls.append(("lines", (timeout,), {}))
        yield LogLine(0, "node1", "hi")

    def wait(self, timeout: float | None = None, **kw: Any) -> RunResult:
        self.calls.append(("wait", (timeout,), kw))
        return self.result

    def error(self, result: RunResult) -> FleetctlError | None:
        self.calls.append(("error", (result,), {}))
        return self.err

    def stop(self, grace: float = 5.0, **kw: Any) -> None:
        self.calls.append(("stop", (grace,), kw))

    def status(self) -> Any:
        self.calls.append(("status", (), {}))
        return "the report"


def test_job_hands_each_call_to_its_executor_as_given() -> None:
    result = RunResult.from_record({"job_id": "j1", "status": "failed"}, "/runs/j1")
    rec = _Recorder(result, JobFailed("job j1: failed"))
    job = Job("j1", "/runs", executor=rec)  # type: ignore[arg-type]
    assert (job.executor, job.done, job.submitted, job.details) == ("direct", True, None, None)
    assert [str(ln) for ln in job.lines(timeout=2)] == ["[0 node1] hi"]
    assert job.wait(7) is result  # check=False: the verdict is returned, error() not asked
    with pytest.raises(JobFailed, match="job j1: failed"):
        job.wait(check=True, queue_timeout=5)
    notes: Callable[[str], None] = print
    job.stop(1.5, collect=False, collect_exclude=["*.pt"], ended_too=True, on_note=notes)
    assert job.status() == "the report"
    stop_kw = {"collect": False, "collect_max": None, "collect_exclude": ["*.pt"]}
    assert rec.calls == [
        ("lines", (2,), {}),
        ("wait", (7,), {"queued": None}),
        ("wait", (None,), {"queued": Queued(None, 5)}),
        ("error", (result,), {}),
        ("stop", (1.5,), {**stop_kw, "ended_too": True, "check": True, "on_note": notes}),
        ("status", (), {}),
    ]


def test_a_direct_job_refuses_what_only_a_queued_one_waits_with(tmp_path: Path) -> None:
    from fleetctl.errors import UsageError

    direct = Direct.found("j1", tmp_path, None)
    with pytest.raises(UsageError, match=r"^wait\(on_event=, queue_timeout=\): only for a sub"):
        direct.wait(0, queued=Queued.of(None, 5))
    assert Queued.of(None, None) is None


def test_attach_builds_the_executor_the_run_folder_names(tmp_path: Path) -> None:
    run = _run(tmp_path)
    job = Job.attach("j1", tmp_path)
    assert isinstance(job._executor, Submitted) and job.submitted is job._executor
    with run.editing_job() as rec:
        rec.executor = "direct"
    assert isinstance(Job.attach("j1", tmp_path)._executor, Direct)


def test_a_queued_submitted_job_stops_by_scancel_then_through_its_run_folder(
    tmp_path: Path,
) -> None:
    """The sbatch executor's stop: ``scancel`` while Slurm holds the job (the report says
    so), and once it left the queue the direct executor's stop of the same folder (an ended
    job: nothing to stop)."""
    run = _run(tmp_path)
    slurm = _Queue()
    job = Job("j1", tmp_path, executor=Submitted(run, "42", SlurmRecord(job_id="42"), client=slurm))  # type: ignore[arg-type]
    status = job.status()
    assert (status.status, status.live, status.nodes) == ("queued", True, [])
    assert status.slurm is not None and "PENDING" in status.slurm["now"]
    with pytest.raises(WaitTimeout, match="job j1 still running after 0 s"):
        job.wait(timeout=0)
    notes: list[str] = []
    report = job.stop(on_note=notes.append)
    assert report is not None and report.slurm == {
        "job_id": "42",
        "state": "CANCELLED",
        "queued": False,
    }
    assert slurm.cancels == ["42"] and notes == [
        "job j1: scancel Slurm job 42",
        "job j1: Slurm job 42 gone from the queue, no step left",
    ]
    assert (run.load_job().status, job.done) == ("cancelled", True)
    assert job.stop() is None and slurm.cancels == ["42"]  # ended: the run folder says so


class _Bounded(_Queue):
    """A queue that fails the test where a wait would go on past its limit (~10 s)."""

    shows = 0

    def show(self, job: str) -> JobInfo | None:
        self.shows += 1
        assert self.shows < 40, "still waiting in the queue: the record's limit was not used"
        return super().show(job)


def test_a_submitted_job_waits_in_the_queue_as_long_as_its_record_asked(tmp_path: Path) -> None:
    """``slurm.submit(…, queue_timeout=S)``: the job's ``wait()`` cancels it after S s in the
    queue (exit 5) as ``run --slurm --queue-timeout S`` does; ``wait(queue_timeout=)`` wins."""
    from fleetctl.api import slurm
    from fleetctl.api.runspec import Slurm
    from fleetctl.slurm.batch import QueueTimeout

    (tmp_path / "job.py").write_text("print('hi')\n")
    sub = slurm.submission(str(tmp_path / "job.py"), nodes=1, runs_dir=tmp_path, queue_timeout=60)
    assert sub.asked == Slurm(queue_timeout=60.0)
    run, queue = _run(tmp_path), _Bounded()
    asked = Slurm(queue_timeout=1.0)
    job = Job(
        "j1",
        tmp_path,
        executor=Submitted(run, "42", SlurmRecord(job_id="42"), client=queue, asked=asked),
    )  # type: ignore[arg-type]
    with pytest.raises(QueueTimeout, match="did not start within --queue-timeout 1s"):
        job.wait()
    assert queue.cancels == ["42"]
    queue = _Queue()
    job = Job(
        "j1",
        tmp_path,
        executor=Submitted(
            run, "42", SlurmRecord(job_id="42"), client=queue, asked=Slurm(queue_timeout=600.0)
        ),
    )  # type: ignore[arg-type]
    with pytest.raises(QueueTimeout, match="within --queue-timeout 0s"):
        job.wait(queue_timeout=0)
    unasked = Submitted(run, "42", SlurmRecord(job_id="42"), client=_Queue())  # type: ignore[arg-type]
    assert unasked.asked.queue_timeout is None  # attached later: waits as long as it queues
