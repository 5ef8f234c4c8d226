"""The node's container teardown (``fleetctl/remote/kit/containers.py``, Python 3.8) against a fake
``podman`` on PATH, driven by the argv the controller's podman builder makes: every container
labelled with the job is stopped and removed, another job's is left alone, and a container
that will not go is reported, never hidden."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import node_tree

from fleetctl.plan.runtimes import runtime
from fleetctl.testing.wait import wait_for

#: podman's ps/stop/rm over a JSON file of containers (id -> {"job", "state"}); ``stuck``
#: containers survive rm, as one whose runtime cannot kill it; ``autoremove`` ones are docker's
#: ``run --rm``: stopped, the daemon removes them itself, our rm fails meanwhile ("already in
#: progress") and ps lists them ``gone_after`` more times. ``FAKE_PODMAN_HANG``: the command
#: (``ps``, ``stop``, ``rm``) that never answers, as a hung runtime's.
FAKE = """\
import json, os, signal, sys, time
db = os.environ["FAKE_PODMAN_DB"]
cs = json.load(open(db))
args = sys.argv[1:]
with open(db + ".log", "a") as log:
    log.write(" ".join(args) + "\\n")
if os.environ.get("FAKE_PODMAN_HANG") == args[0]:
    time.sleep(600)
if args[0] == "ps" and os.environ.get("FAKE_PODMAN_TERMED") and not os.path.exists(db + ".t"):
    open(db + ".t", "w").close()  # a concurrent stop's SIGTERM to every process under the
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # supervisor: podman exits 0, silent
    if open(f"/proc/{os.getppid()}/comm").read().strip() == "sh":
        os.kill(os.getppid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
if args[0] == "ps" and os.environ.get("FAKE_PODMAN_KILLED") and not os.path.exists(db + ".k"):
    open(db + ".k", "w").close()  # the first ps is killed, as a concurrent `fleetctl stop` does
    os.kill(os.getpid(), 9)
code = 0
if args[0] == "ps":
    want = args[args.index("--filter") + 1].split("=", 2)[2]
    for i, c in list(cs.items()):
        if c["state"] == "removing":
            c["gone_after"] -= 1
            if c["gone_after"] < 0:
                del cs[i]
    print("\\n".join(i for i, c in sorted(cs.items()) if c["job"] == want))
elif args[0] == "stop":
    for i in args[3:]:
        if cs[i]["state"] == "autoremove":
            cs[i]["state"] = "removing"
        if cs[i]["state"] == "running":
            cs[i]["state"] = "exited"
elif args[0] == "rm":
    for i in args[2:]:
        if i in cs and cs[i]["state"] == "removing":
            print(f"removal of container {i} is already in progress", file=sys.stderr)
            code = 1
        elif i in cs and cs[i]["state"] != "stuck":
            del cs[i]
json.dump(cs, open(db, "w"))
sys.exit(code)
"""

CALL = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); "
    "from remote.kit import containers; "
    "print(json.dumps(containers.end_containers(json.loads(sys.argv[2]), 1.5)))"
)


def _end(
    py38: str, tmp_path: Path, containers: dict, job: str, **extra: str
) -> tuple[dict, dict, list]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "podman"
    fake.write_text(f"#!{py38}\n{FAKE}")
    fake.chmod(0o755)
    db = tmp_path / "containers.json"
    db.write_text(json.dumps(containers))
    pod = runtime("podman")
    cfg = {
        "list": pod.list_argv(job),
        "stop": pod.stop_argv([], 1.5),
        "remove": pod.remove_argv([]),
        "timeout": float(extra.pop("TIMEOUT", "10")),  # one call's bound (--runtime-timeout)
    }
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_PODMAN_DB": str(db),
        **extra,
    }
    out = subprocess.run(
        [py38, "-c", CALL, node_tree(), json.dumps(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    log = Path(f"{db}.log").read_text().splitlines()
    return json.loads(out.stdout), json.loads(db.read_text()), log


def test_the_node_ends_every_container_of_the_job_by_label(py38: str, tmp_path: Path) -> None:
    cs = {
        "a1": {"job": "j1", "state": "running"},
        "a2": {"job": "j1", "state": "exited"},
        "b1": {"job": "j10", "state": "running"},  # another job: a prefix is no match
    }
    said, left, log = _end(py38, tmp_path, cs, "j1")
    assert said == {"found": ["a1", "a2"], "remaining": [], "problem": None}
    assert left == {"b1": {"job": "j10", "state": "running"}}
    assert log == [
        "ps -a -q --filter label=fleetctl.job=j1",
        "stop --time 2 a1 a2",
        "rm --force a1 a2",
        "ps -a -q --filter label=fleetctl.job=j1",
    ]


def test_nothing_of_the_job_is_one_listing(py38: str, tmp_path: Path) -> None:
    """The client ran its ``--rm``: an empty listing verifies the end, no second one asked
    (each is a whole runtime client start, every node's at once at the end of a job)."""
    said, left, log = _end(py38, tmp_path, {"b1": {"job": "j10", "state": "running"}}, "j1")
    assert said == {"found": [], "remaining": [], "problem": None}
    assert left == {"b1": {"job": "j10", "state": "running"}}
    assert log == ["ps -a -q --filter label=fleetctl.job=j1"]


PID = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); "
    "from remote.kit import containers; "
    "print(json.dumps(containers.main_pid(json.loads(sys.argv[2]))))"
)


