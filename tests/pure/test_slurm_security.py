"""``run --slurm`` as a hostile user drives it (issue 40): a control character in any value the
batch script holds on a line is refused (a newline would end the ``#SBATCH`` line and run the
rest on the batch node), a dry run refuses what a submission would (Slurm asked with
``sbatch --test-only``), gres counts are bounded, and the job's options reach the run inside in
a 0600 file (``run --spec``), never on a command line. Slurm here is a scripted ``sbatch``."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from pathlib import Path

import pytest

from fleetctl.errors import UsageError
from fleetctl.slurm import specfile
from fleetctl.slurm.allocation import from_env
from fleetctl.slurm.batch import GPUS_VAR, BatchRequest, check_gres, inside_command, render
from fleetctl.testing.cli_runner import run_cli

CONTROL = ["\n", "\r", "\x00", "\x1b"]
#: (option as typed, the name the error gives, a good value)
LINE_OPTIONS = [
    ("--partition", "--partition", "gpu"),
    ("--account", "--account", "ml"),
    ("--gres", "--gres", "gpu:1"),
    ("--time", "--time", "30"),
    ("--sbatch-arg", "--sbatch-arg", "--comment=a"),
    ("--runs-dir", "--runs-dir", "runs"),
]
FAKE_SBATCH = """\
#!/bin/sh
echo "$*" >> "$(dirname "$0")/calls"
script=$(cat)
case "$script" in
  *--gres=bogus*)
    echo "sbatch: error: Invalid generic resource (gres) specification" >&2; exit 1;;
  *--partition=unreachable*)
    echo "sbatch: error: Batch job submission failed: Unable to contact slurm controller \
(connect failure)" >&2; exit 1;;
esac
if [ "$1" = "--test-only" ]; then
  echo "sbatch: Job 5 to start at 2026-11-28T19:55:53 using 1 processors on nodes n1" >&2
  exit 0
fi
echo 42
"""


@pytest.fixture
def sbatch(tmp_path: Path) -> Path:
    """A scripted sbatch first on PATH; its calls land in ``<bin>/calls``."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "sbatch"
    exe.write_text(FAKE_SBATCH)
    exe.chmod(0o755)
    (tmp_path / "job.py").write_text("print(1)\n")
    return bindir


def _run(tmp_path: Path, bindir: Path, *args: str) -> object:
    return run_cli(
        "run", "--slurm", "--nodes", "2", *args, "job.py",
        cwd=tmp_path, env={"PATH": f"{bindir}:/usr/bin:/bin"},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("option", "name", "good", "char"),
    [
        (*opt, char)
        for opt in LINE_OPTIONS
        for char in CONTROL
        # no command line holds a NUL, and click's Path type stats it first (the library's test)
        if (opt[0], char) != ("--runs-dir", "\x00")
    ],
    ids=lambda v: repr(v) if v in CONTROL else str(v),
)
@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "submit"])
def test_a_control_character_in_a_value_of_the_batch_script_is_refused_naming_the_option(
    tmp_path: Path, sbatch: Path, option: str, name: str, good: str, char: str, dry: bool
) -> None:
    bad = f"{good}{char}touch {tmp_path}/PWN"
    res = _run(tmp_path, sbatch, f"{option}={bad}", *(["--dry-run"] if dry else []))
    assert res.exit_code == 2, res.stdout + res.stderr  # type: ignore[attr-defined]
    lines = res.stderr.strip().splitlines()  # type: ignore[attr-defined]
    # RunSpec's fields say it as click does ("Invalid value for '--partition': …")
    named = (f"fleetctl: error: {name} ", f"fleetctl: error: Invalid value for '{name}'")
    assert len(lines) == 1 and lines[0].startswith(named), lines
    assert "control character" in lines[0] and repr(char) in lines[0]
    assert res.stdout == ""  # type: ignore[attr-defined]  # no script printed
    assert not (sbatch / "calls").exists()  # Slurm was never asked
    assert not (tmp_path / "runs").exists() and not (tmp_path / "fleet-runs").exists()


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "submit"])
def test_a_current_folder_with_a_newline_is_refused(
    tmp_path: Path, sbatch: Path, dry: bool
) -> None:
    cwd = tmp_path / "a\ntouch PWN"
    cwd.mkdir()
    (cwd / "job.py").write_text("print(1)\n")
    res = run_cli(
        "run", "--slurm", "--nodes", "1", "--runs-dir", str(tmp_path / "runs"),
        *(["--dry-run"] if dry else []), "job.py",
        cwd=cwd, env={"PATH": f"{sbatch}:/usr/bin:/bin"},
    )  # fmt: skip
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith("fleetctl: error: the current folder (#SBATCH --chdir) ")
    assert len(res.stderr.strip().splitlines()) == 1 and not (sbatch / "calls").exists()


