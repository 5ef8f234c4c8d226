"""What every launcher adapter receives, and the small path helpers they share.

Adapters are pure: they turn the plan-wide facts (``LaunchContext``) and one node's slot
(a ``NodePlan`` still without argv) into that node's argv and any files the run phase must
write into the node's run folder first. They never touch the network or the clock; only the
after-the-run hooks (``rank_files``) read the run folder collected home.

A launcher is one module: besides argv it says where each rank's output goes (``rank_logs``:
the supervisor's ``rank_logs`` spec; ``rank_files``: the collected files of a rank), which
ranks its last words name as failed (``named_failures``) and which files it writes the
environment into (``env_dumps``: redacted after collection). Nothing outside this folder asks
which launcher it is by name.

Paths: the run phase starts the launcher with ``cwd = NodePlan.cwd``: the script's own folder
in the job's work folder ``W/work/<job>`` (a copy of the code; ``NodePlan.work_dir`` when the
script is in a sub-folder), as ``python train.py`` would run in the user's checkout; the node
run folder is ``W/runs/<job>/<rank>-<host>``. Every path fleetctl puts in argv is relative to
the cwd when it lies under the same root (``train.py``, ``../../runs/<job>/0-node1/torchrun``),
so a workdir such as ``~/.fleetctl`` works without any shell tilde expansion, and absolute
otherwise.

What runs (``LaunchContext.kind``): a Python file (``python SCRIPT``), a module (``python -m
MODULE``, the module looked up from the cwd) or a shell script (``bash SCRIPT``); each launcher
says which it can start (``Launcher.kinds``) and how (:func:`program`).
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from fleetctl.plan.rankplan import NodePlan

T = TypeVar("T")

PYTHON, MODULE, SHELL = "python", "module", "shell"  # what SCRIPT is (LaunchContext.kind)
SCRIPT_KINDS = (PYTHON, MODULE, SHELL)
SHELL_SUFFIXES = (".sh", ".bash")


def kind_of(script: str) -> str:
    """A script's kind by its name alone: shell for ``.sh``/``.bash``, else Python (the CLI
    looks inside files with other names first)."""
    return SHELL if script.endswith(SHELL_SUFFIXES) else PYTHON


@dataclass(frozen=True)
class LaunchContext:
    """The plan-wide values every node's argv is built from (identical on every node): the
    resolved plan, never the request (``--nproc-per-node auto`` is a count here, the port the
    one the job claimed)."""

    job_id: str
    launcher: str
    script: str  # relative to the code dir
    args: tuple[str, ...]
    master_addr: str
    rdzv_port: int  # the rendezvous port on node 0, after the port claim (paddle: its start)
    ips: tuple[str, ...]  # training addresses, rank order
    nnodes: int
    procs: int  # processes each node starts (``auto``/GPU counts resolved)
    gpus_per_node: int  # 0 when the nodes have no (known) GPUs: CPU / gloo
    extra_argv: tuple[str, ...] = ()  # --launcher-arg: after fleetctl's flags, before SCRIPT
    gpu_lists: tuple[tuple[str, ...], ...] = ()  # per node (rank order): fleetctl_gpus lists
    kind: str = PYTHON  # what ``script`` is: a Python file, a module name, a shell script
    # ``run --elastic``: the node range ``MIN:MAX`` of an elastic rendezvous (None: static)
    elastic: str | None = None
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


def console_log(node_dir: Path, local: int, rank: int) -> list[Path]:
    """A rank with no file of its own: the node's console (what the launcher printed)."""
    return [p for p in [node_dir / "console.log"] if p.is_file()]


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
    # Options refused for a reason of their own (normalized name -> why): what the user meant
    # is done another way (accelerate's --cpu: fleetctl's CPU world).
    refused: Mapping[str, str] = field(default_factory=dict, hash=False)
    # What it can start (PYTHON, MODULE, SHELL), and the options that say which (set by
    # fleetctl from SCRIPT: a --launcher-arg naming one is refused too).
    kinds: frozenset[str] = frozenset({PYTHON})
    kind_options: frozenset[str] = frozenset()
    # PlanError when it cannot start this script of that kind (paddle: only ``*.py``).
    check_script: Callable[[str, str], None] = field(default=lambda kind, script: None)
    # Whether there is a launcher process to take --launcher-arg options (plain: none).
    takes_args: bool = True
    # ``run --elastic``: agents that outlive a lost node (a c10d rendezvous; torchrun only).
    elastic: bool = False
    # It sets CUDA_VISIBLE_DEVICES itself (deepspeed, from --include): the plan leaves it out.
    sets_visible_devices: bool = False
    # Every local rank listens on its own port (paddle's endpoints: start_port + local rank):
    # the run claims that many ports on every node, not one rendezvous port on node 0.
    port_per_local_rank: bool = False
    # (node rank, processes per node) -> the supervisor spec's ``rank_logs``: where the
    # launcher writes each rank's output, which the supervisor tails into ``[rank G]`` lines
    # (``dir`` in the run folder; ``files``, regexes matching a file's path relative to it,
    # group 1 the rank's number, G = ``base`` + it; ``deep``: in sub-folders too; ``echo``, a
    # rank file the launcher also prints, dropped from its console), None when the ranks
    # write only to the launcher's console.
    rank_logs: Callable[[int, int], dict[str, Any] | None] = field(default=lambda r, n: None)
    # No launcher process between the supervisor and the job: its child is local rank 0, the
    # only rank process (the spec's ``one_process``: no scan for ranks by their env).
    one_process: bool = False
    # (collected node folder, local rank, global rank) -> that rank's log files, in order.
    rank_files: Callable[[Path, int, int], list[Path]] = console_log
    # The launcher's last lines -> (global rank, exit code if said) of the ranks it names failed.
    named_failures: Callable[[list[str]], list[tuple[int, int | None]]] = field(
        default=lambda tail: []
    )
    # Globs (relative to the node folder) of files it dumps the environment into: the values
    # of user-given variables are redacted there after collection.
    env_dumps: tuple[str, ...] = ()


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
    root = node.code_dir if node.cwd == node.run_dir else (node.work_dir or node.cwd)
    return path_from(node.cwd, posixpath.join(root, script))


def program(
    ctx: LaunchContext,
    node: NodePlan,
    *,
    module: Sequence[str] = ("-m",),
    shell: Sequence[str] = (),
) -> list[str]:
    """What a launcher's argv ends with: SCRIPT (a Python file), ``-m MODULE`` (``module``: the
    launcher's flag for it), or ``bash SCRIPT`` after the launcher's flag for running a
    command that is not Python (``shell``: torchrun's ``--no-python``); then the user's args."""
    if ctx.kind == MODULE:
        return [*module, ctx.script, *ctx.args]
    if ctx.kind == SHELL:
        return [*shell, "bash", script_path(node, ctx.script), *ctx.args]
    return [script_path(node, ctx.script), *ctx.args]


def python_path(node: NodePlan) -> str:
    """The node's interpreter: a bare name stays a PATH lookup, a path is made cwd-relative.

    A cwd-relative interpreter (``../../envs/<sha>/bin/python``) keeps working without
    ``~`` expansion; execvp resolves names containing a slash against the cwd.
    """
    if "/" not in node.python:
        return node.python
    rel = path_from(node.cwd, node.python)
    return rel if rel.startswith(("/", "..")) else "./" + rel
