"""Developer tasks (invoke, as fabric/invoke projects keep them): ``inv lint``, ``inv test``,
``inv bench``, and fleetctl's own tasks for the dev loop (``inv fleetctl.check -i hosts.yml``,
``inv fleetctl.run job.py --launcher plain``; ``fleetctl.tasks``, as a team adds them to its
own tasks.py). They run the same commands as README and ``.ci/run``; nothing here is needed to
use fleetctl."""

from __future__ import annotations

from invoke import Collection, Context, task

import fleetctl.tasks

TIERS = {"pure": "tests/pure", "lab": "tests/lab", "e2e": "tests/e2e", "all": "tests"}


@task
def lint(c: Context) -> None:
    """ruff: lint and format check (what CI runs first); mypy (tests/pure/test_types.py)."""
    c.run("python3 -m ruff check .", pty=False)
    c.run("python3 -m ruff format --check .", pty=False)
    c.run("python3 -m mypy", pty=False)


@task(help={"tier": "pure | lab | e2e | all (lab and e2e need root)"})
def test(c: Context, tier: str = "all") -> None:
    """pytest on one tier, with README's test command."""
    if tier not in TIERS:
        raise SystemExit(f"inv test: --tier must be one of {', '.join(TIERS)}, not {tier!r}")
    c.run(f"python3 -m pytest -q {TIERS[tier]}", pty=False)


@task(
    auto_shortflags=False,
    help={
        "only": "comma list: fanout,ssh,teardown,lost,push,logs,pipeline (default: all)",
        "hosts": "lab size (default: bench/run.py's)",
        "out": "report path (default: docs/benchmarks.md)",
    },
)
def bench(c: Context, only: str = "", hosts: int = 0, out: str = "") -> None:
    """bench/run.py (root: it starts a lab of real sshd hosts)."""
    args = [f"--only {only}"] if only else []
    args += [f"--hosts {hosts}"] if hosts else []
    args += [f"--out {out}"] if out else []
    c.run(" ".join(["python3 bench/run.py", *args]), pty=False)


ns = Collection(lint, test, bench)
ns.add_collection(fleetctl.tasks)
