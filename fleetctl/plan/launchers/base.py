"""What every launcher adapter receives, and the small path helpers they share.

Adapters are pure: they turn the plan-wide facts (``LaunchContext``) and one node's slot
(a ``NodePlan`` still without argv) into that node's argv and any files the run phase must
write into the node's run folder first. They never touch the network, the disk or the clock.

Paths: the run phase starts the launcher with ``cwd = NodePlan.cwd`` (the job's work folder
``W/work/<job>``, a copy of the code; the node run folder is ``W/runs/<job>/<rank>-<host>``).
Every path fleetctl puts in argv is relative to the cwd when it lies under the same root
(``train.py``, ``../../runs/<job>/0-node1/torchrun``), so a workdir such as ``~/.fleetctl``
works without any shell tilde expansion, and absolute otherwise.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan

T = TypeVar("T")


@dataclass(frozen=True)
class LaunchContext:
    """The plan-wide values every node's argv is built from (identical on every node)."""

    job_id: str
    launcher: str
    script: str  # relative to the code dir
    args: tuple[str, ...]
    master_addr: str
    master_port: int
    ips: tuple[str, ...]  # training addresses, rank order
    nnodes: int
    nproc_per_node: int
    gpus_per_node: int  # 0 when the nodes have no (known) GPUs: CPU / gloo
    launcher_args: tuple[str, ...] = ()  # --launcher-arg: after fleetctl's flags, before SCRIPT
    gpu_lists: tuple[tuple[str, ...], ...] = ()  # per node (rank order): fleetctl_gpus lists
    _memo: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def once(self, key: str, build: Callable[[], T]) -> T:
        """A fleet-wide value (the ``--ips`` list, deepspeed's hostfile) built once per plan and
        shared by every node: built per node, it cost time and memory in nodes² (5,000 nodes:
        5,000 copies of a 70 kB string)."""
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]  # type: ignore[no-any-return]

    @property
    def ips_csv(self) -> str:
        """The training addresses joined by commas (``FLEET_NODE_IPS``, paddle's ``--ips``)."""
        return self.once("ips_csv", lambda: ",".join(self.ips))


@dataclass(frozen=True)
class Launcher:
    """One adapter: how to build argv, which files to write, what it needs from the plan."""

    name: str
    argv: Callable[[LaunchContext, NodePlan], list[str]]
    files: Callable[[LaunchContext, NodePlan], dict[str, str]] = field(default=lambda c, n: {})
    env: Callable[[LaunchContext, NodePlan], dict[str, str]] = field(default=lambda c, n: {})
    # Raise PlanError when the plan cannot work with this launcher (message names the host).
    validate: Callable[[LaunchContext, Mapping[str, str]], None] = field(
        default=lambda c, addrs: None
    )
    one_process_per_node: bool = False
    # What the node python must import to run this launcher (the check imports it there).
    module: str | None = None
    # Options fleetctl sets from the rank plan (normalized: lower case, ``_`` as ``-``); a
    # --launcher-arg naming one is refused, or the plan would not be the one that runs.
    owned: frozenset[str] = frozenset()


def option_name(arg: str) -> str | None:
    """``--Max_Restarts=3`` -> ``--max-restarts``; None for a value (not an option)."""
    if not arg.startswith("-") or arg == "-" or arg[1:2].isdigit():
        return None
    return arg.split("=", 1)[0].lower().replace("_", "-")


def path_from(cwd: str, target: str) -> str:
    """``target`` as argv can use it from ``cwd``: absolute stays absolute, ``~/…`` relative.

    Only paths needing ``~`` expansion are rewritten (argv gets no shell to expand them), by
    pure string work: ``~/.fleetctl/code/x`` seen from ``~/.fleetctl/runs/j`` is
    ``../../code/x``. Anything else (absolute, or roots that differ) is returned unchanged.
    """
    if target.startswith("/") or cwd.startswith("/"):
        return target
    t, c = _parts(target), _parts(cwd)
    if not t or not c or t[0] != c[0]:
        return target
    i = 0
    while i < min(len(t), len(c)) and t[i] == c[i]:
        i += 1
    rel = [".."] * (len(c) - i) + t[i:]
    return posixpath.join(*rel) if rel else "."


def _parts(path: str) -> list[str]:
    norm = posixpath.normpath(path)
    head = ["/"] if norm.startswith("/") else []
    return head + [p for p in norm.split("/") if p and p != "."]


def run_path(node: NodePlan, rel: str) -> str:
    """A file of the node run folder (launcher logs, the hostfile) as argv names it: the
    launcher runs in the job's work folder, not in the run folder."""
    return path_from(node.cwd, posixpath.join(node.run_dir, rel))


def script_path(node: NodePlan, script: str) -> str:
    """The user's script as argv names it, relative to the node's cwd when possible: the work
    folder's copy (a plan without one, cwd = run folder: the code snapshot's)."""
    root = node.code_dir if node.cwd == node.run_dir else node.cwd
    return path_from(node.cwd, posixpath.join(root, script))


def python_path(node: NodePlan) -> str:
    """The node's interpreter: a bare name stays a PATH lookup, a path is made cwd-relative.

    A cwd-relative interpreter (``../../envs/<sha>/bin/python``) keeps working without
    ``~`` expansion; execvp resolves names containing a slash against the cwd.
    """
    if "/" not in node.python:
        return node.python
    rel = path_from(node.cwd, node.python)
    return rel if rel.startswith(("/", "..")) else "./" + rel
