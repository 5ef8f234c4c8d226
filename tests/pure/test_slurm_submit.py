"""``fleetctl run --slurm`` without a cluster: the batch script (golden), sbatch/scontrol/squeue
answers (captured from slurm-wlm 22.05.8), the run record shipped inside, the run folder the
batch job adopts, and the submitter's wait/cancel logic against a scripted Slurm."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.errors import FleetctlError, RunFolderError, UsageError
from fleetctl.job.records.files import SlurmRecord
from fleetctl.job.records.runfolder import RunFolder
from fleetctl.slurm import specfile
from fleetctl.slurm.batch import (
    BatchRequest,
    QueueTimeout,
    SlurmError,
    adopted_job_id,
    check_gres,
    check_time,
    inside_command,
    parse_job_id,
    render,
    submit_error,
)
from fleetctl.slurm.queue import JobInfo, describe, in_queue, parse_show_job, queue_position
from fleetctl.slurm.submit import OutputTail, SlurmEvent, run_submitted
from fleetctl.testing.cli_runner import run_cli

CASES = Path(__file__).parent / "slurm_cases"


def test_batch_script_with_every_option_matches_golden() -> None:
    req = BatchRequest(
        nodes=2,
        job_id="20261126-120000-abcdef",
        folder="/shared/runs/20261126-120000-abcdef",
        chdir="/shared/code",
        command=inside_command(
            "/opt/conda/bin/python", "/shared/runs/20261126-120000-abcdef/run-spec.json"
        ),
        spec=specfile.document(  # in the run folder, not in the script
            {"program": {"script": "train.py", "env": {"A": "x y"}}},
            specfile.Inside(runs_dir="/shared/runs"),
        ),
        partition="gpu",
        gres="gpu:1",
        time="1:00:00",
        account="ml",
        extra=("--qos=high", "--exclusive"),
        env={"FLEETCTL_RUN_ID": "20261126-120000-abcdef", "PYTHONPATH": "/opt/fleetctl lib"},
    )
    assert render(req) == (CASES / "sbatch_full.sh").read_text()


def test_batch_script_minimal_matches_golden() -> None:
    req = BatchRequest(
        nodes=3,
        job_id="j1",
        folder="/r/j1",
        chdir="/c",
        command=("python3", "-m", "fleetctl", "run", "job.py"),
    )
    assert render(req) == (CASES / "sbatch_minimal.sh").read_text()


@pytest.mark.parametrize(("out", "job"), [("42\n", "42"), ("42;cluster1\n", "42"), ("  7\n", "7")])
def test_parsable_job_id(out: str, job: str) -> None:
    assert parse_job_id(out) == job


def test_parsable_without_a_job_id_is_an_error() -> None:
    with pytest.raises(FleetctlError, match="no job id"):
        parse_job_id("sbatch: warning: something\n")


@pytest.mark.parametrize(
    ("stderr", "line", "code"),
    [
        (
            "sbatch: error: invalid partition specified: nope\n"
            "sbatch: error: Batch job submission failed: Invalid partition name specified\n",
            "Slurm refused the job: invalid partition specified: nope; "
            "Invalid partition name specified",
            2,
        ),
        (
            "sbatch: error: Invalid generic resource (gres) specification\n",
            "Slurm refused the job: Invalid generic resource (gres) specification",
            2,
        ),
        (
            "sbatch: error: Batch job submission failed: Node count specification invalid\n",
            "Slurm refused the job: Node count specification invalid",
            2,
        ),
        (
            "sbatch: error: Batch job submission failed: Requested time limit is invalid "
            "(missing or exceeds some limit)\n",
            "Slurm refused the job: Requested time limit is invalid (missing or exceeds some "
            "limit)",
            2,
        ),
        (
            "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
            "(connect failure)\n",
            "sbatch failed: Unable to contact slurm controller (connect failure)",
            3,
        ),
        ("", "Slurm refused the job: exit code 1", 2),
    ],
)
def test_sbatch_refusal_is_one_line_quoting_slurm(stderr: str, line: str, code: int) -> None:
    err = submit_error(stderr, 1)
    assert (err.one_line(), err.exit_code) == (line, code)


def test_gres_and_time_are_checked_before_submitting() -> None:
    for ok in ("gpu:1", "gpu:a100:2", "shard:4", "gpu:1,shard:2", "gpu"):
        assert check_gres(ok) == ok
    for bad in ("gpu:", ":1", "gpu 1", ""):
        with pytest.raises(UsageError, match="--gres"):
            check_gres(bad)
    for ok in ("30", "1:00:00", "2-00:00:00", "1-12", "UNLIMITED"):
        assert check_time(ok) == ok
    for bad in ("1h", "tomorrow", "1:2:3:4"):
        with pytest.raises(UsageError, match="--time"):
            check_time(bad)


def test_show_job_running() -> None:
    info = parse_show_job((CASES / "show_job_running.txt").read_text())
    assert info == JobInfo("1", "RUNNING", None, 0, None, "node[1-2]", "node1")
    assert not info.pending and not info.done and not info.hopeless


def test_show_job_failed_carries_the_scripts_exit_code() -> None:
    info = parse_show_job((CASES / "show_job_failed.txt").read_text())
    assert info is not None
    assert (info.state, info.exit_code, info.done) == ("FAILED", 3, True)


def test_show_job_that_can_never_start_is_hopeless() -> None:
    info = parse_show_job((CASES / "show_job_hopeless.txt").read_text())
    assert info is not None
    assert (info.state, info.reason, info.hopeless) == ("PENDING", "PartitionConfig", True)
    assert describe(info, 3) == "PENDING (PartitionConfig), position 3 in queue"


def test_show_job_unknown_is_none() -> None:
    assert parse_show_job("slurm_load_jobs error: Invalid job id specified\n") is None


def test_queue_position_and_presence() -> None:
    assert queue_position("12\n7\n9\n", "7") == 2
    assert queue_position("12\n", "7") is None
    assert in_queue("7 RUNNING\n") and not in_queue("") and not in_queue("\n")


def test_adopted_job_id_only_inside_an_allocation() -> None:
    assert adopted_job_id({"FLEETCTL_RUN_ID": "j"}) is None
    assert adopted_job_id({"FLEETCTL_RUN_ID": "j", "SLURM_JOB_ID": "4"}) == "j"
    assert adopted_job_id({"SLURM_JOB_ID": "4"}) is None


def test_batch_job_adopts_the_folder_its_submitter_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outer = RunFolder.create(tmp_path, "j1")
    outer.write_slurm(SlurmRecord(job_id=None), "#!/bin/sh\n")  # written before sbatch answers
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("FLEETCTL_RUN_ID", "j1")
    assert RunFolder.create(tmp_path, "j1").path == outer.path  # started before the record
    outer.write_slurm(SlurmRecord(job_id="42"))
    inner = RunFolder.create(tmp_path, "j1")
    assert inner.path == outer.path and inner.load_slurm() == SlurmRecord(job_id="42")
    assert (outer.path / "sbatch.sh").read_text() == "#!/bin/sh\n"
    monkeypatch.setenv("SLURM_JOB_ID", "43")
    with pytest.raises(RunFolderError, match="already exists"):
        RunFolder.create(tmp_path, "j1")  # another Slurm job: not its folder
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("FLEETCTL_RUN_ID", "j2")
    with pytest.raises(RunFolderError, match="already exists"):
        RunFolder.create(tmp_path, "j1")  # another run's id
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("FLEETCTL_RUN_ID", "j1")
    with pytest.raises(RunFolderError, match="already exists"):
        RunFolder.create(tmp_path, "j1")  # outside Slurm: never


def test_the_spec_file_holds_the_options_record_without_the_submit_side(tmp_path: Path) -> None:
    """The run inside gets the record the options make (``RunSpec.to_dict()``), less what
    belongs to this side (the Slurm and monitor groups, --nodes), and the selection."""
    import json

    from fleetctl.api.helpers import parse_size
    from fleetctl.api.runspec import RunSpec
    from fleetctl.api.types import CollectOptions

    (tmp_path / "train.py").write_text("print(1)\n")
    res = run_cli(
        "run", "--slurm", "--nodes", "3", "--partition", "gpu", "--gres", "gpu:1", "--time",
        "10", "--queue-timeout", "60", "--runs-dir", str(tmp_path / "r"), "--launcher",
        "torchrun", "--env-var", "A=1", "--env-var", "B=2", "--no-check", "--grace", "2",
        "--launcher-arg=--max-restarts=1", "--collect-max", "1M", "--tail", "0", "--dry-run",
        "--json", "train.py", "--epochs", "2",
        cwd=tmp_path, env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    content = json.loads(res.stdout)["spec"]["content"]
    assert content["format"] == "fleetctl-run-spec/1"
    assert RunSpec.from_dict(content["spec"]) == RunSpec.build(
        "train.py", "--epochs", "2", launcher="torchrun", env={"A": "1", "B": "2"},
        check=False, grace=2, launcher_args=["--max-restarts=1"],
        collect=CollectOptions(max_bytes=parse_size("1M")),
    )  # fmt: skip
    assert content["inside"] == {
        "runs_dir": str(tmp_path / "r"), "inventory": None, "limit": None, "known_hosts": None,
        "accept_new": False, "connect_timeout": 10.0, "tail": "0", "raw_output": False,
    }  # fmt: skip


def test_dry_run_prints_the_script_and_submits_nothing(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("print(1)\n")
    res = run_cli(
        "run", "--slurm", "--nodes", "2", "--gres", "shard:2", "--dry-run",
        "--runs-dir", str(tmp_path / "runs"), "--launcher", "plain", "job.py", "x",
        cwd=tmp_path, env={"PATH": "/nonexistent"},  # no sbatch: nothing can be submitted
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert "#SBATCH --nodes=2\n" in res.stdout and "#SBATCH --gres=shard:2\n" in res.stdout
    job = res.stdout.split("#SBATCH --job-name=fleetctl-", 1)[1].split("\n", 1)[0]
    # the options, SCRIPT and ARGS are in the spec file the run inside reads, not in the script
    assert res.stdout.rstrip().endswith(
        f" -m fleetctl run --spec={tmp_path}/runs/{job}/run-spec.json"
    )
    assert "--launcher=plain" not in res.stdout
    assert "would submit" in res.stderr and not (tmp_path / "runs").exists()
    assert "dry run: not checked by Slurm: `sbatch` not found" in res.stderr


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--partition", "gpu"], "--partition: only with --slurm"),
        (["--slurm"], "--slurm needs --nodes N"),
        (["--slurm", "--no-slurm", "--nodes", "2"], "contradict"),
        (["--slurm", "--nodes", "2", "--gres", "gpu 1"], "--gres"),
        (["--slurm", "--nodes", "2", "--time", "1h"], "--time"),
        (["--slurm", "--nodes", "2", "--json", "--full"], "--full applies"),
        (["--slurm-no-shared-fs"], "--slurm-no-shared-fs: only with --slurm"),
        (["--slurm", "--nodes", "2", "--slurm-no-shared-fs", "--detach"], "no --detach"),
    ],
)
def test_slurm_usage_errors_exit_2(tmp_path: Path, args: list[str], msg: str) -> None:
    (tmp_path / "job.py").write_text("print(1)\n")
    res = run_cli("run", *args, "--dry-run", "job.py", cwd=tmp_path)
    assert res.exit_code == 2, res.stderr
    assert msg in res.stderr


ROLE_JOB = """\
name: two-roles
roles:
  server:
    instances: 1
    script: server.py
  worker:
    instances: 2
    script: worker.py
