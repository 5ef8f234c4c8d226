"""The library API without the lab: what ``import fleetctl`` costs and exports, results read
from job.json's shape, jobs on this machine (the embedded local node), the invoke tasks, and
``run --before``'s usage errors before any host is reached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fleetctl
from fleetctl import Fleet, FleetctlError, Job, RunResult, UsageError
from fleetctl.testing.cli_runner import run_cli

JOB = """\
import os, sys
for i in range(3):
    print(f"line {i}", flush=True)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def test_import_fleetctl_loads_nothing_else_and_every_exported_name_resolves() -> None:
    probe = (
        "import json, sys, fleetctl\n"
        "before = sorted(m for m in sys.modules if m.startswith('fleetctl'))\n"
        "names = {n: type(getattr(fleetctl, n)).__name__ for n in fleetctl.__all__}\n"
        "print(json.dumps([before, names, 'fabric' in sys.modules, 'paramiko' in sys.modules]))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    before, names, fabric_loaded, paramiko_loaded = json.loads(p.stdout)
    assert before == ["fleetctl"]
    assert {"Fleet", "Job", "RunResult", "FirstFailure", "FleetctlError"} <= set(names)
    assert names["Fleet"] == "type" and names["__version__"] == "str"
    assert not fabric_loaded and not paramiko_loaded  # resolving the names connects nothing


def test_an_unknown_attribute_of_fleetctl_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        fleetctl.NoSuchThing  # noqa: B018


@pytest.mark.parametrize(
    ("doc", "code", "ok", "reason"),
    [
        ({"status": "succeeded"}, 0, True, ""),
        (
            {"status": "succeeded", "teardown": {"nodes": [{"remaining": [{"pid": 5}]}]}},
            3,
            False,
            "succeeded",
        ),
        ({"status": "interrupted"}, 130, False, "interrupted"),
        ({"status": "failed", "verdict": "timed out after 5 s"}, 3, False, "timed out after 5 s"),
        (
            {
                "status": "failed",
                "first_failure": {"rank": 1, "host": "gpu02", "state": "lost", "reason": "silent"},
            },
            3,
            False,
            "node 1 (gpu02) failed first: lost (silent)",
        ),
        (
            {
                "status": "failed",
                "first_failure": {"rank": 0, "host": "a", "state": "failed", "signal": 9},
            },
            3,
            False,
            "node 0 (a) failed first: signal 9 (SIGKILL)",
        ),
    ],
)
def test_a_result_reads_job_json_with_the_clis_exit_codes(
    doc: dict, code: int, ok: bool, reason: str
) -> None:
    r = RunResult.from_record({"job_id": "j", **doc}, "/runs/j")
    assert (r.exit_code, r.ok, r.reason) == (code, ok, reason)
    assert r.run_folder == Path("/runs/j")


@pytest.fixture
def code(tmp_path: Path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "job.py").write_text(JOB)
    return folder


def local(tmp_path: Path) -> Fleet:
    return Fleet.local(runs_dir=tmp_path / "runs")


def test_a_local_run_yields_its_lines_in_order_and_succeeds(tmp_path: Path, code: Path) -> None:
    f = local(tmp_path)
    job = f.run(str(code / "job.py"), launcher="plain", code=code)
    host = f.nodes[0].name
    assert [str(ln) for ln in job.lines(timeout=60)] == [f"[0 {host}] line {i}" for i in range(3)]
    r = job.wait(timeout=60)
    assert r.ok and r.exit_code == 0 and r.status == "succeeded"
    assert (r.run_folder / "job.json").is_file() and job.done


def test_a_failing_local_run_has_its_first_failure_and_attach_reads_it_back(
    tmp_path: Path, code: Path
) -> None:
    job = local(tmp_path).run(str(code / "job.py"), launcher="plain", code=code, env={"EXIT": "5"})
    r = job.wait(timeout=60)
    assert (r.status, r.exit_code) == ("failed", 3)
    assert r.first_failure is not None and r.first_failure.reason == "exit code 5"
    again = Job.attach(job.job_id, runs_dir=tmp_path / "runs")
    assert again.done and again.wait(timeout=5).reason == r.reason
    assert [ln.text for ln in again.lines()] == ["line 0", "line 1", "line 2"]


def test_a_before_hook_that_raises_stops_the_run_before_launch(tmp_path: Path, code: Path) -> None:
    def refuse(nodes, settings) -> None:
        raise FleetctlError(f"not today on {nodes[0].name}")

    job = local(tmp_path).run(str(code / "job.py"), launcher="plain", code=code, before=refuse)
    with pytest.raises(FleetctlError, match="not today"):
        job.wait(timeout=60)
    doc = json.loads((job.run_folder / "job.json").read_text())
    assert doc["status"] == "error" and not (job.run_folder / "plan.json").exists()


def test_a_stop_before_the_launch_ends_the_run_there(tmp_path: Path, code: Path) -> None:
    import threading

    box: dict[str, Job] = {}
    stopper = threading.Thread(target=lambda: box["job"].stop())

    def before(nodes, settings) -> None:  # the stop arrives while the run is still preparing
        stopper.start()
        assert box["job"]._executor._stop_asked.wait(30)  # type: ignore[attr-defined]

    box["job"] = job = local(tmp_path).run(
        str(code / "job.py"), launcher="plain", code=code, before=before
    )
    with pytest.raises(fleetctl.Interrupted, match="stopped before launch"):
        job.wait(timeout=60)
    stopper.join(30)
    assert not stopper.is_alive() and not (job.run_folder / "plan.json").exists()


def test_bad_run_arguments_are_usage_errors_before_anything_starts(tmp_path: Path) -> None:
    f = local(tmp_path)
    with pytest.raises(UsageError, match="launcher"):
        f.run("x.py", launcher="mpirun")
    with pytest.raises(UsageError, match="--nproc-per-node"):
        f.run("x.py", nproc_per_node=0)
    with pytest.raises(UsageError, match="not a valid variable name"):
        f.run("x.py", env={"A-B": "1"})
    with pytest.raises(UsageError, match="script not found"):
        f.run(str(tmp_path / "missing.py"), launcher="plain")
    assert not (tmp_path / "runs").exists()


def test_the_local_fleet_has_no_fabric_group(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="needs SSH hosts"):
        local(tmp_path).group()


# --------------------------------------------------------------------------- run --before


@pytest.fixture
def unreachable(tmp_path: Path) -> Path:
    """A host on a loopback port nobody listens on: any connection attempt would fail (3)."""
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  hosts:\n    h1:\n      ansible_host: 127.0.0.1\n      ansible_port: 9\n"
    )
    return inv


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("{dir}/nofile.py:prepare", "--before {dir}/nofile.py:prepare: no such file"),
        ("{dir}/fabfile.py:nosuch", "has no task 'nosuch'"),
        ("{dir}/fabfile.py", "expected FILE:TASK"),
        ("{dir}/broken.py:prepare", "cannot load {dir}/broken.py: ZeroDivisionError"),
    ],
)
def test_a_bad_before_task_is_a_one_line_usage_error_before_the_check(
    tmp_path: Path, code: Path, unreachable: Path, spec: str, message: str
) -> None:
    (tmp_path / "fabfile.py").write_text("def prepare(c):\n    c.run('true')\n")
    (tmp_path / "broken.py").write_text("1 / 0\n")
    r = run_cli(
        "run", "-i", str(unreachable), "--launcher", "plain", "--runs-dir", str(tmp_path / "r"),
        "--before", spec.format(dir=tmp_path), "--code", str(code), str(code / "job.py"),
    )  # fmt: skip
    assert r.exit_code == 2, r.stderr
    assert message.format(dir=tmp_path) in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_before_needs_an_inventory(tmp_path: Path, code: Path) -> None:
    (tmp_path / "fabfile.py").write_text("def prepare(c):\n    pass\n")
    r = run_cli("run", "--before", f"{tmp_path}/fabfile.py:prepare", str(code / "job.py"))
    assert r.exit_code == 2 and "needs an inventory" in r.stderr


