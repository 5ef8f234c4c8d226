"""``fleetctl exec`` against real sshd hosts: own hostnames, a dead sshd, exit codes, quoting.

Runs the CLI in-process through its entry (``fleetctl.testing.cli_runner.run_cli``: exit codes
and stderr lines as users get them), on the shared 3-host lab (``lab3`` undoes injected faults
after each test).
"""

from __future__ import annotations

import json

import pytest

from fleetctl.lab import Lab
from fleetctl.plan.inventory import load_inventory
from fleetctl.testing.cli_runner import CliResult, run_cli
from fleetctl.testing.infra import node_host

pytestmark = [pytest.mark.lab, pytest.mark.login]

HOSTS = ("node1", "node2", "node3")


def fleetctl_exec(lab: Lab, *args: str) -> CliResult:
    return run_cli("exec", "-i", str(lab.inventory_path), *args)


def lines(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.strip()]


def test_each_host_answers_with_its_own_hostname(lab3: Lab) -> None:
    p = fleetctl_exec(lab3, "--", "hostname")
    assert p.exit_code == 0, p.stderr
    assert sorted(lines(p.stdout)) == [f"{h}: {h}" for h in HOSTS]
    assert p.stderr == ""


def test_argv_reaches_the_program_literally(lab3: Lab) -> None:
    p = fleetctl_exec(lab3, "--", "echo", "a b;c")
    assert p.exit_code == 0, p.stderr
    assert sorted(lines(p.stdout)) == [f"{h}: a b;c" for h in HOSTS]
    p = fleetctl_exec(lab3, "--", "printf", "%s|", "$HOME", "*", "`id`", "it's")
    assert p.exit_code == 0, p.stderr
    assert sorted(lines(p.stdout)) == [f"{h}: $HOME|*|`id`|it's|" for h in HOSTS]


def test_one_argument_is_a_shell_line(lab3: Lab) -> None:
    p = fleetctl_exec(lab3, "--", "echo $((40 + 2)) | tr 4 x")
    assert p.exit_code == 0, p.stderr
    assert sorted(lines(p.stdout)) == [f"{h}: x2" for h in HOSTS]


def test_gather_folds_identical_output_under_a_node_set(lab3: Lab) -> None:
    p = fleetctl_exec(
        lab3, "-b", "--", "sh", "-c", "case $(hostname) in node2) echo odd;; *) echo same;; esac"
    )
    assert p.exit_code == 0, p.stderr
    out = lines(p.stdout)
    assert out == ["-" * 15, "node[1,3]", "-" * 15, "same", "-" * 15, "node2", "-" * 15, "odd"]


def test_remote_exit_codes_worst_node_and_max_rc(lab3: Lab) -> None:
    cmd = "n=$(hostname | tr -dc 0-9); echo out$n; echo err$n >&2; exit $((n * 10 - 10))"
    p = fleetctl_exec(lab3, "--", cmd)
    assert p.exit_code == 3
    assert sorted(lines(p.stdout)) == ["node1: out1", "node2: out2", "node3: out3"]
    err = lines(p.stderr)
    assert "node2: err2" in err and "node1: err1" in err
    assert "fleetctl: node2: exit 10" in err
    assert "fleetctl: node3: exit 20" in err
    assert not any(x.startswith("fleetctl: node1:") for x in err)
    assert err[-1] == "fleetctl: error: exec failed on 2 of 3 nodes"
    p = fleetctl_exec(lab3, "-S", "--", cmd)
    assert p.exit_code == 20


def test_dead_sshd_is_reported_and_the_others_still_run(lab3: Lab) -> None:
    lab3.kill_sshd("node2")
    p = fleetctl_exec(lab3, "--", "hostname")
    assert p.exit_code == 3
    assert sorted(lines(p.stdout)) == ["node1: node1", "node3: node3"]
    err = p.stderr
    assert "node2" in err and "refused" in err, err
    assert "node1" not in err and "node3" not in err

    p = fleetctl_exec(lab3, "--json", "--", "hostname")
    assert p.exit_code == 3
    data = json.loads(p.stdout)
    assert data["ok"] is False and data["exit_code"] == 3
    by = {n["node"]: n for n in data["nodes"]}
    assert [n["node"] for n in data["nodes"]] == list(HOSTS)
    assert by["node2"]["exit_code"] is None and "refused" in by["node2"]["error"]
    for h in ("node1", "node3"):
        assert by[h]["ok"] and by[h]["stdout"] == f"{h}\n" and by[h]["error"] is None

    p = fleetctl_exec(lab3, "-S", "--", "hostname")
    assert p.exit_code == 255  # the command never ran on node2, as ssh reports it


def test_command_timeout_stops_the_command_on_every_node_and_exits_124(lab3: Lab) -> None:
    secs = "30.417"  # a sleep no other test starts: what is left of it is ours
    p = fleetctl_exec(
        lab3, "--timeout", "3", "--", f"sleep {secs} & setsid sleep {secs} & sleep {secs}; wait"
    )
    assert p.exit_code == 124, p.stderr  # timed out: not the 3 of a failed command
    for h in HOSTS:
        assert f"{h}: error: timed out after 3s: " in p.stderr, p.stderr
    assert p.stderr.splitlines()[-1] == "fleetctl: error: exec timed out on 3 of 3 nodes"
    for node in load_inventory(str(lab3.inventory_path)).nodes:
        ps = node_host(node).run("ps -eo pid,args")
        assert ps.rc == 0, ps.stderr
        assert f"sleep {secs}" not in ps.stdout, (node.name, ps.stdout)

    p = fleetctl_exec(lab3, "--json", "--timeout", "1", "--", "sleep 30.418")
    assert p.exit_code == 124
    data = json.loads(p.stdout)
    assert data["exit_code"] == 124
    assert [n["timed_out"] for n in data["nodes"]] == [True, True, True]
    assert all(n["exit_code"] is None and n["error"].startswith("timed out") for n in data["nodes"])


def test_limit_selects_hosts(lab3: Lab) -> None:
    p = fleetctl_exec(lab3, "--limit", "node1,node3", "--", "hostname")
    assert p.exit_code == 0, p.stderr
    assert sorted(lines(p.stdout)) == ["node1: node1", "node3: node3"]


def test_no_command_is_a_usage_error(lab3: Lab) -> None:
    p = fleetctl_exec(lab3)
    assert p.exit_code == 2
    assert "fleetctl: error:" in p.stderr
