"""Completion policy (FrameworkController semantics): which task states end the job, and how."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.plan.roles.plan import RoleLayout


@dataclass(frozen=True)
class Verdict:
    """The job's end as the completion policy sees it. ``status``: succeeded or failed."""

    status: str
    reason: str
    role: str | None = None


@dataclass(frozen=True)
class CompletionPolicy:
    """min_failed / min_succeeded per role (rank -> role through ``roles``).

    A plain (non-role) job is one role ``""`` with min_failed 1: the first failure ends it.
    """

    roles: tuple[str, ...]  # role of each rank
    min_failed: Mapping[str, int | None] = field(default_factory=dict, hash=False)
    min_succeeded: Mapping[str, int | None] = field(default_factory=dict, hash=False)

    @classmethod
    def for_layout(cls, layout: RoleLayout) -> CompletionPolicy:
        return cls(
            roles=tuple(t.role for t in layout.tasks),
            min_failed={r.name: r.min_failed for r in layout.job.roles},
            min_succeeded={r.name: r.min_succeeded for r in layout.job.roles},
        )

    def fails_job(self, rank: int, states: Sequence[str]) -> bool:
        """Does this rank's failure (already in ``states``) reach its role's min_failed?"""
        role = self.roles[rank]
        limit = self.min_failed.get(role, 1)
        if limit is None:
            return False
        failed = sum(
            1 for r, s in zip(self.roles, states, strict=False) if r == role and s in FAILED
        )
        return failed >= limit

    def verdict(self, states: Sequence[str]) -> Verdict | None:
        """The job's end, or None while it goes on. ``states``: NodeOutcome.state per rank."""
        for role in dict.fromkeys(self.roles):
            ranks = [i for i, r in enumerate(self.roles) if r == role]
            failed = sum(1 for i in ranks if states[i] in FAILED)
            ok = sum(1 for i in ranks if states[i] == "succeeded")
            limit = self.min_failed.get(role, 1)
            if limit is not None and failed >= limit:
                return Verdict("failed", f"{failed} task(s) of role {role!r} failed", role)
            want = self.min_succeeded.get(role)
            if want is not None and ok >= want:
                return Verdict("succeeded", f"{ok} task(s) of role {role!r} succeeded", role)
        if all(s not in ("pending", "running") for s in states):
            return Verdict("succeeded", "every task ended")
        return None


FAILED = frozenset({"failed", "lost", "start_failed"})