"""


def _role_code(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "job.yml").write_text(ROLE_JOB)
    for name in ("server.py", "worker.py"):
        (code / name).write_text("print(1)\n")
    return code


def test_batch_script_for_a_role_job_matches_golden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--job: nodes from the roles' instances (1 + 2), the run inside reads the file's copy in
    the run folder, with the code folder it had here."""
    import sys

    from fleetctl.api import slurm

    code = _role_code(tmp_path)
    monkeypatch.chdir(code)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.setattr(slurm, "_python_path", lambda: "/LIB")
    sub = slurm.submission(
        None, nodes=None, job_file="job.yml", runs_dir=tmp_path / "runs", job_id="j1",
        grace=2.0, partition="gpu",
    )  # fmt: skip
    text = sub.script.replace(sys.executable, "PY").replace(str(tmp_path), "/T")
    assert text == (CASES / "sbatch_role_job.sh").read_text()
    assert sub.request.nodes == 3
    spec = sub.request.spec  # what the run inside reads from run-spec.json
    assert spec is not None and spec["inside"]["runs_dir"] == f"{tmp_path}/runs"
    program = spec["spec"]["program"]
    assert program["job_file"] == f"{tmp_path}/runs/j1/job-file/job.yml"
    assert (program["code"], spec["spec"]["supervision"]["grace"]) == (str(code), 2.0)
    assert spec["spec"]["slurm"]["partition"] is None  # this side's: in the script
    assert sub.job_file == (str(code / "job.yml"), str(tmp_path / "runs/j1/job-file/job.yml"))


