"""What the rank plan refuses before it builds anything: the job spec (job id, script path,
port, processes per node, backend, env names), the launcher args fleetctl sets itself, node names
given twice, a loopback training address next to remote ones. Pure; each refusal a ``PlanError``
(exit 2) naming the option or host."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fleetctl.errors import PlanError
from fleetctl.node import LOCAL_ADDRESSES
from fleetctl.plan.launchers.base import MODULE, option_name

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.plan.launchers.base import Launcher
    from fleetctl.plan.rankplan import JobSpec

JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
# \Z, not $: "$" also matches before a trailing newline ("A\n" would pass)
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
RESERVED_ENV = frozenset({"FLEET_JOB_ID", "FLEET_NODE_RANK"})
BACKENDS = ("nccl", "gloo")


def check_launcher_args(launcher: Launcher, args: Sequence[str]) -> None:
    """PlanError (exit 2) naming a --launcher-arg that fleetctl sets itself, or any for plain."""
    if args and not launcher.takes_args:
        raise PlanError(
            f"--launcher-arg {args[0]}: the {launcher.name} launcher runs the script directly; "
            "pass options to the script after SCRIPT"
        )
    for arg in args:
        name = option_name(arg)
        if name is not None and name in launcher.kind_options:
            raise PlanError(
                f"--launcher-arg {arg}: fleetctl sets {launcher.name}'s {name} from how SCRIPT "
                "is given (run -m MODULE for a module, a .sh file for a shell script); leave it out"
            )
        if name is not None and name in launcher.refused:
            raise PlanError(f"--launcher-arg {arg}: {launcher.refused[name]}; leave it out")
        if name is not None and name in launcher.owned:
            raise PlanError(
                f"--launcher-arg {arg}: {launcher.name}'s {name} is set by fleetctl from the "
                "inventory and the rank plan (the same on every node); leave it out"
            )


def check_spec(spec: JobSpec) -> None:
    if not JOB_ID_RE.match(spec.job_id or ""):
        raise PlanError(f"invalid job id {spec.job_id!r} (letters, digits, '.', '_', '-')")
    if spec.kind == MODULE:
        if not all(p.isidentifier() for p in spec.script.split(".")):
            raise PlanError(f"-m {spec.script!r} is not a module name (dotted identifiers)")
    else:
        check_relpath(spec.script, "script")
    if spec.folder not in ("", "."):
        check_relpath(spec.folder, "folder")
    if not isinstance(spec.rdzv_port, int) or not 1 <= spec.rdzv_port <= 65535:
        raise PlanError(f"master port must be 1-65535, got {spec.rdzv_port!r}")
    n = spec.procs
    if n != "auto" and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise PlanError(f"--nproc-per-node must be a positive integer or 'auto', got {n!r}")
    if spec.backend is not None and spec.backend not in BACKENDS:
        raise PlanError(f"unknown backend {spec.backend!r} (known: {', '.join(BACKENDS)})")
    checked_env(spec.env, "--env-var")


def check_relpath(path: str, what: str) -> None:
    """Paths that land on a node must stay inside the folder they are relative to."""
    norm = posixpath.normpath(path) if path else ""
    if not path or path.startswith("/") or norm == "." or norm.split("/")[0] == "..":
        raise PlanError(f"{what} {path!r} must be a relative path inside the code dir")


def checked_env(env: Mapping[str, Any], where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in env.items():
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            raise PlanError(f"{where}: invalid environment variable name {key!r}")
        if key in RESERVED_ENV:
            raise PlanError(f"{where}: {key} is set by fleetctl and cannot be overridden")
        text = "" if value is None else str(value)
        if "\0" in text:
            raise PlanError(f"{where}: value of {key} contains a NUL byte")
        out[key] = text
    return out


def where(n: Node) -> str:
    return f"{n.source}: {n.name}: " if n.source else f"{n.name}: "


def check_unique_names(nodes: Sequence[Node]) -> None:
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise PlanError(f"host {n.name} appears twice in the node list")
        seen.add(n.name)


def _is_loopback(addr: str) -> bool:
    return addr in LOCAL_ADDRESSES or addr.startswith("127.")


def check_loopback_mix(addrs: Mapping[str, str]) -> None:
    """A loopback training address next to real ones cannot be reached by the other nodes."""
    loop = [h for h, a in addrs.items() if _is_loopback(a)]
    if loop and len(loop) < len(addrs):
        raise PlanError(
            f"{', '.join(loop)}: training address is loopback but other nodes are remote; "
            "they could not reach it (set fleetctl_addr or fleetctl_nic)"
        )