@pytest.mark.parametrize("char", CONTROL, ids=repr)
@pytest.mark.parametrize(
    ("kwarg", "name"),
    [
        ("partition", "--partition"),
        ("account", "--account"),
        ("gres", "--gres"),
        ("time", "--time"),
        ("sbatch_args", "--sbatch-arg"),
        ("runs_dir", "--runs-dir"),
        ("job_id", "job id"),
    ],
)
def test_the_library_refuses_a_control_character_too(
    tmp_path: Path, kwarg: str, name: str, char: str
) -> None:
    from fleetctl.api import slurm

    good = {
        "partition": "gpu", "account": "ml", "gres": "gpu:1", "time": "30",
        "sbatch_args": "--qos=high", "runs_dir": str(tmp_path / "runs"), "job_id": "j1",
    }  # fmt: skip
    value: object = f"{good[kwarg]}{char}touch PWN"
    if kwarg == "sbatch_args":
        value = ("--comment=x", value)
    # the record's check ("Invalid value for '--partition': …") or the batch script's
    named = f"^({re.escape(name)} |Invalid value for '{re.escape(name)}')"
    with pytest.raises(UsageError, match=named) as err:
        slurm.submission("job.py", nodes=1, **{kwarg: value})  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_render_refuses_a_request_built_by_hand() -> None:
    """A BatchRequest made without ``submission()`` is checked where the script is written."""
    base = BatchRequest(nodes=1, job_id="j1", folder="/r/j1", chdir="/c", command=("py",))
    for field, value, name in [
        ("partition", "p\n#SBATCH --x", "--partition"),
        ("extra", ("--qos=a\rb",), "--sbatch-arg"),
        ("chdir", "/c\nx", "the current folder"),
        ("env", {"PYTHONPATH": "/l\x1bx"}, "the batch script's PYTHONPATH"),
        ("env", {"A;touch x": "1"}, "variable"),
        ("command", ("py", "a\x00b"), "the batch script's command"),
        ("job_id", "../j1", "job id"),
        ("nodes", "2\nx", "--nodes"),
    ]:
        import dataclasses

        with pytest.raises(UsageError, match=name):
            render(dataclasses.replace(base, **{field: value}))


@pytest.mark.parametrize(
    "bad", ["gpu:-1", "gpu:1e309", "gpu:0", "gpu:4097", "gpu:a100:0", "gpu:1,shard:-2", "gpu:+1"]
)
def test_gres_counts_are_whole_numbers_within_bounds(
    tmp_path: Path, sbatch: Path, bad: str
) -> None:
    with pytest.raises(UsageError, match="--gres"):
        check_gres(bad)
    res = _run(tmp_path, sbatch, f"--gres={bad}", "--dry-run")
    assert res.exit_code == 2 and "--gres" in res.stderr, res.stderr  # type: ignore[attr-defined]
    assert not (sbatch / "calls").exists()


def test_good_gres_still_pass() -> None:
    for ok in (
        "gpu",
        "gpu:4096",
        "gpu:a100:2",
        "mps:100",
        "shard:4",
        "gpu:h100_80g",
        "gpu:1,shard:2",
    ):
        assert check_gres(ok) == ok


def test_a_dry_run_refuses_what_slurm_refuses_with_the_same_line(
    tmp_path: Path, sbatch: Path
) -> None:
    dry = _run(tmp_path, sbatch, "--gres=bogus", "--dry-run")
    assert (sbatch / "calls").read_text() == "--test-only\n"  # asked, nothing queued
    real = _run(tmp_path, sbatch, "--gres=bogus")
    line = "fleetctl: error: Slurm refused the job: Invalid generic resource (gres) specification"
    assert (dry.exit_code, dry.stderr.strip()) == (2, line), dry.stderr  # type: ignore[attr-defined]
    assert (real.exit_code, real.stderr.strip()) == (2, line), real.stderr  # type: ignore[attr-defined]
    assert dry.stdout == ""  # type: ignore[attr-defined]


def test_a_dry_run_says_whether_slurm_would_take_the_job(tmp_path: Path, sbatch: Path) -> None:
    ok = _run(tmp_path, sbatch, "--gres=gpu:1", "--dry-run")
    assert ok.exit_code == 0 and ok.stdout.startswith("#!/bin/sh\n")  # type: ignore[attr-defined]
    assert "dry run: Slurm would take it (sbatch --test-only)" in ok.stderr  # type: ignore[attr-defined]
    # Slurm cannot be asked: the dry run still shows the script, and says it was not checked
    far = _run(tmp_path, sbatch, "--partition=unreachable", "--dry-run")
    assert far.exit_code == 0, far.stderr  # type: ignore[attr-defined]
    assert "dry run: not checked by Slurm: sbatch failed: Unable to contact" in far.stderr  # type: ignore[attr-defined]
    assert (sbatch / "calls").read_text() == "--test-only\n--test-only\n"


