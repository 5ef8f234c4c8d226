"""Retry classification (exit codes, signals, lost node, log regexes; user rules over the
defaults) and the bounded, jittered exponential backoff."""

from __future__ import annotations

import pytest

from fleetctl.errors import UsageError
from fleetctl.job.run.retry import Failure, RetryPolicy, backoff_delay, parse_rule

TB = (
    "Traceback (most recent call last):",
    '  File "train.py", line 3, in <module>',
    "ValueError: bad input",
)
NCCL_TB = (
    "Traceback (most recent call last):",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
    "unhandled system error",
)


def f(
    kind: str = "exit", code: int | None = 1, sig: int | None = None, log=(), reason=None
) -> Failure:
    return Failure(kind=kind, exit_code=code, signal=sig, log_tail=tuple(log), reason=reason)


SHUTDOWN = "stopped on the node: supervisor got SIGTERM"  # a `reboot` there (tests/vms)


@pytest.mark.parametrize(
    ("failure", "retry", "why"),
    [
        (f("lost", None), True, "retry on lost (default)"),
        (f("signal", None, 9), True, "retry on signal:KILL (default)"),
        (f("exit", 137), True, "retry on exit:137 (default)"),
        (f("exit", 1, log=["[E] NCCL timeout after 600s"]), True, "log:NCCL"),
        (f("exit", 1, log=NCCL_TB), True, "log:NCCL"),  # retry rule beats the traceback one
        (f("exit", 1, log=["recv: Connection reset by peer"]), True, "connection reset"),
        (f("exit", 1, log=TB), False, "no-retry on log:^Traceback"),
        (f("exit", 1, log=["bye"]), False, "exit code 1: no retry rule matches"),
        (f("signal", None, 15), False, "signal 15 (SIGTERM): no retry rule matches"),
        (f("signal", None, 15, reason=SHUTDOWN), True, "retry on node-stop (default)"),
        (f("exit", 143, reason=SHUTDOWN), True, "retry on node-stop (default)"),
        (f("signal", None, 15, reason="stopped on the node: no heartbeat"), False, "no retry"),
        (f("start_failed", None), False, "could not start: no retry rule matches"),
        (f("interrupted", None), False, "interrupted: never retried"),
    ],
)
def test_default_rules(failure: Failure, retry: bool, why: str) -> None:
    d = RetryPolicy(max_retries=3).decide(failure, 1)
    assert d.retry is retry
    assert why in d.reason, d.reason


def test_user_rules_come_before_the_defaults_and_no_retry_wins_among_them() -> None:
    p = RetryPolicy.build(
        max_retries=2,
        retry_on=[("exit:1,2", "--retry-on"), ("log:ValueError", "job.yml:7")],
        no_retry_on=[("log:out of memory", "--no-retry-on"), ("lost", "--no-retry-on")],
    )
    assert p.decide(f("exit", 1, log=["x"]), 1).retry
    d = p.decide(f("exit", 1, log=TB), 1)  # a user rule can retry a traceback
    assert d.retry and "exit:1,2 (--retry-on)" in d.reason
    assert not p.decide(f("exit", 2, log=["CUDA out of memory"]), 1).retry
    d = p.decide(f("lost", None), 1)
    assert not d.retry and "(--no-retry-on)" in d.reason


def test_the_budget_of_retries_is_respected() -> None:
    p = RetryPolicy(max_retries=1)
    assert p.decide(f("exit", 137), 1).retry
    d = p.decide(f("exit", 137), 2)
    assert not d.retry and "no retries left (1 allowed)" in d.reason
    assert not RetryPolicy(max_retries=0).decide(f("lost", None), 1).retry