def test_the_main_pid_is_read_from_the_runtimes_pid_file(py38: str, tmp_path: Path) -> None:
    """podman's ``--pidfile``: read, never a runtime command (the ``pid`` argv is not run);
    None until the runtime wrote it, and for what is not a pid."""
    marker = tmp_path / "ran"
    cfg = {"pidfile": str(tmp_path / "container.pid"), "pid": ["touch", str(marker)]}

    def ask() -> object:
        out = subprocess.run(
            [py38, "-c", PID, node_tree(), json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert ask() is None
    (tmp_path / "container.pid").write_text("")
    assert ask() is None
    (tmp_path / "container.pid").write_text("4321")
    assert ask() == 4321
    (tmp_path / "container.pid").write_text("-1\n")
    assert ask() is None
    assert not marker.exists()
    del cfg["pidfile"]  # docker: the runtime is asked
    assert ask() is None and marker.exists()


def test_a_removal_already_in_progress_is_waited_for(py38: str, tmp_path: Path) -> None:
    """docker's ``run --rm`` removes the stopped container itself; our rm fails meanwhile and
    the container is listed a moment longer: asked again, verified, no problem reported."""
    cs = {"a1": {"job": "j1", "state": "autoremove", "gone_after": 2}}
    said, left, log = _end(py38, tmp_path, cs, "j1")
    assert said == {"found": ["a1"], "remaining": [], "problem": None}, said
    assert left == {}
    assert log[:3] == [
        "ps -a -q --filter label=fleetctl.job=j1",
        "stop --time 2 a1",
        "rm --force a1",
    ]


def test_a_container_that_will_not_go_is_reported(py38: str, tmp_path: Path) -> None:
    cs = {"a1": {"job": "j1", "state": "running"}, "a2": {"job": "j1", "state": "stuck"}}
    said, _, _ = _end(py38, tmp_path, cs, "j1")
    assert said["remaining"] == ["a2"]
    assert said["problem"] == "1 container(s) of the job still listed"


def test_no_runtime_on_the_node_is_a_problem_not_a_crash(py38: str, tmp_path: Path) -> None:
    cfg = {"list": ["/nonexistent/podman", "ps"], "stop": ["x"], "remove": ["x"]}
    out = subprocess.run(
        [py38, "-c", CALL, node_tree(), json.dumps(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = json.loads(out.stdout)
    assert said["found"] == [] and said["remaining"] == []
    assert said["problem"].startswith("/nonexistent/podman: "), said


def test_a_hung_runtime_call_is_cut_named_and_ends_the_attempt(py38: str, tmp_path: Path) -> None:
    """A stop the runtime never answers: cut at the grace plus one call's bound (the spec's
    ``timeout``), named, and the end stops there (no removal, no listing: each would hang as
    long); the container is said to be maybe left, not taken for gone."""
    import time

    cs = {"a1": {"job": "j1", "state": "running"}}
    t0 = time.monotonic()
    said, left, log = _end(py38, tmp_path, cs, "j1", FAKE_PODMAN_HANG="stop", TIMEOUT="1")
    assert time.monotonic() - t0 < 1.5 + 1 + 5
    assert said == {
        "found": ["a1"],
        "remaining": ["a1"],
        "problem": "podman stop: no answer within 2.5s",
        "hung": "podman stop: no answer within 2.5s",
    }
    assert log == ["ps -a -q --filter label=fleetctl.job=j1", "stop --time 2 a1"]
    assert left == cs


def test_a_hung_listing_is_no_verified_end(py38: str, tmp_path: Path) -> None:
    said, _, log = _end(py38, tmp_path, {}, "j1", FAKE_PODMAN_HANG="ps", TIMEOUT="1")
    hung = "podman ps: no answer within 1s"
    assert said == {"found": [], "remaining": [], "problem": hung, "hung": hung}
    assert log == ["ps -a -q --filter label=fleetctl.job=j1"]


def test_a_runtime_command_killed_by_a_concurrent_stop_is_tried_again(
    py38: str, tmp_path: Path
) -> None:
    cs = {"a1": {"job": "j1", "state": "running"}}
    said, left, log = _end(py38, tmp_path, cs, "j1", FAKE_PODMAN_KILLED="1")
    assert said == {"found": ["a1"], "remaining": [], "problem": None}
    assert left == {}
    assert log[:2] == ["ps -a -q --filter label=fleetctl.job=j1"] * 2


def test_a_listing_a_concurrent_stop_made_lie_is_not_believed(py38: str, tmp_path: Path) -> None:
    """podman's ``ps``, SIGTERMed as it runs, may exit 0 having printed nothing: its shell's
    death by the signal shows it, and the listing is asked again (not taken for "none left")."""
    cs = {"a1": {"job": "j1", "state": "running"}}
    said, left, log = _end(py38, tmp_path, cs, "j1", FAKE_PODMAN_TERMED="1")
    assert said == {"found": ["a1"], "remaining": [], "problem": None}, said
    assert left == {}
    assert log[:2] == ["ps -a -q --filter label=fleetctl.job=j1"] * 2


# the supervisor's side of the guard, in a process of its own: start it, then either release
# it (the end verified: ``release``) or die without a word (SIGKILL: ``die``)
GUARD_CALL = (
    "import json, os, sys; sys.path.insert(0, sys.argv[1]); "
    "from remote.kit import container_guard as g; "
    "guard, why = g.start_guard(json.loads(sys.argv[2]), 'j1', 0, sys.argv[3], 1.5); "
    "print(json.dumps({'pid': guard and guard.pid, 'why': why}), flush=True); "
    "guard.release(True) if sys.argv[4] == 'release' else os.kill(os.getpid(), 9)"
)


def _guard(py38: str, tmp_path: Path, how: str) -> tuple[dict, Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "podman"
    fake.write_text(f"#!{py38}\n{FAKE}")
    fake.chmod(0o755)
    db = tmp_path / "containers.json"
    db.write_text(json.dumps({"a1": {"job": "j1", "state": "running"}}))
    pod = runtime("podman")
    cfg = {"list": pod.list_argv("j1"), "stop": pod.stop_argv([], 1.5)}
    cfg["remove"] = pod.remove_argv([])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_PODMAN_DB": str(db)}
    out = subprocess.run(
        [py38, "-c", GUARD_CALL, node_tree(), json.dumps(cfg), str(run_dir), how],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    said = json.loads(out.stdout.splitlines()[0])
    assert said["why"] is None and said["pid"], (said, out.stderr)
    return said, db, run_dir


def test_the_container_guard_ends_the_containers_when_its_supervisor_dies(
    py38: str, tmp_path: Path
) -> None:
    said, db, run_dir = _guard(py38, tmp_path, "die")
    record = wait_for(
        lambda: (
            (run_dir / "container-guard.json").is_file()
            and json.loads((run_dir / "container-guard.json").read_text())
        ),
        30,
        what="the guard's record",
    )
    assert record["containers"] == {"found": ["a1"], "remaining": [], "problem": None}
    assert json.loads(db.read_text()) == {}
    wait_for(lambda: not Path(f"/proc/{said['pid']}").exists(), 10, what="the guard gone")


def test_a_released_container_guard_leaves_without_a_runtime_command(
    py38: str, tmp_path: Path
) -> None:
    said, db, run_dir = _guard(py38, tmp_path, "release")
    wait_for(lambda: not Path(f"/proc/{said['pid']}").exists(), 10, what="the guard gone")
    assert not (run_dir / "container-guard.json").exists()
    assert not Path(f"{db}.log").exists()  # not one podman command


# A runtime client in two processes, as rootless podman's: the parent (leader of its own
# group) forks the half that waits for the container; SIGTERM ends the parent with 0 while the
# half ignores it. ``one`` is a client of one process (root podman, docker): no half.
TWO_HALVES = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if sys.argv[1] == "two" and os.fork() == 0:
    time.sleep(60)
    os._exit(5)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
print("ready", flush=True)
time.sleep(60)
"""
# as the supervisor: a subreaper, the client its child in a session of its own; SIGTERM to
# the client's group once it is ready (every stop's first step), the client's code, the half
# found, SIGKILL to it (the stop's last step), the half's status
HALF_CALL = (
    "import json, os, signal, subprocess, sys, time; sys.path.insert(0, sys.argv[1]); "
    "from remote.kit import containers, jobprocs; jobprocs.become_subreaper(); "
    "p = subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[3]], "
    "start_new_session=True, stdout=subprocess.PIPE); p.stdout.readline(); "
    "os.killpg(p.pid, signal.SIGTERM); "
    "code = p.wait(10); half = containers.client_half(p.pid); "
    "half and os.kill(half, signal.SIGKILL); "
    "print(json.dumps({'code': code, 'half': bool(half), "
    "'status': half and containers.wait_child(half, 10)}))"
)


def test_the_half_of_a_two_process_client_says_how_the_job_ended(py38: str) -> None:
    """Rootless podman's client ends 0 on SIGTERM while its other half still waits for the
    container: the supervisor finds that half (its child now: the subreaper's) in the client's
    process group and takes its status; a one-process client leaves no half."""
    said = {}
    for kind in ("two", "one"):
        out = subprocess.run(
            [py38, "-c", HALF_CALL, node_tree(), TWO_HALVES, kind],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        said[kind] = json.loads(out.stdout)
    assert said["two"] == {"code": 0, "half": True, "status": -9}, said
    assert said["one"] == {"code": 0, "half": False, "status": None}, said
