"""Task roles: job-file parsing (one-line errors naming file:line), task layout, port
assignment, per-task env (fleet and OpenPAI names), paddle-ps argv and the completion policy."""

from __future__ import annotations

import pytest

from fleetctl.errors import PlanError, UsageError
from fleetctl.node import Node
from fleetctl.plan.rankplan import JobSpec, NodeFacts
from fleetctl.plan.roles import (
    PORT_HI,
    PORT_LO,
    CompletionPolicy,
    RoleLayout,
    Task,
    assign_ports,
    assign_tasks,
    candidate_ports,
    make_role_plan,
    parse_job_file,
    port_needs,
    ports_per_host,
)

PS_JOB = """\
name: demo
roles:
  server:
    group: servers
    instances: 1
    command: python3 server.py --flag "a b"
    ports: [http]
  worker:
    group: workers
    script: worker.py
    args: [--steps, 3, true]
    ports: {sync: 2}
    min_succeeded: 2
"""

NODES = [Node(f"n{i}", f"10.0.0.{i}") for i in (1, 2, 3)]
GROUPS = {"all": ("n1", "n2", "n3"), "servers": ("n1",), "workers": ("n2", "n3")}


def _layout(text: str = PS_JOB, nodes=NODES, groups=GROUPS, free=None):
    job = parse_job_file(text, "job.yml")
    tasks = assign_tasks(job, nodes, groups)
    needs = port_needs(job, tasks)
    if free is None:
        free = {h: [30000 + 10 * i + k for k in range(8)] for i, h in enumerate(GROUPS["all"])}
    ports = assign_ports(tasks, needs, free)
    return job, tasks, ports


# --------------------------------------------------------------------------- job file


def test_a_job_file_parses_into_roles_in_file_order() -> None:
    job = parse_job_file(PS_JOB, "job.yml")
    assert [r.name for r in job.roles] == ["server", "worker"]
    server, worker = job.roles
    assert server.launcher == "command"
    assert server.command == ("sh", "-c", 'python3 server.py --flag "a b"')
    assert server.ports == (("http", 1),) and server.min_failed == 1
    assert worker.launcher == "plain" and worker.args == ("--steps", "3", "true")
    assert worker.ports == (("sync", 2),) and worker.min_succeeded == 2
    assert job.env_style == "fleet" and job.launcher == "roles"


def test_a_torchrun_role_reserves_a_master_port_for_its_rendezvous() -> None:
    job = parse_job_file("roles:\n  t: {script: a.py, launcher: torchrun}\n", "j.yml")
    assert job.roles[0].ports == (("master", 1),)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "j.yml:1: job file is empty"),
        ("- a\n", "j.yml:1: a job file is a mapping"),
        ("roles: [a]\n", "j.yml:1: 'roles:' must map role names"),
        ("roles:\n  a: {command: x}\nfoo: 1\n", "j.yml:3: unknown key 'foo'"),
        ("roles:\n  a-b: {command: x}\n", "j.yml:2: role name 'a-b'"),
        ("roles:\n  a:\n    command: x\n    prots: [h]\n", "j.yml:4: unknown role key 'prots'"),
        ("roles:\n  a:\n    command: x\n    ports: {h: 0}\n", "j.yml:4: port count for 'h'"),
        ("roles:\n  a:\n    command: x\n    ports: [a-b]\n", "j.yml:4: port label 'a-b'"),
        ("roles:\n  a:\n    script: s.py\n    launcher: mpi\n", "j.yml:4: unknown launcher"),
        ("roles:\n  a:\n    instances: 2\n", "j.yml:2: role 'a' needs a command or a script"),
        ("roles:\n  a:\n    command: x\n    script: s.py\n", "j.yml:3: role 'a': give command"),
        ("roles:\n  a:\n    command: x\n    instances: 0\n", "j.yml:4: instances must be"),
        ("roles:\n  a:\n    command: x\n    instances: 1\n    min_succeeded: 2\n", "j.yml:5:"),
        ("roles:\n  a:\n    command: x\n    env: {FLEET_X: 1}\n", "j.yml:4: FLEET_X"),
        ("roles:\n  a: {command: x}\n  a: {command: y}\n", "j.yml:3: duplicate key 'a'"),
        ("roles:\n  a: {command: x}\nenv_style: k8s\n", "j.yml:3: env_style"),
        ("roles:\n  a: {command: x}\nretry:\n  retry_on: ['exit:x']\n", "j.yml:4: "),
        ("roles:\n  a: {command: x}\nretry:\n  tries: 2\n", "j.yml:4: unknown retry key"),
        ("roles:\n  a: {command: x}\nstall_timeout: .nan\n", "j.yml:3: stall_timeout must be"),
        ("roles:\n  a: {command: x}\ntimeout: 0\n", "j.yml:3: timeout must be a number"),
        ("roles: {a: {command: x}}\nlauncher: mpi\n", "j.yml:2: job launcher"),
        ("roles:\n  a: {command: x}\nx: [\n", "j.yml:4: invalid YAML"),
        ("roles:\n  a: {command: x}\nlauncher: paddle-ps\nscript: t.py\n", "j.yml:1: launcher"),
    ],
)
def test_bad_job_files_are_one_line_errors_naming_file_and_line(text: str, error: str) -> None:
    with pytest.raises(UsageError) as e:
        parse_job_file(text, "j.yml")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(error) or error in msg, msg
    assert msg.startswith("j.yml:"), msg


