"""The supervisor (Python 3.8) seeds the job's whole work folder and runs the job in the
script's own folder inside it, so ``data/`` beside a script in a sub-folder is found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/remote is on sys.path (pytest's rootdir-relative import): its supervisor fixtures
from test_programs_py38 import Jobs, drain, jid

READER = "import os\nprint('cwd', os.getcwd())\nprint('data', open('data/x.txt').read())\n"


@pytest.fixture
def jobs(tmp_path: Path, py38: str) -> Iterator[Jobs]:
    j = Jobs(tmp_path, py38)
    try:
        yield j
    finally:
        j.close()


def test_the_job_runs_in_the_scripts_folder_of_a_work_folder_seeded_whole(
    jobs: Jobs, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    (code / "sub" / "data").mkdir(parents=True)
    (code / "sub" / "data" / "x.txt").write_text("beside the script")
    (code / "sub" / "train.py").write_text(READER)
    (code / "top.txt").write_text("top")
    work = tmp_path / "w" / "work" / "job"
    job = jid("p-subfolder")
    spec = {"cwd": str(work / "sub"), "work": str(work), "work_seed": str(code)}
    run = jobs.start(job, [jobs.python, "train.py"], **spec)
    frames = drain(run)
    lines = [text for kind, text in frames if kind == "L"]
    assert f"cwd {work / 'sub'}" in lines, frames
    assert "data beside the script" in lines, frames
    assert ("X", "0") in [(k, t.split()[0]) for k, t in frames if k == "X"], frames
    assert (work / "top.txt").read_text() == "top"  # the whole snapshot, not only sub/