def test_a_before_task_is_found_in_the_fabfiles_collection_too(tmp_path: Path) -> None:
    from fleetctl.api.before import load_task

    (tmp_path / "fab.py").write_text(
        "from invoke import Collection, task\n"
        "@task\ndef warm_up(c):\n    pass\n"
        "ns = Collection(warm_up)\n"
        "del warm_up\n"
    )
    assert load_task(f"{tmp_path}/fab.py:warm_up").func.body.__name__ == "warm_up"


@pytest.mark.parametrize(
    "line",
    [
        "from fabric.api import run, env",
        "from fabric.contrib.files import exists",
        "import fabric.operations",
    ],
)
def test_a_fabric_1_fabfile_is_told_that_before_runs_fabric_2_tasks(
    tmp_path: Path, line: str
) -> None:
    from fleetctl.api.before import load_task

    (tmp_path / "fabfile.py").write_text(f"{line}\n\ndef prepare():\n    run('true')\n")
    with pytest.raises(UsageError) as ei:
        load_task(f"{tmp_path}/fabfile.py:prepare")
    msg = str(ei.value)
    assert "\n" not in msg and "cannot load" in msg and "Fabric 1 fabfile" in msg
    assert "from fabric import task" in msg


# ---------------------------------------------------------------------------------- tasks


