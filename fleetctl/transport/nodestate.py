"""Slurm's word on the allocation's nodes: a node it marks DOWN, FAIL or NOT_RESPONDING is
lost at once, not after ``--lost-timeout``.

Why: a node whose slurmd is gone and whose link is cut leaves its srun step silent; the
watcher would wait the whole lost-node timeout. slurmctld notices first (its pings fail:
``NOT_RESPONDING`` after about ``SlurmdTimeout/3`` + ``MessageTimeout``, ``DOWN`` after
``SlurmdTimeout``), and once it marks the node ``DOWN`` it kills the job (unless
``--no-kill``), which would race fleetctl's own teardown. One ``scontrol show node -o`` for
every node of the job every ``POLL_EVERY`` seconds, bounded; a failed ask is no verdict.
The parser is pure; :class:`NodeStateWatch` is the polling thread.
"""

from __future__ import annotations

import re
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

POLL_EVERY = 3.0  # s between asks of slurmctld (one RPC for all the job's nodes)
ASK_TIMEOUT = 10.0  # one scontrol call
#: state words (base state or flag) that mean the node is gone for the job
LOST_STATES = frozenset({"DOWN", "FAIL", "FAILING", "NOT_RESPONDING", "POWERED_DOWN"})
#: a DRAIN is an admin's "no new jobs" (running jobs go on) unless Slurm set it after a
#: failure: these reasons (slurmctld's and slurmd's own words) make it lost
FAILURE_REASONS = (
    "not responding",
    "kill task failed",
    "prolog error",
    "epilog error",
    "batch job complete failure",
    "unexpectedly rebooted",
    "node unexpectedly",
    "job credential",
    "launch failed",
    "health check",
    "low realmemory",
    "gres/",
)
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?=\s+[A-Z][A-Za-z_]*=|$)")
_STAMP = re.compile(r"\s*\[[^\]@]*@[^\]]*\]\s*$")  # "[slurm@2026-11-26T14:45:10]"


@dataclass(frozen=True)
class NodeStatus:
    """One node as ``scontrol show node -o`` shows it."""

    name: str
    state: str  # as Slurm writes it: ``ALLOCATED``, ``DOWN+NOT_RESPONDING``, ``MIXED+DRAIN``
    reason: str | None = None  # without its ``[user@time]`` stamp

    @property
    def words(self) -> set[str]:
        """Base state and flags; a ``*`` on the base state (sinfo's style) is NOT_RESPONDING."""
        out = set()
        for w in self.state.upper().split("+"):
            if w.endswith("*"):
                out.add("NOT_RESPONDING")
            out.add(w.rstrip("*~#!%$@^-"))
        return out

    def lost_reason(self) -> str | None:
        """Why this node is lost for the job in Slurm's words, or None (it is fine)."""
        words = self.words
        failure = bool(words & LOST_STATES)
        if not failure and words & {"DRAIN", "DRAINING", "DRAINED"}:
            failure = any(r in (self.reason or "").lower() for r in FAILURE_REASONS)
        if not failure:
            return None
        return f"Slurm marked {self.name} {self.state}" + (
            f": {self.reason}" if self.reason else ""
        )


def parse_show_node(text: str) -> dict[str, NodeStatus]:
    """``scontrol show node -o [NODES]`` → {NodeName: NodeStatus}."""
    out: dict[str, NodeStatus] = {}
    for line in text.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        state = re.search(r"(?:^|\s)State=(\S+)", line)
        if not (name and state):
            continue
        m = _REASON.search(line)
        reason = _STAMP.sub("", m.group(1)).strip() if m else ""
        out[name.group(1)] = NodeStatus(
            name.group(1), state.group(1), None if reason in ("", "(null)", "None") else reason
        )
    return out


def lost_nodes(statuses: Mapping[str, NodeStatus], names: Sequence[str]) -> dict[str, str]:
    """{node: Slurm's reason} for the ``names`` Slurm says are gone."""
    out = {}
    for name in names:
        st = statuses.get(name)
        why = st.lost_reason() if st is not None else None
        if why is not None:
            out[name] = why
    return out


def ask(names: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """One ``scontrol show node -o`` for ``names``; None when Slurm did not answer."""
    argv = ["scontrol", "show", "node", "-o", ",".join(names)]
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=ASK_TIMEOUT,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


class NodeStateWatch:
    """A thread asking Slurm about ``names`` every ``every`` s until :meth:`stop`;
    ``on_lost(name, reason)`` once per node Slurm says is gone (until it returns True: a node
    not yet started is told again at the next ask)."""

    def __init__(
        self,
        names: Sequence[str],
        on_lost: Callable[[str, str], bool],
        *,
        every: float = POLL_EVERY,
        asker: Callable[[Sequence[str]], str | None] = ask,
    ) -> None:
        self.names = list(dict.fromkeys(names))
        self.on_lost = on_lost
        self.every = every
        self.asker = asker
        self.reported: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slurm-node-state")

    def start(self) -> NodeStateWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(ASK_TIMEOUT + 1.0)

    def poll(self) -> dict[str, str]:
        """Ask once; report (and return) nodes newly found gone."""
        text = self.asker(self.names)
        if text is None:
            return {}
        new = {
            n: why
            for n, why in lost_nodes(parse_show_node(text), self.names).items()
            if n not in self.reported
        }
        for name, why in list(new.items()):
            if self.on_lost(name, why):
                self.reported[name] = why
            else:
                del new[name]
        return new

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.poll()
            except Exception:  # a broken ask is no verdict; --lost-timeout still holds
                continue