# ------------------------------------------------------------------------------- layout


def test_roles_take_hosts_of_their_groups_one_task_per_host() -> None:
    _, tasks, _ = _layout()
    assert [(t.role, t.index, t.node.name, t.rank) for t in tasks] == [
        ("server", 0, "n1", 0),
        ("worker", 0, "n2", 1),
        ("worker", 1, "n3", 2),
    ]


def test_roles_without_groups_share_all_in_order_never_twice() -> None:
    text = "roles:\n  a: {command: x, instances: 1}\n  b: {command: y}\n"
    job = parse_job_file(text, "j.yml")
    tasks = assign_tasks(job, NODES, {"all": ("n1", "n2", "n3")})
    assert [(t.role, t.node.name) for t in tasks] == [("a", "n1"), ("b", "n2"), ("b", "n3")]


def test_a_short_group_is_a_plan_error_naming_the_role_and_line() -> None:
    text = "roles:\n  a: {command: x, group: all}\n  b: {command: y, instances: 1}\n"
    job = parse_job_file(text, "j.yml")
    with pytest.raises(PlanError, match=r"^j.yml:3: role 'b' needs 1 host\(s\) of group 'all'"):
        assign_tasks(job, NODES, {"all": ("n1", "n2", "n3")})
    job = parse_job_file("roles:\n  a: {command: x, group: gpu}\n", "j.yml")
    with pytest.raises(PlanError, match="no inventory group 'gpu'"):
        assign_tasks(job, NODES, {"all": ("n1",)})


# -------------------------------------------------------------------------------- ports


def test_candidate_ports_are_deterministic_distinct_and_below_the_ephemeral_range() -> None:
    a = candidate_ports("job1", "n1", 5)
    assert a == candidate_ports("job1", "n1", 5)
    assert a != candidate_ports("job2", "n1", 5)
    assert len(a) == len(set(a)) == 21
    assert all(PORT_LO <= p <= PORT_HI for p in a)


def test_tasks_on_one_host_never_share_a_port_and_short_hosts_are_named() -> None:
    job = parse_job_file(
        "roles:\n  a: {command: x, ports: [p, q]}\n  b: {command: y, ports: {r: 2}}\n", "j.yml"
    )
    one = Node("solo", "10.0.0.9")
    tasks = [Task("a", 0, one, 0), Task("b", 0, one, 1)]  # hand-made: same host twice
    needs = port_needs(job, tasks)
    assert ports_per_host(tasks, needs) == {"solo": 4}
    got = assign_ports(tasks, needs, {"solo": [5, 6, 7, 8, 9]})
    assert got == {("a", 0): {"p": [5], "q": [6]}, ("b", 0): {"r": [7, 8]}}
    with pytest.raises(PlanError, match=r"^solo: not enough free ports for b\[0\] label 'r'"):
        assign_ports(tasks, needs, {"solo": [5, 6, 7]})


# ---------------------------------------------------------------------------------- env

GOLDEN_FLEET_ENV_WORKER_1 = {
    "FLEET_ROLE": "worker",
    "FLEET_ROLE_INDEX": "1",
    "FLEET_ROLES": "server,worker",
    "FLEET_TASK_INDEX": "2",
    "FLEET_TASK_COUNT": "3",
    "FLEET_ROLE_COUNT_server": "1",
    "FLEET_ROLE_COUNT_worker": "2",
    "FLEET_HOSTS_server": "10.0.0.1",
    "FLEET_HOSTS_worker": "10.0.0.2,10.0.0.3",
    "FLEET_HOST_IP_server_0": "10.0.0.1",
    "FLEET_HOST_IP_worker_0": "10.0.0.2",
    "FLEET_HOST_IP_worker_1": "10.0.0.3",
    "FLEET_PORT_server_0_http": "30000",
    "FLEET_PORT_worker_0_sync": "30010,30011",
    "FLEET_PORT_worker_1_sync": "30020,30021",
    "FLEET_PORT_sync": "30020,30021",
}