def test_fleetctl_tasks_is_an_invoke_collection_a_team_adds_to_its_own() -> None:
    from invoke import Collection

    import fleetctl.tasks

    ns = Collection()
    ns.add_collection(fleetctl.tasks)
    assert sorted(ns.collections["fleetctl"].tasks) == ["check", "push", "run", "runs", "stop"]


def test_the_projects_own_tasks_include_fleetctls() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "invoke", "--list"],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "fleetctl.run" in p.stdout and "lint" in p.stdout


def test_the_run_task_exits_with_the_jobs_verdict(tmp_path: Path, code: Path) -> None:
    (tmp_path / "tasks.py").write_text(
        "from invoke import Collection\nimport fleetctl.tasks\n"
        "ns = Collection()\nns.add_collection(fleetctl.tasks)\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "invoke", "fleetctl.run", str(code / "job.py"),
         "--launcher", "plain", "--env-var", "EXIT=4"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert p.returncode == 3, p.stderr
    host = Fleet.local().nodes[0].name
    assert p.stdout.splitlines()[:3] == [f"[0 {host}] line {i}" for i in range(3)]
    assert "failed first: exit code 4" in p.stderr


def test_the_run_tasks_nproc_per_node_is_parsed_by_the_record_as_the_commands() -> None:
    """The task passes ``--nproc-per-node`` as given; the record refuses a bad one with the
    command's one line and exit code, before any host is reached."""
    from invoke import Context, Exit

    import fleetctl.tasks

    with pytest.raises(Exit) as ei:
        fleetctl.tasks.run(Context(), "job.py", nproc_per_node="0")
    assert ei.value.code == 2
    assert ei.value.message == (
        "fleetctl: error: Invalid value for '--nproc-per-node': '0' is not a positive integer"
    )


def test_the_run_tasks_record_options_are_the_fields_keyword_and_default() -> None:
    """Invoke makes the task's flags of its parameters: those of the run record's options
    are the field's keyword (``--nproc-per-node``'s ``nproc_per_node``) with its default."""
    from dataclasses import fields

    import fleetctl.tasks
    from fleetctl.api.runspec import GROUPS
    from fleetctl.api.runspec_fields import keyword

    task = fleetctl.tasks.run
    params = task.argspec(task.body).parameters
    by_flag = {x: f for g in GROUPS.values() for f in fields(g) for x in f.metadata["flags"]}  # type: ignore[arg-type]
    for flag in fleetctl.tasks._RUN_OPTIONS:
        f = by_flag[flag]
        assert params[keyword(f)].default == str(f.default), flag
    assert [a.names[0] for a in task.get_arguments()][4:6] == ["launcher", "nproc-per-node"]


def test_exit_4_says_the_logs_are_incomplete_not_succeeded() -> None:
    """A job that succeeded with a node's logs not home (exit 4) is not ``ok``, and its reason
    says why instead of the bare status."""
    doc = {
        "job_id": "j",
        "status": "succeeded",
        "collected": [
            {"host": "gpu01", "rank": 0, "complete": True},
            {"host": "gpu02", "rank": 1, "complete": False},
        ],
    }
    r = RunResult.from_record(doc, "/runs/j", exit_code=4)
    assert not r.ok and r.logs_incomplete == ["gpu02"]
    assert r.reason == (
        "succeeded, but logs incomplete from gpu02: `fleetctl collect` fetches the rest"
    )


def test_fleetctl_api_loads_each_name_on_first_use() -> None:
    """``exec`` pays for ``Fleet`` alone: the job core, results and SSH load when used, and
    ``runs`` stays the function even after its module is imported by name."""
    probe = (
        "import json, sys\n"
        "from fleetctl.api import Fleet\n"
        "after_fleet = sorted(m for m in sys.modules if m.startswith('fleetctl'))\n"
        "import fleetctl.api.runs, fleetctl.api\n"
        "print(json.dumps([after_fleet, callable(fleetctl.api.runs)]))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    after_fleet, runs_is_function = json.loads(p.stdout)
    assert after_fleet == [
        "fleetctl",
        "fleetctl.api",
        "fleetctl.api.fleet",
        "fleetctl.api.runs",
        "fleetctl.errors",
    ]
    assert runs_is_function


def test_exec_on_this_machine_keeps_every_hosts_outcome(tmp_path: Path) -> None:
    fleet = local(tmp_path)
    seen: list[str] = []
    r = fleet.exec(["echo", "a b;c"], timeout=30, on_result=lambda run: seen.append(run.node))
    assert r.ok and r.exit_code == 0 and [x.stdout for x in r.runs] == ["a b;c\n"]
    assert seen == [r.runs[0].node] and len(r.gathered()) == 1
    bad = fleet.exec("echo out; exit 7", timeout=30)
    assert not bad.ok and bad.exit_code == 3 and bad.runs[0].exit_code == 7


def test_a_dry_run_returns_the_plan_and_starts_nothing(tmp_path: Path, code: Path) -> None:
    plan = local(tmp_path).run(
        str(code / "job.py"), "--x", launcher="plain", env={"K": "V"}, dry_run=True
    )
    assert not isinstance(plan, Job)
    doc = json.loads(plan.to_json())
    assert doc["nodes"][0]["node_rank"] == 0 and "--x" in json.dumps(doc)
    assert not (tmp_path / "runs").exists()


def test_run_refuses_a_job_file_with_a_script_and_a_fabric_task_without_ssh(
    tmp_path: Path, code: Path
) -> None:
    fleet = local(tmp_path)
    with pytest.raises(UsageError, match="replaces SCRIPT"):
        fleet.run(str(code / "job.py"), job_file=tmp_path / "job.yml")
    with pytest.raises(UsageError, match="needs an inventory"):
        fleet.run(str(code / "job.py"), before=f"{tmp_path}/fabfile.py:prepare")
    with pytest.raises(UsageError, match="--nodes 2: the selection has only 1 host"):
        fleet.run(str(code / "job.py"), launcher="plain", nodes=2)


def test_a_run_without_script_or_role_job_is_one_line_in_both_preparers(tmp_path: Path) -> None:
    """Neither SCRIPT nor ``--job``: the direct run and ``run --slurm`` refuse it alike, in
    one line (exit 2), before anything is written."""
    from fleetctl.api.slurm import submission

    with pytest.raises(UsageError, match=r"^missing SCRIPT \(or --job FILE\)$"):
        local(tmp_path).run(dry_run=True)
    with pytest.raises(UsageError, match=r"^missing SCRIPT \(or --job FILE\)$"):
        submission(None, nodes=1, runs_dir=tmp_path / "runs")
    for argv in (("run", "--dry-run"), ("run", "--slurm", "--nodes", "1", "--dry-run")):
        res = run_cli(*argv, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
        assert (res.exit_code, res.stderr) == (
            2,
            "fleetctl: error: missing SCRIPT (or --job FILE)\n",
        )
    assert not (tmp_path / "runs").exists()


def test_a_foreground_run_ends_in_the_calling_thread_with_its_details(
    tmp_path: Path, code: Path
) -> None:
    kinds: list[str] = []
    job = local(tmp_path).run(
        str(code / "job.py"),
        launcher="plain",
        env={"EXIT": "3"},
        foreground=True,
        on_event=lambda ev: kinds.append(ev.kind),
    )
    assert isinstance(job, Job) and job.done and job.details is not None
    assert job.details.status == "failed" and "lines" in kinds
    r = job.wait(timeout=0)
    assert (r.exit_code, r.first_failure.reason if r.first_failure else None) == (3, "exit code 3")


def test_slurm_outside_an_allocation_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    with pytest.raises(UsageError, match="not inside a Slurm allocation"):
        Fleet.slurm()
