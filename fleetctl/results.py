"""Outcomes of a fan-out: one entry per node, success or exception, never just the first error."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


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
