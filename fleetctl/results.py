"""Outcomes of a fan-out: one entry per node, success or exception, never just the first error.

Every result the library returns for many hosts speaks one protocol (:class:`Outcome`): ``ok``,
``exit_code`` (the command's: 0 when ok), ``failed`` (host → what went wrong there, in rank
order; empty when ok) and ``to_dict()`` (JSON-ready, with ``ok``, ``exit_code`` and ``failed``
among its keys). ``FleetResult`` here, ``fleetctl.api.RunResult`` (a job's verdict, direct or
submitted), ``ExecResult`` (``fleetctl exec``) and ``CheckReport`` (``fleetctl check``) carry
it (``tests/pure/test_outcomes.py`` holds each to one contract). ``CommandResult`` is one
host's value inside a fan-out (``ok``, ``exit_code``, ``to_dict()``; no host to name).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

T = TypeVar("T")


@runtime_checkable
class Outcome(Protocol):
    """What every result over hosts answers (``FleetResult``, ``RunResult``, ``ExecResult``,
    ``CheckReport``; ``StatusReport``, ``StopReport``, ``CollectReport`` of a job)."""

    @property
    def ok(self) -> bool: ...

    @property
    def exit_code(self) -> int: ...

    @property
    def failed(self) -> Mapping[str, Any]: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CommandResult:
    """What one remote (or local) command returned."""

    command: str
    exit_code: int
    stdout: str = ""
    stderr: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "exit_code": self.exit_code,
            "ok": self.ok,
            "stdout": self.stdout,
            "stderr": self.stderr,
        }


class Cancelled(Exception):
    """Stored for a node whose work was not started or was abandoned because another failed."""


@dataclass
class FleetResult(Generic[T], Mapping[str, "T | BaseException"]):
    """Node name -> value or exception, in rank order (like fabric's GroupResult)."""

    outcomes: dict[str, T | BaseException] = field(default_factory=dict)

    def __getitem__(self, key: str) -> T | BaseException:
        return self.outcomes[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)

    @property
    def succeeded(self) -> dict[str, T]:
        return {k: v for k, v in self.outcomes.items() if not isinstance(v, BaseException)}

    @property
    def failed(self) -> dict[str, BaseException]:
        return {
            k: v
            for k, v in self.outcomes.items()
            if isinstance(v, BaseException) and not isinstance(v, Cancelled)
        }

    @property
    def cancelled(self) -> list[str]:
        return [k for k, v in self.outcomes.items() if isinstance(v, Cancelled)]

    @property
    def ok(self) -> bool:
        return all(not isinstance(v, BaseException) for v in self.outcomes.values())

    @property
    def exit_code(self) -> int:
        """0 when every node succeeded, else 1 (a fan-out's own failure)."""
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        """host → ``{"ok": true, "value": …}`` or ``{"ok": false, "error": "…"}`` (and
        ``"cancelled": true``), with ``ok``, ``exit_code`` and ``failed`` (host → message)."""

        def one(v: Any) -> dict[str, Any]:
            if isinstance(v, Cancelled):
                return {"ok": False, "cancelled": True, "error": str(v)}
            if isinstance(v, BaseException):
                return {"ok": False, "error": f"{type(v).__name__}: {v}"}
            return {"ok": True, "value": v.to_dict() if hasattr(v, "to_dict") else v}

        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "failed": {h: str(e) for h, e in self.failed.items()},
            "nodes": {h: one(v) for h, v in self.outcomes.items()},
        }