def test_a_role_job_is_copied_into_the_run_folder_at_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.api import slurm
    from fleetctl.slurm.submit import SlurmClient

    code = _role_code(tmp_path)
    monkeypatch.chdir(code)
    monkeypatch.setattr(SlurmClient, "sbatch", lambda self, script: "42")
    sub = slurm.submission(None, nodes=None, job_file="job.yml", runs_dir=tmp_path / "runs")
    job = sub.submit()
    (code / "job.yml").write_text("edited after submit\n")  # the queued job keeps its copy
    assert (job.run_folder / "job-file" / "job.yml").read_text() == ROLE_JOB
    assert job.executor == "sbatch" and job.record.executor == "sbatch"
    assert job.submitted is not None and job.submitted.record.job_file == "job-file/job.yml"
    spec = job.run_folder / "run-spec.json"
    data, _ = specfile.read(spec)
    assert data["program"]["job_file"] == f"{job.run_folder}/job-file/job.yml"
    assert (spec.stat().st_mode & 0o777, job.run_folder.stat().st_mode & 0o777) == (0o600, 0o700)
    assert job.submitted.document() is None  # queued: the run inside has not written its record


def test_a_role_without_instances_needs_nodes(tmp_path: Path) -> None:
    from fleetctl.api import slurm

    code = _role_code(tmp_path)
    (code / "job.yml").write_text(ROLE_JOB.replace("    instances: 2\n", ""))
    with pytest.raises(UsageError, match=r"role 'worker' has no 'instances'.*give --nodes N"):
        slurm.submission(None, nodes=None, job_file=code / "job.yml", runs_dir=tmp_path)
    sub = slurm.submission(None, nodes=4, job_file=code / "job.yml", runs_dir=tmp_path)
    assert "#SBATCH --nodes=4\n" in sub.script


