"""What a plain ``fleetctl run`` / ``fleetctl check`` over SSH has imported when it first
connects: what every run pays before its first byte to a node (issue 35).

Each case runs the real CLI in a fresh interpreter on an inventory of one loopback host; an
audit hook stops the process at its first TCP connect (``socket.connect``, before the syscall:
nothing reaches the port) and writes ``sys.modules`` then. The listed modules serve other
paths (Slurm, containers, the collective check, stack dumps, metrics, role jobs, the report,
the pace judge) and must load only there, inside the function or branch that needs them. No
timing is asserted: the CPU these imports cost is measured in docs/performance.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Stops at the first AF_INET connect and writes sys.modules to argv[1]; argv[2]: the checkout
# whose fleetctl runs; argv[3]: a module to import first ("" none: the planted case); the rest:
# fleetctl's arguments.
PROBE = """
import json, os, runpy, socket, sys
out, root, plant, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
sys.path.insert(0, root)
def hook(event, a):
    if event == "socket.connect" and a[0].family in (socket.AF_INET, socket.AF_INET6):
        with open(out, "w") as f:
            json.dump([sys.modules["fleetctl"].__file__, *sorted(sys.modules)], f)
        os._exit(0)
sys.addaudithook(hook)
if plant:
    __import__(plant)
sys.argv = ["fleetctl", *args]
runpy.run_module("fleetctl", run_name="__main__", alter_sys=True)
"""

# Never on the plain SSH path before the first connection.
NOT_UP_FRONT = (
    "statistics",  # the pace and progress judges' medians (with decimal, fractions)
    "decimal",
    "jinja2",  # the run's report, written at its end
    "markupsafe",
    "fleetctl.report.model",
    "fleetctl.report.render",
    "fleetctl.job.diagnose.pace",  # multi-node runs load it at launch
    "fleetctl.job.diagnose.progress_rate",
    "fleetctl.job.diagnose.proof",
    "fleetctl.job.diagnose.stacks",
    "fleetctl.job.diagnose.slowstacks",
    "fleetctl.phases.stacks",  # py-spy stack dumps
    "fleetctl.phases.stackdumps",
    "fleetctl.job.monitor.metrics",  # --metrics-addr / --metrics-textfile
    "fleetctl.job.monitor.hooks",
    "fleetctl.plan.collective",  # --collective
    "fleetctl.phases.check.collective",
    "fleetctl.plan.runtimes",  # --image: containers
    "fleetctl.phases.push.image",
    "fleetctl.slurm.batch",  # --slurm, or inside an allocation
    "fleetctl.slurm.specfile",
    "fleetctl.slurm.hostlist",
    "fleetctl.slurm.submit",
    "fleetctl.slurm.private",
    "fleetctl.api.slurm",
    "fleetctl.plan.roles.completion",  # --job: role jobs
    "fleetctl.plan.roles.jobfile",  # (a plain run's retry policy: plan.retryrules.RetrySpec)
    "fleetctl.plan.roles.yamlfields",
    "fleetctl.plan.roles.plan",
    "fleetctl.plan.roles.tasks",
    "fleetctl.job.run.rolejob",
    "fleetctl.job.run.elastic",  # --elastic
    "fleetctl.job.run.attempts",  # --max-retries
    "fleetctl.phases.push.relay",  # --checkpoint-dir, retries, --resume
    "fleetctl.lab",
    "fleetctl.tasks",
    "invoke",
    "fabric",
    "asyncio",
    "unittest",
)

ROOT = Path(__file__).resolve().parents[2]  # this checkout, not whichever one is installed
INVENTORY = "all:\n  hosts:\n    node0: {ansible_host: 127.0.0.1, ansible_port: 9}\n"


def modules_at_connect(tmp_path: Path, *args: str, plant: str = "") -> set[str]:
    (tmp_path / "hosts.yml").write_text(INVENTORY)
    (tmp_path / "job.py").write_text("print('hi')\n")
    out = tmp_path / "modules.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}  # not in one
    p = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), str(ROOT), plant, *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert out.exists(), f"never connected (exit {p.returncode}): {p.stderr[-2000:]}"
    where, *names = json.loads(out.read_text())
    assert where == str(ROOT / "fleetctl" / "__init__.py")
    return set(names)


def up_front(names: set[str]) -> list[str]:
    return sorted(n for n in names if any(n == m or n.startswith(m + ".") for m in NOT_UP_FRONT))


RUN = ("run", "-i", "hosts.yml", "--launcher", "plain", "job.py")
CHECK = ("check", "-i", "hosts.yml")


@pytest.mark.parametrize("args", [RUN, CHECK], ids=["run", "check"])
def test_plain_ssh_path_imports_none_of_the_other_paths_before_connecting(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    names = modules_at_connect(tmp_path, *args)
    assert "paramiko" in names and "fleetctl.transport.ssh" in names  # it did reach the dial
    assert up_front(names) == []


def test_a_planted_import_on_that_path_fails_the_guard(tmp_path: Path) -> None:
    names = modules_at_connect(tmp_path, *RUN, plant="statistics")
    assert up_front(names) == ["decimal", "statistics"]


# A whole run over two local nodes (the slow-node and progress judges watch a multi-node run),
# nothing wrong with it: sys.modules at its end.
WHOLE_RUN = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from fleetctl.api.runspec import Hosts, Supervision
from fleetctl.job.run.job import RunOptions, run_job
from fleetctl.node import Node
from fleetctl.phases.push import PushRequest
from fleetctl.plan.rankplan import JobSpec
from fleetctl.ssh.fanout import FanOut
tmp = Path(sys.argv[1])
nodes = [Node.localhost(name=f"l{i}", workdir=str(tmp / f"w{i}")) for i in range(2)]
opts = RunOptions(runs_dir=tmp / "runs", hosts=Hosts(check=False), push=PushRequest(tmp / "code"),
                  supervision=Supervision(grace=1))
with FanOut(nodes, opts.settings) as fleet:
    result = run_job(JobSpec(script="job.py", job_id="t-quiet-1", launcher="plain"), nodes, opts,
                     fleet=fleet)
json.dump([result.exit_code, sorted(sys.modules)], open(tmp / "modules.json", "w"))
"""

# Loaded only when a run needs them: a node named slow (its ranks' stacks), progress markers
# in the output (the rates' medians), a failure (the proof).
NOT_IN_A_QUIET_RUN = (
    "statistics",
    "decimal",
    "fractions",
    "fleetctl.phases.stacks",
    "fleetctl.phases.stackdumps",
    "fleetctl.job.diagnose.proof",
    "fleetctl.job.diagnose.culprit",
)


def test_a_quiet_multi_node_run_loads_no_stack_dumper_statistics_or_proof(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "job.py").write_text("print('hello, no progress here')\n")
    p = subprocess.run(
        [sys.executable, "-c", WHOLE_RUN, str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    code, names = json.loads((tmp_path / "modules.json").read_text())
    assert code == 0
    assert "fleetctl.job.diagnose.pace" in names  # the judges did watch it
    assert "fleetctl.job.diagnose.progress_rate" in names
    assert [n for n in NOT_IN_A_QUIET_RUN if n in names] == []
