"""Retry policy: is a failed attempt worth another try, and how long to wait first.

Pure: the caller hands in what ended the attempt (:class:`Failure`: exit code, signal, lost node
or could-not-start, plus the failing node's last log lines) and gets a :class:`Decision`.

Rules are ``kind[:value]`` strings, the same on the CLI (``--retry-on``/``--no-retry-on``) and in
the job file (``retry: {retry_on: [...], no_retry_on: [...]}``), parsed by their grammar in
``fleetctl.plan.retryrules`` (below the job file's parser); whether a failure meets one is here
(:func:`matches`):

* ``exit:137`` / ``exit:137,139`` — the launcher's exit code;
* ``signal:KILL`` / ``signal:9`` / ``signal:SIGKILL`` — the signal that ended it;
* ``lost`` — the node stopped answering; ``start-failed`` — the job could not start there;
* ``node-stop`` — the node stopped the job itself: its supervisor got SIGTERM/SIGINT there
  (a shutdown or ``reboot``: the service manager's SIGTERM to every process comes first);
* ``log:REGEX`` — a regex (Python ``re``, searched) on the failing node's last log lines;
* ``any`` — every failure.

Order (first match wins): the user's ``no-retry`` rules, the user's ``retry`` rules, the default
retry rules (lost node, a node's own stop, SIGKILL, exit 137, ``NCCL timeout``/``NCCL error``/
connection reset, the NCCL watchdog), then the default no-retry rule (a Python ``Traceback`` —
an exception in user code is a bug, not bad luck), then: not retried. So a traceback that
carries an NCCL error is retried, a plain ``ValueError`` is not, and the user can override both
ways.

An interrupted attempt (Ctrl-C) or one that never launched (check/push/plan errors) is never
retried: those are not the job's luck either.

Backoff: exponential (``base * factor**(k-1)``), capped at ``max_delay``, with ± ``jitter``
relative randomness from a caller-provided number in [0, 1) so tests stay deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from fleetctl.errors import UsageError
from fleetctl.job.records.jobrecord import signal_name
from fleetctl.job.records.state import NODE_STOP
from fleetctl.plan.retryrules import NO_RETRY, RETRY, Rule, parse_rule

TAIL_LINES = 50

DEFAULT_RETRY_RULES = (
    "lost",
    "node-stop",
    "signal:KILL",
    "exit:137",
    r"log:NCCL (timeout|error)|NCCL communicator was aborted|Watchdog caught collective "
    r"operation timeout",
    r"log:(?i:connection reset by peer|ECONNRESET)",
)
DEFAULT_NO_RETRY_RULES = (r"log:^Traceback \(most recent call last\):",)

DEFAULT_BACKOFF = 5.0
DEFAULT_BACKOFF_FACTOR = 2.0
DEFAULT_BACKOFF_MAX = 300.0
DEFAULT_JITTER = 0.2


@dataclass(frozen=True)
class Failure:
    """What ended an attempt, seen from its first failing node.

    ``kind``: exit (non-zero code), signal, lost, start_failed, interrupted, error.
    """

    kind: Literal["exit", "signal", "lost", "start_failed", "interrupted", "error"]
    exit_code: int | None = None
    signal: int | None = None
    log_tail: tuple[str, ...] = ()
    host: str | None = None
    rank: int | None = None
    reason: str | None = None

    @classmethod
    def from_node(cls, node: Any, log_tail: Iterable[str] = ()) -> Failure:
        """From a ``NodeOutcome`` (or its job.json dict): state, exit code, signal."""
        get = node.get if isinstance(node, dict) else lambda k: getattr(node, k, None)
        state = get("state")
        sig, code = get("signal"), get("exit_code")
        kind: Literal["exit", "signal", "lost", "start_failed"]
        if state == "lost":
            kind = "lost"
        elif state == "start_failed":
            kind = "start_failed"
        elif sig is not None:
            kind = "signal"
        else:
            kind = "exit"
        return cls(
            kind=kind,
            exit_code=code,
            signal=sig,
            log_tail=tuple(log_tail)[-TAIL_LINES:],
            host=get("host"),
            rank=get("rank"),
            reason=get("reason"),
        )

    def describe(self) -> str:
        if self.kind == "lost":
            return "node lost"
        if self.kind == "start_failed":
            return "could not start"
        if self.kind == "signal" and self.signal is not None:
            return f"signal {self.signal} ({signal_name(self.signal)})"
        if self.kind == "exit":
            return f"exit code {self.exit_code}"
        return self.kind


def matches(rule: Rule, f: Failure) -> bool:
    """Whether failure ``f`` is what ``rule`` names."""
    if rule.kind == "any":
        return f.kind not in ("interrupted", "error")
    if rule.kind == "lost":
        return f.kind == "lost"
    if rule.kind == "node-stop":
        return f.kind in ("signal", "exit") and (f.reason or "").startswith(NODE_STOP)
    if rule.kind == "start-failed":
        return f.kind == "start_failed"
    if rule.kind == "exit":
        return f.kind == "exit" and f.exit_code in rule.codes
    if rule.kind == "signal":
        return f.signal is not None and f.signal in rule.codes
    if rule.kind == "log":
        assert rule.pattern is not None
        return any(rule.pattern.search(line) for line in f.log_tail)
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """How many retries and by which rules (user rules first, then the defaults)."""

    max_retries: int = 0
    retry_on: tuple[Rule, ...] = ()
    no_retry_on: tuple[Rule, ...] = ()
    defaults: bool = True
    backoff: float = DEFAULT_BACKOFF
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR
    backoff_max: float = DEFAULT_BACKOFF_MAX
    jitter: float = DEFAULT_JITTER

    @classmethod
    def build(
        cls,
        *,
        max_retries: int = 0,
        retry_on: Sequence[tuple[str, str]] = (),
        no_retry_on: Sequence[tuple[str, str]] = (),
        defaults: bool = True,
        backoff: float | None = None,
        backoff_max: float | None = None,
    ) -> RetryPolicy:
        """From (rule text, source) pairs; UsageError names the bad rule and where it came from."""

        def rules(items: Sequence[tuple[str, str]], action: str) -> tuple[Rule, ...]:
            out = []
            for text, source in items:
                try:
                    out.append(parse_rule(text, action, source=source))
                except UsageError as e:
                    raise UsageError(f"{source}: {e}") from e
            return tuple(out)

        return cls(
            max_retries=max_retries,
            retry_on=rules(retry_on, RETRY),
            no_retry_on=rules(no_retry_on, NO_RETRY),
            defaults=defaults,
            backoff=DEFAULT_BACKOFF if backoff is None else backoff,
            backoff_max=DEFAULT_BACKOFF_MAX if backoff_max is None else backoff_max,
        )

    @property
    def tries(self) -> int:
        """Attempts the job may take at most: the first and ``max_retries`` more."""
        return 1 + self.max_retries

    def rules(self) -> list[Rule]:
        """Every rule in the order they are tried."""
        out = [*self.no_retry_on, *self.retry_on]
        if self.defaults:
            out += [parse_rule(t, RETRY, source="default") for t in DEFAULT_RETRY_RULES]
            out += [parse_rule(t, NO_RETRY, source="default") for t in DEFAULT_NO_RETRY_RULES]
        return out

    def classify(self, failure: Failure) -> Decision:
        """Retry this failure? (ignores the attempt budget: see :meth:`decide`)."""
        if failure.kind in ("interrupted", "error"):
            return Decision(False, f"{failure.kind}: never retried")
        for rule in self.rules():
            if matches(rule, failure):
                return Decision(rule.action == RETRY, str(rule), rule)
        return Decision(False, f"{failure.describe()}: no retry rule matches")

    def decide(self, failure: Failure, attempt: int) -> Decision:
        """After attempt ``attempt`` (1-based) failed: retry, within ``max_retries``?"""
        d = self.classify(failure)
        if d.retry and attempt > self.max_retries:
            return Decision(
                False, f"{d.reason}; but no retries left ({self.max_retries} allowed)", d.rule
            )
        return d

    def delay(self, attempt: int, rand: float) -> float:
        """Seconds to wait before attempt ``attempt + 1``; ``rand`` in [0, 1)."""
        return backoff_delay(
            attempt,
            base=self.backoff,
            factor=self.backoff_factor,
            max_delay=self.backoff_max,
            jitter=self.jitter,
            rand=rand,
        )


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    rule: Rule | None = None


def backoff_delay(
    attempt: int,
    *,
    base: float = DEFAULT_BACKOFF,
    factor: float = DEFAULT_BACKOFF_FACTOR,
    max_delay: float = DEFAULT_BACKOFF_MAX,
    jitter: float = DEFAULT_JITTER,
    rand: float = 0.5,
) -> float:
    """``base * factor**(attempt-1)`` capped at ``max_delay``, times (1 ± jitter), within
    [0, max_delay]. ``rand`` = 0.5 gives the un-jittered value."""
    if attempt < 1:
        raise ValueError("attempt is 1-based")
    raw = min(max_delay, base * factor ** min(attempt - 1, 64))
    jittered = raw * (1.0 + jitter * (2.0 * min(max(rand, 0.0), 1.0) - 1.0))
    return round(min(max_delay, max(0.0, jittered)), 3)