GOLDEN_PAI_ENV_WORKER_1 = {
    "PAI_JOB_NAME": "demo",
    "PAI_USER_NAME": "alice",
    "PAI_DEFAULT_FS_URI": "",
    "PAI_TASK_ROLE_COUNT": "2",
    "PAI_TASK_ROLE_LIST": "server,worker",
    "PAI_CURRENT_TASK_ROLE_NAME": "worker",
    "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": "1",
    "PAI_TASK_INDEX": "1",
    "PAI_TASK_ROLE_INDEX": "1",
    "PAI_TASK_ROLE_TASK_COUNT_server": "1",
    "PAI_TASK_ROLE_TASK_COUNT_worker": "2",
    "PAI_TASK_ROLE_server_HOST_LIST": "10.0.0.1",
    "PAI_TASK_ROLE_worker_HOST_LIST": "10.0.0.2,10.0.0.3",
    "PAI_MIN_FAILED_TASK_COUNT_server": "1",
    "PAI_MIN_FAILED_TASK_COUNT_worker": "1",
    "PAI_MIN_SUCCEEDED_TASK_COUNT_server": "-1",
    "PAI_MIN_SUCCEEDED_TASK_COUNT_worker": "2",
    "PAI_HOST_IP_server_0": "10.0.0.1",
    "PAI_HOST_IP_worker_0": "10.0.0.2",
    "PAI_HOST_IP_worker_1": "10.0.0.3",
    "PAI_PORT_LIST_server_0_http": "30000",
    "PAI_PORT_LIST_worker_0_sync": "30010,30011",
    "PAI_PORT_LIST_worker_1_sync": "30020,30021",
    "PAI_server_0_http_PORT": "30000",
    "PAI_worker_0_sync_PORT": "30010,30011",
    "PAI_worker_1_sync_PORT": "30020,30021",
}


def _plan(names: str | None = None, text: str = PS_JOB, facts=None):
    job, tasks, ports = _layout(text)
    base = JobSpec(script="-", job_id="job1", env={"USER_X": "1"})
    return job, make_role_plan(job, tasks, base, ports, names=names, user="alice", facts=facts)


def test_every_task_sees_every_role_address_and_port_fleet_style() -> None:
    _, plan = _plan()
    env = plan.nodes[2].env
    assert {k: env[k] for k in GOLDEN_FLEET_ENV_WORKER_1} == GOLDEN_FLEET_ENV_WORKER_1
    assert not any(k.startswith("PAI_") for k in env)
    assert env["FLEET_NODE_RANK"] == "2" and env["FLEET_JOB_ID"] == "job1"
    assert env["USER_X"] == "1"


def test_pai_env_style_adds_the_openpai_names() -> None:
    _, plan = _plan("pai")
    env = plan.nodes[2].env
    assert {k: v for k, v in env.items() if k.startswith("PAI_")} == GOLDEN_PAI_ENV_WORKER_1
    assert {k: env[k] for k in GOLDEN_FLEET_ENV_WORKER_1} == GOLDEN_FLEET_ENV_WORKER_1


def test_each_role_is_its_own_launcher_world_with_global_node_ranks() -> None:
    _, plan = _plan(facts={"n2": NodeFacts(train_addr="10.1.0.2")})
    server, w0, w1 = plan.nodes
    assert [n.node_rank for n in plan.nodes] == [0, 1, 2]
    assert server.argv == ("sh", "-c", 'python3 server.py --flag "a b"')
    # every role runs in the job's work folder (a copy of the pushed code), as in a checkout
    assert server.cwd == w0.cwd == "~/.fleetctl/work/job1"
    assert w0.argv == ("python3", "worker.py", "--steps", "3", "true")
    assert (w0.env["RANK"], w1.env["RANK"], w1.env["WORLD_SIZE"]) == ("0", "1", "2")
    assert w1.env["MASTER_ADDR"] == "10.1.0.2"  # the role's own rank 0, training address
    assert w1.env["FLEET_HOST_IP_worker_0"] == "10.1.0.2"
    assert plan.launcher == "roles" and plan.nnodes == 3