def test_defaults_can_be_switched_off() -> None:
    p = RetryPolicy(max_retries=3, defaults=False)
    assert not p.decide(f("exit", 137), 1).retry


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("exit", "needs a value"),
        ("exit:x", "'x' is not an exit code"),
        ("signal:NOPE", "unknown signal"),
        ("lost:1", "takes no value"),
        ("log:(", "invalid regex"),
        ("weird:1", "use exit:N"),
    ],
)
def test_bad_rules_are_usage_errors(text: str, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        parse_rule(text, "retry")
    with pytest.raises(UsageError, match=r"^--retry-on: "):
        RetryPolicy.build(retry_on=[(text, "--retry-on")])


def test_signal_rules_take_names_or_numbers() -> None:
    for text in ("signal:KILL", "signal:SIGKILL", "signal:9", "signal:sigkill"):
        assert parse_rule(text, "retry").codes == frozenset({9})


def test_failure_from_a_node_outcome_dict() -> None:
    node = {"state": "failed", "exit_code": None, "signal": 9, "host": "n2", "rank": 1}
    fl = Failure.from_node(node, [str(i) for i in range(80)])
    assert (fl.kind, fl.signal, fl.host, fl.rank) == ("signal", 9, "n2", 1)
    assert len(fl.log_tail) == 50 and fl.log_tail[-1] == "79"
    assert Failure.from_node({"state": "lost"}).kind == "lost"


@pytest.mark.parametrize(
    ("attempt", "rand", "want"),
    [
        (1, 0.5, 5.0),
        (2, 0.5, 10.0),
        (3, 0.5, 20.0),
        (3, 0.0, 16.0),  # -20 %
        (3, 1.0, 24.0),  # +20 %
        (10, 0.5, 300.0),  # capped
        (10, 1.0, 300.0),  # jitter never exceeds the cap
        (200, 0.5, 300.0),  # no overflow
    ],
)
def test_backoff_is_exponential_jittered_and_bounded(attempt: int, rand: float, want: float):
    assert backoff_delay(attempt, rand=rand) == want


def test_backoff_rejects_attempt_zero() -> None:
    with pytest.raises(ValueError):
        backoff_delay(0)


def test_the_attempt_loop_retries_until_the_budget_is_spent(tmp_path, monkeypatch) -> None:
    """run_attempts with run_job replaced by a scripted sequence of outcomes (the real loop,
    the real policy; the lab test runs real jobs)."""
    import json

    from fleetctl.job.records.result import JobResult, NodeOutcome
    from fleetctl.job.run import job as job_mod
    from fleetctl.job.run.attempts import run_attempts
    from fleetctl.job.run.job import RunOptions
    from fleetctl.plan.rankplan import JobSpec

    seen: list[tuple[str, int]] = []

    def fake_run_job(spec, nodes, options, *, on_event=None, fleet=None):
        seen.append((spec.job_id, options.attempt))
        folder = tmp_path / spec.job_id
        folder.mkdir()
        r = JobResult(job_id=spec.job_id, folder=folder, status="failed", attempt=options.attempt)
        r.nodes = [NodeOutcome(0, "a", "10.0.0.1", state="stopped")]
        bad = NodeOutcome(1, "b", "10.0.0.2", state="failed", exit_code=1)
        bad.tail.append("NCCL error: unhandled system error")
        r.nodes.append(bad)
        r.first_failure = 1
        return r

    monkeypatch.setattr(job_mod, "run_job", fake_run_job)
    sleeps: list[float] = []

    class NoFleet:
        connected = ()

        def close(self) -> None:
            pass

    out = run_attempts(
        JobSpec(script="t.py", job_id="j"),
        [],
        RunOptions(runs_dir=tmp_path),
        RetryPolicy(max_retries=2, backoff=1.0, jitter=0.0),
        fleet=NoFleet(),  # type: ignore[arg-type]
        sleep=sleeps.append,
    )
    assert seen == [("j", 1), ("j.2", 2), ("j.3", 3)]
    assert sleeps == [1.0, 2.0]
    assert [a.retried for a in out.attempts] == [True, True, False]
    assert "no retries left (2 allowed)" in (out.attempts[-1].decision or "")
    data = json.loads((tmp_path / "j" / "attempts.json").read_text())
    assert [a["job_id"] for a in data["attempts"]] == ["j", "j.2", "j.3"]
    assert out.final.job_id == "j.3"
    # `run --json` prints the final result: it carries every attempt, not just the last
    final = out.final.to_dict()
    assert [(a["job_id"], a["retried"]) for a in final["attempts"]] == [
        ("j", True),
        ("j.2", True),
        ("j.3", False),
    ]
    assert final["attempts"][0]["ended_by"] == "node 1 (b): exit code 1"


def test_a_retry_after_a_lost_node_reconnects_it_rechecks_and_records_a_failed_start(
    tmp_path, monkeypatch
) -> None:
    """Attempt 1 loses node b; attempt 2 must get a new connection to b and an uncached check,
    and when it cannot even start (b still rebooting) that attempt is recorded and retried."""
    import json

    from fleetctl.errors import CheckError
    from fleetctl.job.records.result import JobResult, NodeOutcome
    from fleetctl.job.run import job as job_mod
    from fleetctl.job.run.attempts import run_attempts
    from fleetctl.job.run.job import RunOptions
    from fleetctl.plan.rankplan import JobSpec
    from fleetctl.results import FleetResult

    calls: list[tuple[str, bool, list[str]]] = []

    class Fleet:
        def __init__(self) -> None:
            self.dropped: list[str] = []
            self.connected = ()

        def drop(self, name: str) -> None:
            self.dropped.append(name)

        def close(self) -> None:
            pass

    fleet = Fleet()

    def fake_run_job(spec, nodes, options, *, on_event=None, fleet=None):
        calls.append((spec.job_id, options.recheck, list(fleet.dropped)))
        if options.attempt == 2:
            raise CheckError(
                "preflight failed (1 of 2 host(s) failed): b: ssh: refused", FleetResult({})
            )
        folder = tmp_path / spec.job_id
        folder.mkdir()
        r = JobResult(job_id=spec.job_id, folder=folder, attempt=options.attempt)
        if options.attempt == 1:
            r.status, r.first_failure = "failed", 1
            r.nodes = [NodeOutcome(0, "a", "10.0.0.1", state="stopped")]
            r.nodes.append(NodeOutcome(1, "b", "10.0.0.2", state="lost", reason="no heartbeat"))
        else:
            r.status = "succeeded"
            r.nodes = [NodeOutcome(0, "a", "10.0.0.1", state="succeeded")]
        return r

    monkeypatch.setattr(job_mod, "run_job", fake_run_job)
    out = run_attempts(
        JobSpec(script="t.py", job_id="j"),
        [],
        RunOptions(runs_dir=tmp_path),
        RetryPolicy(max_retries=2, backoff=0.5, jitter=0.0),
        fleet=fleet,  # type: ignore[arg-type]
        sleep=lambda s: None,
    )
    assert calls == [("j", False, []), ("j.2", True, ["b"]), ("j.3", True, ["b", "b"])]
    data = json.loads((tmp_path / "j" / "attempts.json").read_text())["attempts"]
    assert [(a["job_id"], a["status"], a["retried"]) for a in data] == [
        ("j", "failed", True),
        ("j.2", "error", True),
        ("j.3", "succeeded", False),
    ]
    assert data[1]["ended_by"].startswith("preflight failed (1 of 2 host(s) failed): b:")
    assert out.final.status == "succeeded"


ROLES = "roles:\n  worker:\n    script: train.py\n"


@pytest.mark.parametrize(
    ("kw", "block", "tries", "rules", "backoff"),
    [
        ({}, "", 1, [], 5.0),
        ({"max_retries": 2}, "", 3, [], 5.0),
        # the job file fills what the command line left unset, and adds its rules after it
        (
            {"retry_on": ("exit:3",)},
            "retry: {max_retries: 1, retry_on: [lost], no_retry_on: ['exit:2'], backoff: 4}\n",
            2,
            [("no-retry", "exit:2", "job.yml:1"), ("retry", "exit:3", "--retry-on"),
             ("retry", "lost", "job.yml:1")],
            4.0,
        ),
        # the command line's count and backoff win; a count of 0 given is a count
        (
            {"max_retries": 0, "retry_backoff": 2},
            "retry: {max_retries: 5, backoff: 9}\n",
            1,
            [],
            2.0,
        ),
    ],
    ids=["none", "command line", "job file fills", "command line wins"],
)  # fmt: skip
def test_the_retry_group_makes_the_attempt_loops_policy(
    kw: dict, block: str, tries: int, rules: list, backoff: float
) -> None:
    """``Retry.policy``: RunSpec's retry group and a role job file's ``retry:`` block."""
    from fleetctl.api.runspec import RunSpec
    from fleetctl.plan.roles.jobfile import parse_job_file

    file = parse_job_file(block + ROLES).retry if block else None
    p = RunSpec.build("t.py", **kw).retry.policy(file)
    assert p.tries == tries and p.backoff == backoff
    user = [r for r in p.rules() if r.source != "default"]
    assert [(r.action, r.text, r.source) for r in user] == rules


def test_the_files_backoff_max_is_the_policys_and_the_command_line_keeps_its_backoff() -> None:
    from fleetctl.api.runspec import RunSpec
    from fleetctl.plan.roles.jobfile import parse_job_file

    file = parse_job_file("retry: {backoff: 3, backoff_max: 7}\n" + ROLES).retry
    assert (file.retry_backoff, file.retry_backoff_max, file.where) == (3.0, 7.0, "job.yml:1")
    p = RunSpec.build("t.py", retry_backoff=1.5).retry.policy(file)
    assert (p.backoff, p.backoff_max) == (1.5, 7.0)
    assert RunSpec.build("t.py").retry.policy().backoff_max == 300.0


def test_the_retry_blocks_keys_meet_the_retry_groups_fields_in_one_mapping() -> None:
    """``RETRY_KEYS`` is the one place a ``retry:`` key is given its ``Retry`` field (the file's
    ``backoff`` is ``retry_backoff``); docs/roles.md lists the same mapping."""
    import re
    from dataclasses import fields
    from pathlib import Path

    from fleetctl.api.runspec import Retry
    from fleetctl.plan.retryrules import RETRY_KEYS, RetrySpec

    group = {f.name for f in fields(Retry)}
    assert set(RETRY_KEYS.values()) | {"where"} == {f.name for f in fields(RetrySpec)}
    assert {k: v for k, v in RETRY_KEYS.items() if v not in group} == {
        "backoff_max": "retry_backoff_max"
    }
    doc = (Path(__file__).resolve().parents[2] / "docs" / "roles.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| (?:`--[\w-]+` \(`(\w+)`\)|none)", doc, re.M)
    assert {key: field or RETRY_KEYS[key] for key, field in rows} == RETRY_KEYS


def test_a_bad_rule_of_the_command_line_is_named_by_its_flag() -> None:
    from fleetctl.api.runspec import Retry

    with pytest.raises(UsageError, match=r"^--no-retry-on: bad retry rule 'exit:x'"):
        Retry(no_retry_on=("exit:x",)).policy()
