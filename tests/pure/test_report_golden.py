"""The report's HTML, byte for byte, for run folders written here as a run writes them: a
failing job, a retried one with a spare, a slow node and stacks, a stall, a job that never
launched, a 64-node job with a full matrix, and a succeeded job whose names and paths need
escaping (quotes, ``&``, ``<``, spaces, non-ASCII) with the check's table and an all-reduce.

The goldens in ``report_cases/`` were written by the jinja2 templates the report used before
its renderer became plain Python (issue 35): any change to the page shows here.
``FLEETCTL_REGEN_GOLDEN=1 pytest tests/pure/test_report_golden.py`` rewrites them from the
current code; review the diff before keeping it. Nothing in a render depends on the clock:
times come from the files, the progress mark from the progress file's mtime, set here.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fleetctl.report import build_report, write_report
from tests.pure.test_report_model import JOB, _write, at, make_run, sixty_four_nodes

CASES_DIR = Path(__file__).parent / "report_cases"
REGEN = os.environ.get("FLEETCTL_REGEN_GOLDEN") == "1"
COLL = {
    "ok": False, "median_link_busbw": 10.0, "threshold_busbw": 5.0,
    "links": [{"src": "n1", "dst": "n2", "busbw": 10.0}, {"src": "n2", "dst": "n3", "busbw": 1.0}],
    "failures": [{"host": "n3", "reason": "link n2 → n3 at 1 GB/s"}],
}  # fmt: skip


def failing(root: Path) -> Path:
    return make_run(root, hosts=["n1", "n2", "n3"])


def retried(root: Path) -> Path:
    first = make_run(root, hosts=["n1", "n2", "n3"], collective=COLL)
    make_run(
        root, f"{JOB}.2", hosts=["n1", "n4", "n3"], attempt=2,
        stacks=[{"frame": "wait (train.py:9)", "ranks": [0, 1, 3]},
                {"frame": "load (train.py:70)", "ranks": [2]}],
    )  # fmt: skip
    return first


def stalled(root: Path) -> Path:
    stacks = [{"frame": "all_reduce (dist.py:9)", "ranks": [0, 1, 2], "launcher_nodes": [0]},
              {"frame": "stuck_loading_batch (train.py:70)", "ranks": [3]}]  # fmt: skip
    folder = make_run(root, hosts=["n1", "n2"], stacks=stacks)
    with (folder / "events.log").open("a") as f:
        f.write(f"{at(19)} failure stalled: no progress on any node for 12 s\n")
    return folder


def never_launched(root: Path) -> Path:
    folder = root / "J1"
    _write(folder / "job.json", {"job_id": "J1", "status": "error", "errors": ["n2: <refused>"]})
    return folder


def big(root: Path) -> Path:
    return sixty_four_nodes(root, "the end")


def odd_names(root: Path) -> Path:
    """A failed job on hosts named to be escaped, a log path with a space, ``&``, ``#`` and
    an accent, the check's cells of every status, an all-reduce, a rank without a pid, a hint,
    errors, no launcher, and two hosts differing only in case (counted as one node)."""
    hosts = ['a&b"1', "n<2>'", "N<2>'"]
    folder = make_run(root, "J&2", hosts=hosts, collective={**COLL, "allreduce": {"busbw": 7.25}})
    job = json.loads((folder / "job.json").read_text())
    job["failed_ranks"][0]["hint"] = "set NCCL_<x>=1 & retry"
    job["errors"] = ["late: <none> & 'quoted'"]
    job["launcher"] = None
    (folder / "job.json").write_text(json.dumps(job))
    ranks = json.loads((folder / "ranks.json").read_text())
    odd = f"0-{hosts[0]}/rank 0é #1.log"
    _write(folder / odd, "é\tline & <tag>\n" * 3)
    ranks["ranks"][0] |= {"pid": None, "logs": [odd, ranks["ranks"][0]["logs"][0]]}
    (folder / "ranks.json").write_text(json.dumps(ranks))
    cells = {
        "ssh": {"status": "ok", "detail": "<0.1 s"},
        "python": {"status": "warn", "detail": ""},
        "disk": {"status": "fail", "detail": "\"full\" & 'gone'"},
        "gpu": {"status": "skip"},
    }
    _write(
        folder / "check.json",
        {"ok": False, "checks": [*cells], "hosts": [{"host": h, "checks": cells} for h in hosts]},
    )
    plan = json.loads((folder / "plan.json").read_text())
    plan["nodes"][1] |= {"nic": None, "train_addr": None, "python": ""}
    plan["script"] = "train <v2>.py"
    (folder / "plan.json").write_text(json.dumps(plan))
    return folder


def succeeded(root: Path) -> Path:
    """A job that succeeded: no culprit, no failed rank, no excerpt; a node without times."""
    folder = make_run(root, hosts=["n1", "n2"], nproc=1)
    job = json.loads((folder / "job.json").read_text())
    job |= {"status": "succeeded", "first_failure": None, "failed_ranks": [], "culprits": []}
    job["nodes"][1] |= {"state": "succeeded", "exit_code": 0, "start_time": None, "end_time": None}
    (folder / "job.json").write_text(json.dumps(job))
    (folder / "ranks.json").unlink()
    return folder


CASES: dict[str, Callable[[Path], Path]] = {
    "failing": failing,
    "retried": retried,
    "stalled": stalled,
    "never_launched": never_launched,
    "big": big,  # 0.7 MB: kept as its sha256
    "odd_names": odd_names,
    "succeeded": succeeded,
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_report_is_the_golden_page(tmp_path: Path, name: str) -> None:
    folder = CASES[name](tmp_path / "runs")
    html = build_report(folder)
    (tmp_path / "out").mkdir()
    moved = write_report(folder, tmp_path / "out" / "r.html").read_text(encoding="utf-8")
    got = {"": html, "-elsewhere": moved}
    for suffix, text in got.items():
        if name == "big":
            path = CASES_DIR / f"{name}{suffix}.sha256"
            value = hashlib.sha256(text.encode()).hexdigest() + "\n"
        else:
            path = CASES_DIR / f"{name}{suffix}.html"
            value = text
        if REGEN:
            path.parent.mkdir(exist_ok=True)
            path.write_text(value, encoding="utf-8")
        assert path.is_file(), f"{path.name}: no golden yet (FLEETCTL_REGEN_GOLDEN=1)"
        assert value == path.read_text(encoding="utf-8"), f"{path.name} differs"


def test_a_run_writes_its_report_without_importing_jinja2(tmp_path: Path) -> None:
    """The page is written in plain Python: a run's end imports no template engine (jinja2's
    import alone was ~20 ms of the run's CPU, its templates' load or compile 2–70 ms more)."""
    from tests.pure.test_cli_startup import imported_by, loaded

    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "t.py").write_text("print(1)\n")
    runs = tmp_path / "runs"
    args = ["run", "--launcher", "plain", "--runs-dir", str(runs)]
    code = tmp_path / "code"
    p, names = imported_by(tmp_path, *args, "--code-dir", str(code), str(code / "t.py"))
    assert p.returncode == 0, p.stderr[-2000:]
    [report] = runs.glob("*/report.html")
    assert report.read_text().endswith("</html>")
    assert "fleetctl.report.render" in names and loaded(names, ("jinja2", "markupsafe")) == []