def test_paddle_ps_builds_servers_and_trainers_lists_from_two_roles() -> None:
    text = (
        "launcher: paddle-ps\nscript: ps.py\nargs: [--x]\nroles:\n"
        "  server: {instances: 1}\n  worker: {instances: 2}\n"
    )
    job, tasks, ports = _layout(text, groups={"all": ("n1", "n2", "n3")})
    assert ports[("server", 0)] == {"paddle": [30000], "gloo": [30001]}
    plan = make_role_plan(job, tasks, JobSpec(script="-", job_id="j"), ports)
    want_common = [
        "--servers=10.0.0.1:30000",
        "--trainers=10.0.0.2:30010,10.0.0.3:30020",
    ]
    for n, addr in zip(plan.nodes, ("10.0.0.1", "10.0.0.2", "10.0.0.3"), strict=True):
        assert list(n.argv[:3]) == ["python3", "-m", "paddle.distributed.launch"]
        assert list(n.argv[3:5]) == want_common
        assert n.argv[5] == f"--host={addr}" and "--gloo_port=30001" in n.argv
        assert n.argv[-2:] == ("ps.py", "--x")
        assert f"--log_dir=../../runs/j/{n.node_rank}-{n.host}/log" in n.argv
    with pytest.raises(PlanError, match="prefix"):
        nodes = [Node("a", "10.0.0.1"), Node("b", "10.0.0.12")]
        job2 = parse_job_file(
            "launcher: paddle-ps\nscript: ps.py\nroles:\n  server: {instances: 1}\n"
            "  worker: {instances: 1}\n",
            "j.yml",
        )
        t = assign_tasks(job2, nodes, {"all": ("a", "b")})
        p = assign_ports(t, port_needs(job2, t), {"a": [1, 2, 3], "b": [4, 5]})
        make_role_plan(job2, t, JobSpec(script="-", job_id="j"), p)


# -------------------------------------------------------------------------- completion


@pytest.mark.parametrize(
    ("states", "want"),
    [
        (["running", "running", "running"], None),
        (["running", "succeeded", "running"], None),
        (["running", "succeeded", "succeeded"], ("succeeded", "worker")),
        (["running", "failed", "running"], ("failed", "worker")),
        (["lost", "running", "running"], ("failed", "server")),
        (["succeeded", "running", "running"], None),  # a server ending well ends nothing
        (["succeeded", "succeeded", "succeeded"], ("succeeded", "worker")),
    ],
)
def test_completion_policy_min_failed_and_min_succeeded(states, want) -> None:
    job, tasks, ports = _layout()
    policy = CompletionPolicy.for_layout(RoleLayout(job, tuple(tasks), ports))
    v = policy.verdict(states)
    assert (None if v is None else (v.status, v.role)) == want


def test_min_failed_null_tolerates_failures_until_everything_ended() -> None:
    text = "roles:\n  a: {command: x, min_failed: null}\n"
    job = parse_job_file(text, "j.yml")
    tasks = assign_tasks(job, NODES, {"all": ("n1", "n2", "n3")})
    policy = CompletionPolicy.for_layout(RoleLayout(job, tuple(tasks), {}))
    assert not policy.fails_job(0, ["failed", "running", "running"])
    assert policy.verdict(["failed", "running", "running"]) is None
    assert policy.verdict(["failed", "succeeded", "succeeded"]).status == "succeeded"
    plain = CompletionPolicy(roles=("", "", ""))
    assert plain.fails_job(1, ["running", "failed", "running"])


def test_a_job_file_carries_its_timeout_and_stall_timeout() -> None:
    job = parse_job_file("roles:\n  a: {command: x}\ntimeout: 3600\nstall_timeout: 300\n", "j")
    assert (job.timeout, job.stall_timeout) == (3600.0, 300.0)
    plain = parse_job_file("roles:\n  a: {command: x}\n", "j")
    assert (plain.timeout, plain.stall_timeout) == (None, None)


def test_roles_json_is_the_layout_as_its_record(tmp_path) -> None:
    """roles.json (``RunFolder.write_roles``): the job file as parsed, then every task with its
    host and ports, in the shape the golden record reads (tests/pure/records/roles.json)."""
    import json

    from fleetctl.job.records.runfolder import RunFolder

    job, tasks, ports = _layout()
    folder = RunFolder.create(tmp_path, "j1")
    folder.write_roles(RoleLayout(job, tuple(tasks), ports))
    doc = json.loads((folder.path / "roles.json").read_text())
    assert list(doc) == ["job_file", "tasks"] and doc["job_file"] == job.to_dict()
    assert doc["tasks"] == [
        {
            "rank": t.rank,
            "role": t.role,
            "index": t.index,
            "host": t.node.name,
            "ports": ports.get((t.role, t.index), {}),
        }
        for t in tasks
    ]
    assert any(task["ports"] for task in doc["tasks"])