def test_dry_run_of_a_role_job_shows_the_script_and_the_copy(tmp_path: Path) -> None:
    import json

    code = _role_code(tmp_path)
    res = run_cli(
        "run", "--slurm", "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--job", "job.yml",
        cwd=code, env={"PATH": "/nonexistent"},
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert "#SBATCH --nodes=3\n" in res.stdout and "the role job" in res.stderr
    js = run_cli(
        "run", "--slurm", "--dry-run", "--json", "--runs-dir", str(tmp_path / "runs"),
        "--job", "job.yml", cwd=code, env={"PATH": "/nonexistent"},
    )  # fmt: skip
    doc = json.loads(js.stdout)
    assert doc["dry_run"] is True and doc["nodes"] == 3
    assert doc["job_file"]["from"] == str(code / "job.yml")
    assert doc["sbatch_script"].startswith("#!/bin/sh\n") and not (tmp_path / "runs").exists()
    assert doc["spec"]["file"] == f"{doc['folder']}/run-spec.json"
    program = doc["spec"]["content"]["spec"]["program"]
    assert program["code"] == str(code)
    assert program["job_file"] == f"{doc['folder']}/job-file/job.yml"
    assert doc["command"][-1] == f"--spec={doc['spec']['file']}"


def test_json_document_is_the_inside_runs_record_with_the_slurm_job(tmp_path: Path) -> None:
    """--json prints what `run --json` would (the inside run's job.json), naming the Slurm job."""
    from fleetctl.api.submitted import Submitted
    from fleetctl.job.records.jobrecord import JobRecord

    run = RunFolder.create(tmp_path, "j1")
    doc = {
        "job_id": "j1", "status": "failed", "attempt": 1, "detached": False, "verdict": None,
        "launcher": "roles", "nodes": [{"rank": 0, "host": "node1", "state": "exited"}],
        "first_failure": None, "slurm": {"job_id": "42"}, "folder": str(run.path),
    }  # fmt: skip
    run.write_job(JobRecord.from_dict(doc, source="job.json"))
    job = Submitted(run, "42", SlurmRecord(job_id="42", state="FAILED"), client=object())  # type: ignore[arg-type]
    got = job.document()
    assert got is not None
    assert got["slurm"] == {"job_id": "42", "state": "FAILED"}
    assert (got["status"], got["nodes"][0]["host"]) == ("failed", "node1")


def test_batch_script_without_a_shared_filesystem_matches_golden() -> None:
    req = BatchRequest(
        nodes=2,
        job_id="j1",
        folder="/home/u/runs/j1",
        chdir="/shared/code",
        command=inside_command("python3", "/tmp/fleetctl-slurm-j1/run-spec.json"),
        env={"FLEETCTL_RUN_ID": "j1"},
        private=True,
        spec=specfile.document(
            {"program": {"script": "job.py", "env": {"T": "'it's' \"x\""}}},
            specfile.Inside(runs_dir="/tmp/fleetctl-slurm-j1"),
        ),
    )
    assert render(req) == (CASES / "sbatch_private.sh").read_text()
    assert (req.output, req.inside_folder) == (
        "/tmp/fleetctl-slurm-j1.out",
        "/tmp/fleetctl-slurm-j1/j1",
    )


def test_private_batch_script_keeps_the_exit_code_and_its_files_until_the_pull() -> None:
    """The script's own shell: the inside run's exit code survives the wait for the pull,
    the end is said on stderr, and the batch host's files go once the pull is done."""
    import secrets
    import subprocess

    job = f"t{secrets.token_hex(4)}"
    root = f"/tmp/fleetctl-slurm-{job}"
    inside = f"mkdir -p {root}/{job} && echo out > {root}/{job}/x; sleep 0.3; exit 7"
    req = BatchRequest(
        nodes=1, job_id=job, folder="/nowhere", chdir="/", command=("sh", "-c", inside),
        private=True,
    )  # fmt: skip
    proc = subprocess.Popen(
        ["sh", "-c", render(req)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        from fleetctl.testing.wait import wait_for

        wait_for(lambda: Path(f"{root}/{job}/x").exists(), 10, what="the run inside's folder")
        assert proc.poll() is None
        Path(f"{root}/{job}/.fetched").touch()  # what the submitter's srun step does
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["rm", "-rf", root], check=False)
    assert proc.returncode == 7 and "fleetctl-slurm: ended 7" in err
    assert not Path(root).exists()


def test_submission_without_a_shared_filesystem_runs_inside_under_the_batch_hosts_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fleetctl.api import slurm

    code = _role_code(tmp_path)
    monkeypatch.chdir(code)
    sub = slurm.submission(
        None, nodes=None, job_file="job.yml", runs_dir=tmp_path / "runs", job_id="j1",
        shared_fs=False,
    )  # fmt: skip
    spec = sub.request.spec
    assert sub.request.private and spec is not None
    assert spec["inside"]["runs_dir"] == "/tmp/fleetctl-slurm-j1"
    assert spec["spec"]["program"]["job_file"] == f"{code}/job.yml"  # where it is, with the code
    assert sub.request.command[-1] == "--spec=/tmp/fleetctl-slurm-j1/run-spec.json"
    assert "#SBATCH --output=/tmp/fleetctl-slurm-j1.out\n" in sub.script


def test_a_pulled_job_json_names_the_local_folder(tmp_path: Path) -> None:
    import json

    inside = "/tmp/fleetctl-slurm-j1/j1"
    local = tmp_path / 'runs "x"' / "j1"
    local.mkdir(parents=True)
    node = {"rank": 0, "host": "node1", "folder": f"{inside}/0-node1"}
    doc = {"job_id": "j1", "status": "failed", "folder": inside, "nodes": [node]}
    (local / "job.json").write_text(json.dumps({**doc, "other": inside + "x"}))
    RunFolder(local).relocate_job(inside)
    got = json.loads((local / "job.json").read_text())
    assert got["folder"] == str(local) and got["nodes"][0]["folder"] == f"{local}/0-node1"
    assert got["other"] == inside + "x"  # only the folder itself and paths inside it
    (local / "job.json").write_text(json.dumps({"job_id": "j1", "folder": inside}))  # no status
    RunFolder(local).relocate_job(inside)  # not a record: left as pulled
    assert json.loads((local / "job.json").read_text())["folder"] == inside


@pytest.mark.parametrize("case", ["job.json", "job.detached.json", "job.retry.json"])
def test_moving_job_json_through_its_record_writes_what_the_text_replace_wrote(
    case: str, tmp_path: Path
) -> None:
    """Before the records, ``_relocate`` replaced the folder's JSON-escaped path as text (a
    whole string, or one that goes on with ``/``); through ``JobRecord`` the file is the same,
    byte for byte, for a golden job.json and a local folder whose name JSON escapes."""
    import json

    golden = (Path(__file__).parent / "records" / case).read_text()
    inside = json.loads(golden)["folder"]
    local = tmp_path / 'runs "é"' / "j1"
    local.mkdir(parents=True)
    old, here = (json.dumps(str(x))[:-1] for x in (inside, local))
    want = golden.replace(old + '"', here + '"').replace(old + "/", here + "/")
    assert want != golden
    (local / "job.json").write_text(golden)
    RunFolder(local).relocate_job(inside)
    assert (local / "job.json").read_text() == want


def test_a_job_that_failed_before_writing_its_output_suggests_no_shared_fs(
    tmp_path: Path,
) -> None:
    """Without a shared filesystem slurmstepd cannot open the output in the run folder: the job
    fails at once and no slurm.err comes; the error says what to do."""
    from fleetctl.api.submitted import Submitted
    from fleetctl.errors import JobFailed
    from fleetctl.job.records.jobrecord import JobRecord

    run = RunFolder.create(tmp_path, "j1")
    run.write_job(JobRecord(job_id="j1", status="queued", folder=str(run.path)))
    job = Submitted(run, "5", SlurmRecord(job_id="5"), client=object())  # type: ignore[arg-type]
    with pytest.raises(JobFailed, match="submit with --slurm-no-shared-fs"):
        job.verdict(JobInfo("5", "FAILED", exit_code=1))
    (run.path / "slurm.err").write_text("python: not found\n")
    run.write_job(JobRecord(job_id="j1", status="queued", folder=str(run.path)))
    with pytest.raises(JobFailed, match=r"before fleetctl ran inside it; see .*slurm\.err$"):
        job.verdict(JobInfo("5", "FAILED", exit_code=1))


def never() -> bool:
    return False


class FakeSlurm:
    """A Slurm whose job has the scripted states, one per ``show``; records cancels."""

    def __init__(self, states: list[JobInfo]) -> None:
        self.states = states
        self.cancels: list[bool] = []

    def show(self, job: str) -> JobInfo | None:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def position(self, job: str) -> int | None:
        return 1

    def cancel(self, job: str, *, graceful: bool = False, timeout: float = 0) -> None:
        self.cancels.append(graceful)


def test_queue_timeout_cancels_and_exits_5(tmp_path: Path) -> None:
    slurm = FakeSlurm([JobInfo("5", "PENDING", "Resources")])
    events: list[SlurmEvent] = []
    with pytest.raises(QueueTimeout, match="did not start within --queue-timeout 0s") as e:
        run_submitted(slurm, "5", tmp_path / "out", events.append, queue_timeout=0, ended=never)  # type: ignore[arg-type]
    assert e.value.exit_code == 5 and slurm.cancels == [False]
    assert [ev.kind for ev in events] == ["waiting", "cancelling"]
    assert events[0].text == "PENDING (Resources), position 1 in queue"


def test_a_job_that_can_never_start_is_cancelled_exit_2(tmp_path: Path) -> None:
    slurm = FakeSlurm([JobInfo("5", "PENDING", "PartitionNodeLimit")])
    with pytest.raises(UsageError, match="can never start as asked \\(PartitionNodeLimit\\)"):
        out = tmp_path / "out"
        run_submitted(slurm, "5", out, lambda ev: None, queue_timeout=None, ended=never)  # type: ignore[arg-type]
    assert slurm.cancels == [False]


def test_ctrl_c_while_following_cancels_gracefully_then_propagates(tmp_path: Path) -> None:
    out = tmp_path / "slurm.out"
    out.write_text("[0 node1] hello\n")
    slurm = FakeSlurm([JobInfo("5", "RUNNING", nodes="node[1-2]")])
    seen: list[str] = []

    def emit(ev: SlurmEvent) -> None:
        seen.append(ev.kind)
        if ev.kind == "line":
            raise KeyboardInterrupt  # Ctrl-C arrives while a line is shown

    with pytest.raises(KeyboardInterrupt):
        run_submitted(slurm, "5", out, emit, queue_timeout=None, ended=never)  # type: ignore[arg-type]
    assert slurm.cancels == [True]
    assert seen == ["started", "line", "cancelling", "cancelled"]


def test_following_streams_both_files_to_the_end(tmp_path: Path) -> None:
    out, err = tmp_path / "slurm.out", tmp_path / "slurm.err"
    out.write_text("[0 node1] a\n[1 node2] b")  # the last line not ended yet
    err.write_text("fleetctl: job succeeded\n")
    slurm = FakeSlurm([JobInfo("5", "RUNNING"), JobInfo("5", "COMPLETED", exit_code=0)])
    events: list[SlurmEvent] = []
    info = run_submitted(slurm, "5", out, events.append, queue_timeout=None, error=err, ended=never)  # type: ignore[arg-type]
    assert info.state == "COMPLETED" and slurm.cancels == []
    got = [(e.kind, e.text) for e in events if e.kind in ("line", "errline")]
    assert got == [
        ("line", "[0 node1] a"),
        ("errline", "fleetctl: job succeeded"),
        ("line", "[1 node2] b"),
    ]


@pytest.mark.parametrize(("status", "at_least", "under"), [("running", 4.0, 99), ("failed", 0, 1)])
def test_follower_asks_slurmctld_seldom_until_the_run_inside_has_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str, at_least: float, under: float
) -> None:
    """Every ask is a slurmctld RPC: every 2 s while the run inside is live, every 0.1 s
    once its job.json says it ended (the batch script's end is then a moment away)."""
    from types import SimpleNamespace

    from fleetctl.slurm import submit

    clock = [0.0]
    fake_time = SimpleNamespace(
        monotonic=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s)
    )
    from fleetctl.api.submitted import Submitted
    from fleetctl.job.records.jobrecord import JobRecord

    monkeypatch.setattr(submit, "time", fake_time)
    run = RunFolder.create(tmp_path, "j1")
    run.write_job(JobRecord(job_id="j1", status=status))
    slurm = FakeSlurm([JobInfo("5", "RUNNING"), JobInfo("5", "RUNNING"), JobInfo("5", "COMPLETED")])
    ended = Submitted(run, "5", SlurmRecord(job_id="5"), client=slurm).inside_ended  # type: ignore[arg-type]
    submit.follow(slurm, "5", run.path / "slurm.out", lambda ev: None, ended=ended)  # type: ignore[arg-type]
    assert at_least <= clock[0] < under, clock[0]


