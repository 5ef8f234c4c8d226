"""The retry rules' grammar (pure): ``kind[:value]`` strings, the same on the command line
(``--retry-on``/``--no-retry-on``) and in a role job file's ``retry:`` block, parsed into
:class:`Rule` values. Here, below both, so the job file's parser refuses a bad rule at its
line without importing the attempt loop; whether a failure meets a rule is the retry
policy's (``fleetctl.job.run.retry``). The ``retry:`` block's values (:class:`RetrySpec`) are
here too: a run without a job file builds its policy without loading the job file's parser."""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass, field

from fleetctl.errors import UsageError

RETRY, NO_RETRY = "retry", "no-retry"
KINDS = ("exit", "signal", "lost", "node-stop", "start-failed", "log", "any")


@dataclass(frozen=True)
class Rule:
    """One classification rule; ``source`` says where it came from (default, CLI, file:line)."""

    action: str  # retry | no-retry
    kind: str
    codes: frozenset[int] = frozenset()  # exit codes or signal numbers
    pattern: re.Pattern[str] | None = field(default=None, compare=False)
    text: str = ""
    source: str = "default"

    def __str__(self) -> str:
        return f"{self.action} on {self.text} ({self.source})"


def _signal_number(text: str) -> int:
    t = text.strip().upper()
    if t.isdigit():
        return int(t)
    name = t if t.startswith("SIG") else "SIG" + t
    try:
        return int(_signal.Signals[name])
    except KeyError as e:
        raise UsageError(f"unknown signal {text!r}") from e


def parse_rule(text: str, action: str, *, source: str = "command line") -> Rule:
    """``exit:137``, ``signal:KILL``, ``lost``, ``start-failed``, ``log:REGEX``, ``any``."""
    kind, sep, value = text.partition(":")
    kind = kind.strip().lower().replace("_", "-")
    if kind not in KINDS:
        raise UsageError(
            f"bad retry rule {text!r}: use exit:N[,N], signal:NAME|N, lost, node-stop, "
            "start-failed, log:REGEX or any"
        )
    if kind in ("lost", "node-stop", "start-failed", "any"):
        if sep and value.strip():
            raise UsageError(f"bad retry rule {text!r}: {kind} takes no value")
        return Rule(action, kind, text=kind, source=source)
    if not value.strip():
        raise UsageError(f"bad retry rule {text!r}: {kind} needs a value after ':'")
    if kind == "log":
        try:
            pattern = re.compile(value, re.MULTILINE)
        except re.error as e:
            raise UsageError(f"bad retry rule {text!r}: invalid regex: {e}") from e
        return Rule(action, kind, pattern=pattern, text=f"log:{value}", source=source)
    codes: set[int] = set()
    for part in value.split(","):
        part = part.strip()
        if kind == "exit":
            if not part.lstrip("-").isdigit():
                raise UsageError(f"bad retry rule {text!r}: {part!r} is not an exit code")
            codes.add(int(part))
        else:
            codes.add(_signal_number(part))
    return Rule(action, kind, codes=frozenset(codes), text=f"{kind}:{value}", source=source)


#: a ``retry:`` block's keys -> the attribute of :class:`RetrySpec` each sets, named as the field
#: of ``RunSpec``'s ``Retry`` group it fills (``Retry.policy``: by name, the command line wins):
#: the one place the two spellings meet. ``backoff_max`` has no flag: the file's only.
RETRY_KEYS: dict[str, str] = {
    "max_retries": "max_retries",  # --max-retries
    "retry_on": "retry_on",  # --retry-on (the command line's rules come first)
    "no_retry_on": "no_retry_on",  # --no-retry-on
    "backoff": "retry_backoff",  # --retry-backoff
    "backoff_max": "retry_backoff_max",  # the file's only
}


@dataclass(frozen=True)
class RetrySpec:
    """The job file's ``retry:`` block, as plain values named as the ``Retry`` group's fields
    (:data:`RETRY_KEYS`); the command line adds to / overrides it (``Retry.policy``)."""

    max_retries: int | None = None
    retry_on: tuple[str, ...] = ()
    no_retry_on: tuple[str, ...] = ()
    retry_backoff: float | None = None  # the file's ``backoff``
    retry_backoff_max: float | None = None  # the file's ``backoff_max``
    where: str = ""  # "job.yml:7", the ``retry:`` line: the rules' source in decisions