def test_the_options_travel_in_a_private_file_not_in_the_batch_script(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.api import slurm
    from fleetctl.api.runspec import RunSpec
    from fleetctl.slurm.submit import SlurmClient

    secret = f"hunter2-{secrets.token_hex(4)}"
    sent: list[str] = []
    monkeypatch.setattr(SlurmClient, "sbatch", lambda self, script: sent.append(script) or "42")
    sub = slurm.submission(
        "job.py", ["--lr", "1"], nodes=2, runs_dir=tmp_path / "runs",
        env={"TOKEN": secret}, launcher="plain", grace=2,
    )  # fmt: skip
    job = sub.submit(detach=True)
    spec = job.run_folder / "run-spec.json"
    assert secret not in sent[0] and secret not in (job.run_folder / "sbatch.sh").read_text()
    assert sent[0].rstrip().endswith(f"-m fleetctl run --spec={spec}")
    data, inside = specfile.read(spec)
    assert RunSpec.from_dict(data) == RunSpec.build(
        "job.py", "--lr", "1", env={"TOKEN": secret}, launcher="plain", grace=2
    )
    assert inside == specfile.Inside(runs_dir=f"{tmp_path}/runs")
    assert (spec.stat().st_mode & 0o777, job.run_folder.stat().st_mode & 0o777) == (0o600, 0o700)


def test_a_python_callable_cannot_be_submitted(tmp_path: Path) -> None:
    from fleetctl.api import slurm

    def prepare(nodes: object, settings: object) -> None:
        pass

    with pytest.raises(UsageError, match=r"'--before': a Python callable \('prepare'\)"):
        slurm.submission("job.py", nodes=1, runs_dir=tmp_path, before=prepare)
    with pytest.raises(TypeError, match="no longer options="):
        slurm.submission("job.py", nodes=1, options=["--launcher=plain"])
    assert list(tmp_path.iterdir()) == []


def test_the_cli_forwards_env_vars_through_the_spec_file(tmp_path: Path, sbatch: Path) -> None:
    res = _run(tmp_path, sbatch, "--env-var=TOKEN=hunter2", "--dry-run", "--json")
    doc = json.loads(res.stdout)  # type: ignore[attr-defined]
    assert "hunter2" not in doc["sbatch_script"] and "hunter2" not in " ".join(doc["command"])
    assert doc["spec"]["content"]["spec"]["program"]["env"] == {"TOKEN": "hunter2"}


RANK_SCRIPT = """\
import os, sys
print("token", os.environ["TOKEN"], "args", sys.argv[1:], flush=True)
"""


def test_run_spec_runs_the_run_the_file_holds(tmp_path: Path) -> None:
    """``run --spec FILE`` builds the record from the file's JSON (no option parsed): the
    rank gets the env and ARGS, the run folder is where ``inside`` says."""
    from fleetctl.api.runspec import RunSpec

    (tmp_path / "job.py").write_text(RANK_SCRIPT)
    spec = tmp_path / "spec.json"
    run = RunSpec.build("job.py", "x y", launcher="plain", env={"TOKEN": "a b'c"}, report=False)
    inside = specfile.Inside(runs_dir=str(tmp_path / "inside-runs"), tail="0")
    specfile.write(spec, specfile.document(run.to_dict(), inside))
    res = run_cli("run", f"--spec={spec}", cwd=tmp_path)
    assert res.exit_code == 0, res.stderr
    assert "token a b'c args ['x y']" in res.stdout
    assert len(list((tmp_path / "inside-runs").iterdir())) == 1


def _doc(spec: object = None, inside: object = None) -> str:
    return json.dumps(
        {
            "format": specfile.FORMAT,
            "spec": {"program": {"script": "job.py"}} if spec is None else spec,
            "inside": {"runs_dir": "runs"} if inside is None else inside,
        }
    )


@pytest.mark.parametrize(
    ("content", "args", "msg"),
    [
        (None, ["--launcher=plain"], "the whole run is in the file; got launcher"),
        (None, ["job.py"], "the whole run is in the file; got script"),
        ("{", [], "not a fleetctl run spec"),
        ('{"format": "fleetctl-run-argv/1", "argv": []}', [], "not a fleetctl run spec"),
        (_doc(spec=[]), [], "'spec' must be a JSON object"),
        (
            _doc({"supervision": {"timeout": "nan"}}),
            [],
            "Invalid value for '--timeout': 'nan' is not a finite number",
        ),
        (_doc({"program": {"env": {"A\n": "1"}}}), [], "Invalid value for '--env-var'"),
        (_doc({"retry": {"retries": 2}}), [], "unknown field retry.retries"),
        (_doc(inside={}), [], "'inside': no runs_dir"),
        (_doc(inside={"runs_dir": 1}), [], "'inside': runs_dir 1 is not a str"),
        (_doc(inside={"runs_dir": "r", "tail": "x"}), [], "tail 'x' is not all|RANK|none"),
        ("missing", [], "cannot read it"),
    ],
)
def test_a_bad_spec_is_one_line_exit_2_naming_the_file(
    tmp_path: Path, content: str | None, args: list[str], msg: str
) -> None:
    spec = tmp_path / "spec.json"
    if content is None:
        spec.write_text(_doc())
    elif content != "missing":
        spec.write_text(content)
    res = run_cli("run", f"--spec={spec}", *args, cwd=tmp_path)
    assert res.exit_code == 2, res.stderr
    assert res.stderr.startswith(f"fleetctl: error: --spec {spec}: "), res.stderr
    assert msg in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "runs").exists()