def test_output_tail_reads_only_new_whole_lines(tmp_path: Path) -> None:
    p = tmp_path / "f"
    tail = OutputTail(p)
    assert tail.lines() == []  # not created yet
    p.write_bytes(b"a\nb")
    assert tail.lines() == ["a"]
    with p.open("ab") as f:
        f.write(b"c\nd\n")
    assert tail.lines() == ["bc", "d"]
    assert tail.lines(final=True) == []


def test_slurm_error_is_exit_3() -> None:
    assert SlurmError("x").exit_code == 3


def test_connect_json_keeps_the_slurm_job_of_srun_nodes(tmp_path: Path) -> None:
    """So `status`/`stop`/`logs` of an inside run reach its nodes by srun steps, not SSH."""
    from fleetctl.job.records.runs import load_nodes, write_connect
    from fleetctl.node import Node
    from fleetctl.transport.srun import is_srun

    folder = RunFolder.create(tmp_path, "j1")
    srun_node = Node(name="gpu01", address="gpu01", vars={"fleetctl_connection": "srun",
                     "fleetctl_slurm_job": "42"})  # fmt: skip
    ssh_node = Node(name="gpu02", address="10.0.0.2", vars={"fleetctl_nic": "ib0"})
    write_connect(folder.path, [srun_node, ssh_node])
    back = load_nodes(folder)
    assert is_srun(back[0]) and back[0].vars["fleetctl_slurm_job"] == "42"
    assert not is_srun(back[1]) and back[1].vars == {}


def test_no_slurm_ignores_the_allocation_it_runs_in(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text("print(1)\n")
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "localhost"}
    args = ("run", "--dry-run", "--json", "--launcher", "plain", "job.py")
    inside = run_cli(*args, env=env, cwd=tmp_path)
    assert inside.exit_code == 0, inside.stderr
    assert [n["host"] for n in inside.json["nodes"]] == ["localhost"]  # the allocation
    opted_out = run_cli(args[0], "--no-slurm", *args[1:], env=env, cwd=tmp_path)
    assert opted_out.exit_code == 0, opted_out.stderr
    assert [n["address"] for n in opted_out.json["nodes"]] == ["127.0.0.1"]  # this machine


def test_the_batch_scripts_pythonpath_is_where_this_fleetctl_is_imported_from() -> None:
    import fleetctl
    from fleetctl.api.slurm import _python_path

    assert _python_path() == str(Path(fleetctl.__file__).resolve().parent.parent)