def test_without_a_shared_filesystem_the_script_writes_the_spec_privately(tmp_path: Path) -> None:
    """The batch host cannot see the run folder: the script writes the spec from a
    here-document, 0600 in a 0700 folder, the values byte-exact; then the run inside reads it."""
    job = f"t{secrets.token_hex(4)}"
    root = Path(f"/tmp/fleetctl-slurm-{job}")
    env = {"K": "a'b\"c $HOME `id` \\n\n\x01é", "FLEETCTL_RUN_SPEC_END": "x\nFLEETCTL_RUN_SPEC_END"}
    doc = specfile.document({"program": {"env": env}}, specfile.Inside(runs_dir=str(root)))
    copy = tmp_path / "copy"
    inside = (
        f"cp {root}/run-spec.json {copy}; stat -c %a {root} {root}/run-spec.json "
        f"> {tmp_path}/modes; mkdir -p {root}/{job} && touch {root}/{job}/.fetched"
    )
    req = BatchRequest(
        nodes=1, job_id=job, folder="/nowhere", chdir="/", command=("sh", "-c", inside),
        private=True, spec=doc,
    )  # fmt: skip
    try:
        p = subprocess.run(["sh", "-c", render(req)], capture_output=True, text=True, timeout=30)
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)
    assert p.returncode == 0, p.stderr
    assert specfile.read(copy) == (doc["spec"], specfile.Inside(runs_dir=str(root)))
    assert (tmp_path / "modes").read_text().split() == ["700", "600"]


def test_without_a_shared_filesystem_a_planted_folder_is_not_written(tmp_path: Path) -> None:
    job = f"t{secrets.token_hex(4)}"
    root = Path(f"/tmp/fleetctl-slurm-{job}")
    os.symlink(tmp_path, root)  # another user's link where the job's folder goes
    req = BatchRequest(
        nodes=1, job_id=job, folder="/nowhere", chdir="/", command=("true",), private=True,
        spec=specfile.document({}, specfile.Inside(runs_dir=str(root))),
    )  # fmt: skip
    try:
        p = subprocess.run(["sh", "-c", render(req)], capture_output=True, text=True, timeout=30)
    finally:
        root.unlink()
    assert p.returncode == 3 and "fleetctl-slurm: cannot write" in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []


def test_the_plans_gpus_per_node_follow_gres_not_the_batch_steps() -> None:
    """An exclusive node gives the batch step all its GPUs (SLURM_GPUS_ON_NODE=2) while each
    srun step gets what --gres asked (1): the plan follows --gres."""
    from fleetctl.api import slurm

    base = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_GPUS_ON_NODE": "2"}
    alloc = from_env({**base, GPUS_VAR: "1"})
    assert alloc is not None and alloc.gpus_per_node == 1
    alloc = from_env({**base, "SLURM_GPUS_PER_NODE": "gpu:1"})  # --gpus-per-node=1
    assert alloc is not None and alloc.gpus_per_node == 1
    for gres, gpus in (("gpu:1", "1"), ("gpu:a100:2", "2"), ("gpu", "1"), ("shard:4", None)):
        sub = slurm.submission("job.py", nodes=2, gres=gres)
        assert sub.request.env.get(GPUS_VAR) == gpus, gres
        assert (f"export {GPUS_VAR}={gpus}\n" in sub.script) == (gpus is not None)


def test_inside_command_is_the_spec_alone() -> None:
    assert inside_command("py", "/r/j/run-spec.json") == (
        "py", "-m", "fleetctl", "run", "--spec=/r/j/run-spec.json",
    )  # fmt: skip
