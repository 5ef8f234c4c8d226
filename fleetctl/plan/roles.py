"""Task roles (``fleetctl run --job job.yml``): the job file, the task layout and its env.

Pure — no I/O beyond reading the job file text the caller hands in, no network, no clock. A role
job runs several *roles* (OpenPAI's task roles), each on hosts of an inventory group, with its own
command or launcher, instance count and reserved port labels. Every task is one node of the
run (one supervisor, one ``FLEET_NODE_RANK``): a host runs at most one task of a job.

Job file (YAML)::

    name: ps-demo                 # optional, for people
    env_style: pai                # fleet (default) | pai — ``--env-style`` wins
    launcher: paddle-ps           # optional job-level variant (see below)
    script: train.py              # paddle-ps only: the script every task runs
    args: []
    env: {LOG_LEVEL: info}        # every task
    retry: {max_retries: 2, retry_on: ["log:NCCL timeout"], no_retry_on: ["exit:2"]}
    roles:
      server:
        group: servers            # inventory group (default: the role name if it is a group)
        instances: 1              # default: every host of the group not used by an earlier role
        command: python3 server.py   # a string runs under ``sh -c`` (OpenPAI style, $VARS work)
        ports: [http]             # or {http: 2}: reserved port labels (count per label)
        min_failed: 1             # completion policy (default 1; null = never fails the job)
      worker:
        group: workers
        instances: 2
        launcher: plain           # torchrun | paddle | deepspeed | plain (default plain)
        script: worker.py         # relative to the code dir
        args: [--steps, 10]
        nproc_per_node: 1
        min_succeeded: 2          # the job is done once 2 workers succeeded

Env of every task (``--env-style fleet``, always set): ``FLEET_ROLE``, ``FLEET_ROLE_INDEX``,
``FLEET_ROLES`` (comma list), ``FLEET_ROLE_COUNT_<role>``, ``FLEET_TASK_INDEX`` /
``FLEET_TASK_COUNT``, ``FLEET_HOST_IP_<role>_<idx>``, ``FLEET_HOSTS_<role>`` (comma list),
``FLEET_PORT_<role>_<idx>_<label>`` (comma list when a label reserves several ports) and the
task's own ``FLEET_PORT_<label>``. Within a role, the launcher variables (``MASTER_ADDR``,
``NODE_RANK``, ``WORLD_SIZE``, ``RANK``…) describe that role's own world, so a torchrun role
is a self-contained DDP job; a torchrun/paddle/deepspeed role reserves a ``master`` port on its
task 0 for its rendezvous.

``--env-style pai`` adds OpenPAI's names (protocol v2 "environment variables and port
reservation", plus the kube-runtime ones): ``PAI_JOB_NAME``, ``PAI_USER_NAME``,
``PAI_DEFAULT_FS_URI`` (empty), ``PAI_TASK_ROLE_COUNT``, ``PAI_TASK_ROLE_LIST``,
``PAI_TASK_ROLE_TASK_COUNT_<role>``, ``PAI_HOST_IP_<role>_<idx>``,
``PAI_PORT_LIST_<role>_<idx>_<label>``, ``PAI_<role>_<idx>_<label>_PORT``,
``PAI_TASK_ROLE_<role>_HOST_LIST``, ``PAI_MIN_FAILED_TASK_COUNT_<role>``,
``PAI_MIN_SUCCEEDED_TASK_COUNT_<role>``, ``PAI_CURRENT_TASK_ROLE_NAME``,
``PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX``, ``PAI_TASK_INDEX``, ``PAI_TASK_ROLE_INDEX``.
(``PAI_RESOURCE_<role>`` is not set: fleetctl does not allocate CPU/memory.)

Completion policy (FrameworkController semantics): a role fails the job once ``min_failed`` of its
tasks failed (default 1; ``null``/-1: never); a role with ``min_succeeded`` ends the job as
succeeded once that many of its tasks succeeded — the others (servers still up) are then
stopped cleanly. Otherwise the job ends when every task ended.

Paddle parameter-server mode (``launcher: paddle-ps``): exactly two roles, ``server`` and
``worker`` (or ``trainer``); every task runs ``python -m paddle.distributed.launch
--servers=<ip:port,…> --trainers=<ip:port,…> --host=<own ip>`` with the job-level script (paddle
3.x names the worker list ``--trainers``; legacy fleetrun called it ``--workers``). Ports are
reserved per task (label ``paddle``; ``gloo`` on server 0 for paddle's gloo HTTP store).

Free ports: :func:`candidate_ports` proposes a deterministic window per host (below Linux's
ephemeral range, so the kernel never hands them to outgoing connections meanwhile), the node
answers which are bindable (a one-shot bind test, ``fleetctl.job.rolejob``), and
:func:`assign_ports` hands them out — tasks on one host never share a port.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fleetctl.errors import PlanError, UsageError
from fleetctl.node import Node
from fleetctl.plan.launchers import LAUNCHER_NAMES
from fleetctl.plan.rankplan import ENV_KEY_RE, JobSpec, NodeFacts, NodePlan, Plan, make_plan

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
LABEL_RE = re.compile(r"^[A-Za-z0-9_]{1,32}$")
ENV_STYLES = ("fleet", "pai")
ROLE_LAUNCHERS = (*LAUNCHER_NAMES, "command")
JOB_LAUNCHERS = ("roles", "paddle-ps")
MULTI_NODE_LAUNCHERS = frozenset({"torchrun", "paddle", "deepspeed"})
MASTER_LABEL = "master"
PADDLE_LABEL = "paddle"
GLOO_LABEL = "gloo"
PORT_LO, PORT_HI = 20000, 32767  # below the default ephemeral range (32768-60999)
COMMAND_SCRIPT = "command"  # stand-in script name for command roles while planning

_ROLE_KEYS = frozenset(
    {
        "group",
        "instances",
        "command",
        "launcher",
        "script",
        "args",
        "ports",
        "env",
        "nproc_per_node",
        "min_failed",
        "min_succeeded",
        "backend",
    }
)
_JOB_KEYS = frozenset(
    {"name", "env_style", "launcher", "script", "args", "env", "retry", "roles", "backend"}
)
_RETRY_KEYS = frozenset({"max_retries", "retry_on", "no_retry_on", "backoff", "backoff_max"})


# ------------------------------------------------------------------------------- job file


@dataclass(frozen=True)
class RoleSpec:
    """One task role of the job file. ``command`` (argv) or ``script`` (+launcher), not both."""

    name: str
    group: str | None = None  # None: the role name when it is a group, else "all"
    instances: int | None = None  # None: every free host of the group
    launcher: str = "plain"  # "command" when ``command`` is given
    script: str | None = None
    args: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    ports: tuple[tuple[str, int], ...] = ()  # (label, count) in file order
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    nproc_per_node: int | str = "auto"
    min_failed: int | None = 1  # None: never fails the job
    min_succeeded: int | None = None
    backend: str | None = None
    where: str = ""  # "job.yml:12" — for messages


@dataclass(frozen=True)
class RetrySpec:
    """The job file's ``retry:`` block (the CLI adds to / overrides it)."""

    max_retries: int | None = None
    retry_on: tuple[str, ...] = ()
    no_retry_on: tuple[str, ...] = ()
    backoff: float | None = None
    backoff_max: float | None = None
    where: str = ""


@dataclass(frozen=True)
class JobFile:
    """A parsed ``job.yml``."""

    path: str
    roles: tuple[RoleSpec, ...]
    name: str | None = None
    env_style: str = "fleet"
    launcher: str = "roles"  # or "paddle-ps"
    script: str | None = None  # paddle-ps
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, hash=False)
    retry: RetrySpec = RetrySpec()
    backend: str | None = None

    def role(self, name: str) -> RoleSpec:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "name": self.name,
            "env_style": self.env_style,
            "launcher": self.launcher,
            "script": self.script,
            "args": list(self.args),
            "roles": [
                {
                    "name": r.name,
                    "group": r.group,
                    "instances": r.instances,
                    "launcher": r.launcher,
                    "script": r.script,
                    "args": list(r.args),
                    "command": list(r.command),
                    "ports": {label: n for label, n in r.ports},
                    "min_failed": r.min_failed,
                    "min_succeeded": r.min_succeeded,
                }
                for r in self.roles
            ],
        }


class _Map(dict):
    """A YAML mapping that remembers its line and each key's line (1-based)."""

    line: int = 0
    key_lines: dict[Any, int]


class _List(list):
    line: int = 0
    item_lines: list[int]


def _load_located(text: str, path: str) -> Any:
    """YAML → Python values whose mappings/lists know their source lines. Raises UsageError."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UsageError(f"{path}:{line}: invalid YAML: {problem}") from e
    if root is None:
        raise UsageError(f"{path}:1: job file is empty")
    constructor = yaml.SafeLoader("")

    def conv(node: Any) -> Any:
        if isinstance(node, yaml.MappingNode):
            out = _Map()
            out.line = node.start_mark.line + 1
            out.key_lines = {}
            for k, v in node.value:
                key = conv(k)
                if isinstance(key, (dict, list)):
                    raise UsageError(f"{path}:{k.start_mark.line + 1}: keys must be plain")
                if key in out:
                    raise UsageError(f"{path}:{k.start_mark.line + 1}: duplicate key {key!r}")
                out[key] = conv(v)
                out.key_lines[key] = k.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            lst = _List(conv(v) for v in node.value)
            lst.line = node.start_mark.line + 1
            lst.item_lines = [v.start_mark.line + 1 for v in node.value]
            return lst
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.YAMLError as e:
            raise UsageError(f"{path}:{node.start_mark.line + 1}: {e}") from e

    return conv(root)


def load_job_file(path: str, text: str | None = None) -> JobFile:
    """Read and validate a job file. Every error is one line naming ``path:line``."""
    if text is None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise UsageError(f"{path}: cannot read job file: {e.strerror or e}") from e
    return parse_job_file(text, path)


def parse_job_file(text: str, path: str = "job.yml") -> JobFile:
    """Validate job-file text (see the module doc). Raises UsageError naming ``path:line``."""
    data = _load_located(text, path)
    if not isinstance(data, _Map):
        raise UsageError(f"{path}:1: a job file is a mapping with a 'roles:' key")

    def at(m: _Map, key: Any = None) -> str:
        return f"{path}:{m.key_lines.get(key, m.line) if key is not None else m.line}"

    for key in data:
        if key not in _JOB_KEYS:
            raise UsageError(f"{at(data, key)}: unknown key {key!r} (known: {_known(_JOB_KEYS)})")
    env_style = _str(data, "env_style", at, default="fleet")
    if env_style not in ENV_STYLES:
        raise UsageError(f"{at(data, 'env_style')}: env_style must be one of {ENV_STYLES}")
    launcher = _str(data, "launcher", at, default="roles")
    if launcher not in JOB_LAUNCHERS:
        raise UsageError(
            f"{at(data, 'launcher')}: job launcher must be one of {', '.join(JOB_LAUNCHERS)} "
            "(a role's own launcher goes under the role)"
        )
    roles_raw = data.get("roles")
    if not isinstance(roles_raw, _Map) or not roles_raw:
        raise UsageError(f"{at(data, 'roles')}: 'roles:' must map role names to their settings")
    roles = tuple(_parse_role(name, roles_raw, path) for name in roles_raw)
    job_env = _env(data, "env", at)
    retry = _parse_retry(data, path, at)
    script = _str(data, "script", at, default=None)
    args = _args(data, "args", at)
    if launcher == "paddle-ps":
        _check_paddle_ps(roles, script, at(data, "launcher"), at(data, "roles"))
    elif script is not None or args:
        raise UsageError(
            f"{at(data, 'script' if script is not None else 'args')}: a job-level script/args "
            "is only for launcher: paddle-ps; give each role its own"
        )
    else:
        for r in roles:
            if not r.command and not r.script:
                raise UsageError(f"{r.where}: role {r.name!r} needs a command or a script")
    return JobFile(
        path=path,
        roles=roles,
        name=_str(data, "name", at, default=None),
        env_style=env_style,
        launcher=launcher,
        script=script,
        args=args,
        env=job_env,
        retry=retry,
        backend=_str(data, "backend", at, default=None),
    )


def _known(keys: frozenset[str]) -> str:
    return ", ".join(sorted(keys))


def _str(m: _Map, key: str, at: Any, *, default: str | None) -> Any:
    if key not in m or m[key] is None:
        return default
    v = m[key]
    if not isinstance(v, str) or not v.strip():
        raise UsageError(f"{at(m, key)}: {key} must be a non-empty string")
    return v.strip()


def _int(m: _Map, key: str, at: Any, *, default: int | None, low: int, null_ok: bool) -> Any:
    if key not in m:
        return default
    v = m[key]
    if v is None or (null_ok and v == -1):
        if null_ok:
            return None
        raise UsageError(f"{at(m, key)}: {key} must be an integer")
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise UsageError(f"{at(m, key)}: {key} must be an integer >= {low}, got {v!r}")
    return v


def _args(m: _Map, key: str, at: Any) -> tuple[str, ...]:
    v = m.get(key)
    if v is None:
        return ()
    if not isinstance(v, list):
        raise UsageError(f"{at(m, key)}: {key} must be a list (each item one argument)")
    for item in v:
        if isinstance(item, (dict, list)):
            raise UsageError(f"{at(m, key)}: {key} items must be plain values")
    return tuple("" if a is None else str(a).lower() if isinstance(a, bool) else str(a) for a in v)


def _env(m: _Map, key: str, at: Any) -> dict[str, str]:
    v = m.get(key)
    if v is None:
        return {}
    if not isinstance(v, _Map):
        raise UsageError(f"{at(m, key)}: {key} must map NAME: value")
    out: dict[str, str] = {}
    for k, val in v.items():
        where = f"{at(v, k)}"
        if not isinstance(k, str) or not ENV_KEY_RE.match(k):
            raise UsageError(f"{where}: invalid environment variable name {k!r}")
        if k.startswith(("FLEET_", "PAI_")):
            raise UsageError(f"{where}: {k}: FLEET_* and PAI_* are set by fleetctl")
        if isinstance(val, (dict, list)):
            raise UsageError(f"{where}: value of {k} must be a plain value")
        out[k] = "" if val is None else str(val)
    return out


def _parse_role(name: Any, roles: _Map, path: str) -> RoleSpec:
    line = roles.key_lines.get(name, roles.line)
    where = f"{path}:{line}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise UsageError(
            f"{where}: role name {name!r} must be letters, digits and '_' (it is part of env "
            "variable names)"
        )
    m = roles[name]
    if not isinstance(m, _Map):
        raise UsageError(f"{where}: role {name!r} must be a mapping of settings")

    def at(mm: _Map, key: Any = None) -> str:
        return f"{path}:{mm.key_lines.get(key, mm.line) if key is not None else mm.line}"

    for key in m:
        if key not in _ROLE_KEYS:
            raise UsageError(
                f"{at(m, key)}: unknown role key {key!r} (known: {_known(_ROLE_KEYS)})"
            )
    command: tuple[str, ...] = ()
    if "command" in m and m["command"] is not None:
        c = m["command"]
        if isinstance(c, str) and c.strip():
            command = ("sh", "-c", c)
        elif isinstance(c, list) and c and all(not isinstance(a, (dict, list)) for a in c):
            command = tuple(str(a) for a in c)
        else:
            raise UsageError(
                f"{at(m, 'command')}: command must be a shell string or a non-empty argv list"
            )
    script = _str(m, "script", at, default=None)
    launcher = _str(m, "launcher", at, default=None)
    if command and (script or launcher not in (None, "command")):
        raise UsageError(f"{at(m, 'command')}: role {name!r}: give command or script+launcher")
    if command:
        launcher = "command"
        if m.get("args"):
            raise UsageError(f"{at(m, 'args')}: args go into the command itself")
    else:
        launcher = launcher or "plain"
        if launcher not in LAUNCHER_NAMES:
            raise UsageError(
                f"{at(m, 'launcher')}: unknown launcher {launcher!r} "
                f"(known: {', '.join(LAUNCHER_NAMES)})"
            )
    ports = _ports(m, at)
    if launcher in MULTI_NODE_LAUNCHERS and MASTER_LABEL not in dict(ports):
        ports = (*ports, (MASTER_LABEL, 1))
    nproc: int | str = "auto"
    if "nproc_per_node" in m:
        v = m["nproc_per_node"]
        if v == "auto":
            nproc = "auto"
        else:
            nproc = _int(m, "nproc_per_node", at, default=None, low=1, null_ok=False)
    min_failed = _int(m, "min_failed", at, default=1, low=1, null_ok=True)
    min_succeeded = _int(m, "min_succeeded", at, default=None, low=1, null_ok=True)
    instances = _int(m, "instances", at, default=None, low=1, null_ok=False)
    if min_succeeded is not None and instances is not None and min_succeeded > instances:
        raise UsageError(
            f"{at(m, 'min_succeeded')}: min_succeeded {min_succeeded} > instances {instances}"
        )
    return RoleSpec(
        name=name,
        group=_str(m, "group", at, default=None),
        instances=instances,
        launcher=launcher,
        script=script,
        args=_args(m, "args", at),
        command=command,
        ports=ports,
        env=_env(m, "env", at),
        nproc_per_node=nproc,
        min_failed=min_failed,
        min_succeeded=min_succeeded,
        backend=_str(m, "backend", at, default=None),
        where=where,
    )


def _ports(m: _Map, at: Any) -> tuple[tuple[str, int], ...]:
    v = m.get("ports")
    if v is None:
        return ()
    items: list[tuple[Any, Any, str]] = []
    if isinstance(v, _List):
        items = [(label, 1, f"{at(m, 'ports')}") for label in v]
    elif isinstance(v, _Map):
        items = [(label, n, at(v, label)) for label, n in v.items()]
    else:
        raise UsageError(f"{at(m, 'ports')}: ports must be a list of labels or label: count")
    out: list[tuple[str, int]] = []
    for label, n, where in items:
        if not isinstance(label, str) or not LABEL_RE.match(label):
            raise UsageError(f"{where}: port label {label!r} must be letters, digits and '_'")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
            raise UsageError(f"{where}: port count for {label!r} must be 1-64, got {n!r}")
        if label in dict(out):
            raise UsageError(f"{where}: port label {label!r} given twice")
        out.append((label, n))
    return tuple(out)


def _parse_retry(data: _Map, path: str, at: Any) -> RetrySpec:
    r = data.get("retry")
    if r is None:
        return RetrySpec()
    if not isinstance(r, _Map):
        raise UsageError(f"{at(data, 'retry')}: retry must be a mapping")
    for key in r:
        if key not in _RETRY_KEYS:
            raise UsageError(
                f"{at(r, key)}: unknown retry key {key!r} (known: {_known(_RETRY_KEYS)})"
            )

    def rules(key: str) -> tuple[str, ...]:
        v = r.get(key)
        if v is None:
            return ()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, (str, int)) for x in v):
            raise UsageError(f"{at(r, key)}: {key} must be a list of rules")
        from fleetctl.job.retry import parse_rule

        for i, x in enumerate(v):
            line = r.key_lines.get(key, r.line)
            if isinstance(v, _List) and i < len(v.item_lines):
                line = v.item_lines[i]
            try:
                parse_rule(str(x), "retry", source=f"{path}:{line}")
            except UsageError as e:
                raise UsageError(f"{path}:{line}: {e}") from e
        return tuple(str(x) for x in v)

    def number(key: str) -> float | None:
        v = r.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise UsageError(f"{at(r, key)}: {key} must be a number of seconds >= 0")
        return float(v)

    return RetrySpec(
        max_retries=_int(r, "max_retries", at, default=None, low=0, null_ok=False),
        retry_on=rules("retry_on"),
        no_retry_on=rules("no_retry_on"),
        backoff=number("backoff"),
        backoff_max=number("backoff_max"),
        where=at(data, "retry"),
    )


PADDLE_SERVER_ROLES = ("server",)
PADDLE_TRAINER_ROLES = ("worker", "trainer")


def _check_paddle_ps(
    roles: Sequence[RoleSpec], script: str | None, where: str, rwhere: str
) -> None:
    names = sorted(r.name for r in roles)
    if len(roles) != 2 or not (
        set(names) & set(PADDLE_SERVER_ROLES) and set(names) & set(PADDLE_TRAINER_ROLES)
    ):
        raise UsageError(
            f"{rwhere}: launcher paddle-ps needs exactly two roles, 'server' and 'worker' "
            f"(or 'trainer'), got {', '.join(names)}"
        )
    if not script:
        raise UsageError(f"{where}: launcher paddle-ps needs a job-level script")
    for r in roles:
        if r.command or r.script or r.launcher not in ("plain",):
            raise UsageError(
                f"{r.where}: under paddle-ps a role only picks hosts (group, instances, ports)"
            )


# ----------------------------------------------------------------------------- task layout


@dataclass(frozen=True)
class Task:
    """One task: ``role`` index ``index`` on ``node``; ``rank`` is its place in the job."""

    role: str
    index: int
    node: Node
    rank: int


def assign_tasks(
    job: JobFile, nodes: Sequence[Node], groups: Mapping[str, Sequence[str]]
) -> list[Task]:
    """Hosts for every role, in role order then group order; one task per host.

    A role takes the first ``instances`` hosts of its group (default: the role's name when that
    is a group, else ``all``) that no earlier role took. PlanError if a group is short.
    """
    by_name = {n.name: n for n in nodes}
    used: set[str] = set()
    tasks: list[Task] = []
    for role in job.roles:
        group = role.group or (role.name if role.name in groups else "all")
        if group == "all" and "all" not in groups:
            members: Sequence[str] = [n.name for n in nodes]
        elif group not in groups:
            known = ", ".join(sorted(g for g in groups if g != "ungrouped"))
            raise PlanError(
                f"{role.where}: role {role.name!r}: no inventory group {group!r} in the "
                f"selection (groups: {known})"
            )
        else:
            members = groups[group]
        free = [h for h in members if h in by_name and h not in used]
        want = role.instances if role.instances is not None else len(free)
        if want == 0 or len(free) < want:
            taken = [h for h in members if h in used]
            extra = f"; {', '.join(taken)} already run other roles" if taken else ""
            raise PlanError(
                f"{role.where}: role {role.name!r} needs {want or 1} host(s) of group "
                f"{group!r} but {len(free)} are free{extra} (one task per host)"
            )
        for i, host in enumerate(free[:want]):
            used.add(host)
            tasks.append(Task(role.name, i, by_name[host], len(tasks)))
    if job.launcher != "paddle-ps":
        for role in job.roles:
            if role.min_succeeded is not None:
                n = sum(1 for t in tasks if t.role == role.name)
                if role.min_succeeded > n:
                    raise PlanError(
                        f"{role.where}: min_succeeded {role.min_succeeded} > {n} task(s) of "
                        f"role {role.name!r}"
                    )
    return tasks


def role_nodes(tasks: Sequence[Task]) -> list[Node]:
    """The job's node list (rank order = task order)."""
    return [t.node for t in tasks]


# ------------------------------------------------------------------------------------ ports


def port_needs(job: JobFile, tasks: Sequence[Task]) -> dict[tuple[str, int], list[tuple[str, int]]]:
    """(role, index) -> [(label, count)] every task must reserve (paddle-ps labels added)."""
    needs: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for t in tasks:
        labels = list(job.role(t.role).ports)
        if job.launcher == "paddle-ps":
            if PADDLE_LABEL not in dict(labels):
                labels.append((PADDLE_LABEL, 1))
            if t.role in PADDLE_SERVER_ROLES and t.index == 0 and GLOO_LABEL not in dict(labels):
                labels.append((GLOO_LABEL, 1))
        needs[(t.role, t.index)] = labels
    return needs


def ports_per_host(
    tasks: Sequence[Task], needs: Mapping[tuple[str, int], Sequence[tuple[str, int]]]
) -> dict[str, int]:
    """How many free ports each host must find."""
    out: dict[str, int] = {}
    for t in tasks:
        out[t.node.name] = out.get(t.node.name, 0) + sum(n for _, n in needs[(t.role, t.index)])
    return out


def candidate_ports(job_id: str, host: str, count: int, *, spare: int = 16) -> list[int]:
    """``count + spare`` distinct ports to try on ``host``: a window starting at a point hashed
    from (job id, host) inside [PORT_LO, PORT_HI], wrapping. Deterministic, spreads jobs apart."""
    span = PORT_HI - PORT_LO + 1
    n = min(span, max(0, count) + spare)
    start = int.from_bytes(hashlib.sha256(f"{job_id}\0{host}".encode()).digest()[:4], "big")
    return [PORT_LO + (start + i) % span for i in range(n)]


def assign_ports(
    tasks: Sequence[Task],
    needs: Mapping[tuple[str, int], Sequence[tuple[str, int]]],
    free: Mapping[str, Sequence[int]],
) -> dict[tuple[str, int], dict[str, list[int]]]:
    """Hand each task its labelled ports from its host's free list, in task order.

    Tasks sharing a host never get the same port. PlanError naming the host when short.
    """
    left = {h: list(dict.fromkeys(ports)) for h, ports in free.items()}
    out: dict[tuple[str, int], dict[str, list[int]]] = {}
    for t in tasks:
        got: dict[str, list[int]] = {}
        pool = left.get(t.node.name, [])
        for label, n in needs[(t.role, t.index)]:
            if len(pool) < n:
                raise PlanError(
                    f"{t.node.name}: not enough free ports for {t.role}[{t.index}] "
                    f"label {label!r} (needed {n})"
                )
            got[label], pool[:] = pool[:n], pool[n:]
        out[(t.role, t.index)] = got
    return out


# -------------------------------------------------------------------------------------- env


def task_env(
    job: JobFile,
    tasks: Sequence[Task],
    addrs: Mapping[str, str],
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    task: Task,
    *,
    env_style: str | None = None,
    job_name: str = "",
    user: str = "",
) -> dict[str, str]:
    """The role variables of one task (see the module doc); ``addrs``: host -> training IP."""
    style = env_style or job.env_style
    roles = [r.name for r in job.roles]
    by_role: dict[str, list[Task]] = {r: [t for t in tasks if t.role == r] for r in roles}
    env: dict[str, str] = {
        "FLEET_ROLE": task.role,
        "FLEET_ROLE_INDEX": str(task.index),
        "FLEET_ROLES": ",".join(roles),
        "FLEET_TASK_INDEX": str(task.rank),
        "FLEET_TASK_COUNT": str(len(tasks)),
    }
    for r in roles:
        env[f"FLEET_ROLE_COUNT_{r}"] = str(len(by_role[r]))
        env[f"FLEET_HOSTS_{r}"] = ",".join(addrs[t.node.name] for t in by_role[r])
        for t in by_role[r]:
            env[f"FLEET_HOST_IP_{r}_{t.index}"] = addrs[t.node.name]
            for label, plist in ports.get((r, t.index), {}).items():
                env[f"FLEET_PORT_{r}_{t.index}_{label}"] = ",".join(str(p) for p in plist)
    for label, plist in ports.get((task.role, task.index), {}).items():
        env[f"FLEET_PORT_{label}"] = ",".join(str(p) for p in plist)
    if style == "pai":
        env.update(_pai_env(job, by_role, addrs, ports, task, job_name=job_name, user=user))
    return env


def _pai_env(
    job: JobFile,
    by_role: Mapping[str, Sequence[Task]],
    addrs: Mapping[str, str],
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    task: Task,
    *,
    job_name: str,
    user: str,
) -> dict[str, str]:
    roles = list(by_role)
    env = {
        "PAI_JOB_NAME": job_name,
        "PAI_USER_NAME": user,
        "PAI_DEFAULT_FS_URI": "",
        "PAI_TASK_ROLE_COUNT": str(len(roles)),
        "PAI_TASK_ROLE_LIST": ",".join(roles),
        "PAI_CURRENT_TASK_ROLE_NAME": task.role,
        "PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX": str(task.index),
        "PAI_TASK_INDEX": str(task.index),
        "PAI_TASK_ROLE_INDEX": str(roles.index(task.role)),
    }
    for r in roles:
        spec = job.role(r)
        env[f"PAI_TASK_ROLE_TASK_COUNT_{r}"] = str(len(by_role[r]))
        env[f"PAI_TASK_ROLE_{r}_HOST_LIST"] = ",".join(addrs[t.node.name] for t in by_role[r])
        env[f"PAI_MIN_FAILED_TASK_COUNT_{r}"] = str(
            spec.min_failed if spec.min_failed is not None else -1
        )
        env[f"PAI_MIN_SUCCEEDED_TASK_COUNT_{r}"] = str(
            spec.min_succeeded if spec.min_succeeded is not None else -1
        )
        for t in by_role[r]:
            env[f"PAI_HOST_IP_{r}_{t.index}"] = addrs[t.node.name]
            for label, plist in ports.get((r, t.index), {}).items():
                joined = ",".join(str(p) for p in plist)
                env[f"PAI_PORT_LIST_{r}_{t.index}_{label}"] = joined
                env[f"PAI_{r}_{t.index}_{label}_PORT"] = joined
    return env


# ------------------------------------------------------------------------------- role plan


@dataclass(frozen=True)
class RoleLayout:
    """What the run phase needs beyond the Plan: who runs which role, and its policy."""

    job: JobFile
    tasks: tuple[Task, ...]
    ports: dict[tuple[str, int], dict[str, list[int]]] = field(hash=False)

    def role_of(self, rank: int) -> str:
        return self.tasks[rank].role

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_file": self.job.to_dict(),
            "tasks": [
                {
                    "rank": t.rank,
                    "role": t.role,
                    "index": t.index,
                    "host": t.node.name,
                    "ports": self.ports.get((t.role, t.index), {}),
                }
                for t in self.tasks
            ],
        }


def make_role_plan(
    job: JobFile,
    tasks: Sequence[Task],
    base: JobSpec,
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    *,
    facts: Mapping[str, NodeFacts] | None = None,
    code_digest: str | None = None,
    env_style: str | None = None,
    user: str = "",
) -> Plan:
    """One Plan for the whole role job: each role planned as its own world, then merged.

    ``base`` carries the job id, created stamp, user ``--env-var``s and backend. Node ranks are
    global (task order), so ``FLEET_NODE_RANK`` is unique per task; within a role the launcher
    sees the role's own ranks. Raises PlanError.
    """
    if not tasks:
        raise PlanError("no tasks to run")
    facts = facts or {}
    addrs = {
        t.node.name: (facts.get(t.node.name) or NodeFacts()).train_addr
        or t.node.train_addr
        or t.node.address
        for t in tasks
    }
    merged: list[NodePlan | None] = [None] * len(tasks)
    if job.launcher == "paddle-ps":
        role_plans = _paddle_ps_plans(job, tasks, base, ports, addrs, facts, code_digest)
    else:
        role_plans = _role_plans(job, tasks, base, ports, facts, code_digest)
    for role_tasks, plan in role_plans:
        for t, np in zip(role_tasks, plan.nodes, strict=True):
            env = dict(np.env)
            env.update(
                task_env(
                    job,
                    tasks,
                    addrs,
                    ports,
                    t,
                    env_style=env_style,
                    job_name=job.name or base.job_id,
                    user=user,
                )
            )
            env["FLEET_NODE_RANK"] = str(t.rank)
            env["FLEET_NUM_NODES"] = str(len(tasks))
            env["FLEET_NODE_IPS"] = ",".join(addrs[x.node.name] for x in tasks)
            env.update(job.env)
            env.update(job.role(t.role).env)
            env.update(base.env)
            np2 = replace(np, node_rank=t.rank, env=env)
            if job.role(t.role).launcher == "command":
                np2 = replace(
                    np2,
                    argv=job.role(t.role).command,
                    cwd=np2.code_dir,
                    env={**env, "FLEET_LAUNCHER": "command", "FLEET_CODE_DIR": "."},
                )
            merged[t.rank] = np2
    nodes = tuple(n for n in merged if n is not None)
    first = role_plans[0][1]
    return Plan(
        job_id=base.job_id,
        launcher=job.launcher,
        script=job.script or job.name or "roles",
        args=job.args,
        master_addr=first.master_addr,
        master_port=first.master_port,
        ips=tuple(addrs[t.node.name] for t in tasks),
        nnodes=len(tasks),
        nproc_per_node=max(p.nproc_per_node for _, p in role_plans),
        gpus_per_node=max(p.gpus_per_node for _, p in role_plans),
        world_size=sum(p.world_size for _, p in role_plans),
        nodes=nodes,
        user_env=dict(base.env),
        backend=base.backend,
        created=base.created,
    )


def _role_plans(
    job: JobFile,
    tasks: Sequence[Task],
    base: JobSpec,
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    facts: Mapping[str, NodeFacts],
    code_digest: str | None,
) -> list[tuple[list[Task], Plan]]:
    out = []
    for role in job.roles:
        rtasks = [t for t in tasks if t.role == role.name]
        if not rtasks:
            continue
        command = role.launcher == "command"
        master = ports.get((role.name, 0), {}).get(MASTER_LABEL)
        spec = JobSpec(
            script=COMMAND_SCRIPT if command else str(role.script),
            job_id=base.job_id,
            args=() if command else role.args,
            launcher="plain" if command else role.launcher,
            nproc_per_node=1 if command else role.nproc_per_node,
            master_port=int(master[0]) if master else base.master_port,
            env={},
            backend=role.backend or job.backend or base.backend,
            created=base.created,
        )
        try:
            plan = make_plan([t.node for t in rtasks], spec, facts or None, code_digest=code_digest)
        except PlanError as e:
            raise PlanError(f"role {role.name!r}: {e}") from e
        out.append((rtasks, plan))
    return out


def _paddle_ps_plans(
    job: JobFile,
    tasks: Sequence[Task],
    base: JobSpec,
    ports: Mapping[tuple[str, int], Mapping[str, Sequence[int]]],
    addrs: Mapping[str, str],
    facts: Mapping[str, NodeFacts],
    code_digest: str | None,
) -> list[tuple[list[Task], Plan]]:
    """Every task runs paddle's launcher in PS mode with the same --servers/--trainers lists."""
    from fleetctl.plan.launchers.base import python_path, script_path

    servers = [t for t in tasks if t.role in PADDLE_SERVER_ROLES]
    trainers = [t for t in tasks if t.role in PADDLE_TRAINER_ROLES]
    for t in tasks:
        a = addrs[t.node.name]
        if "." not in a or ":" in a:
            raise PlanError(
                f"{t.node.name}: training address {a!r} is not a dotted IPv4 address; paddle "
                "ignores --host without a dot (set fleetctl_addr or fleetctl_nic)"
            )
    # paddle picks a node's endpoints with str.startswith(node_ip): 10.0.0.1 would also claim
    # 10.0.0.12's endpoints. Refuse such address sets instead of mis-assigning roles.
    ips = sorted(set(addrs.values()))
    for a in ips:
        for b in ips:
            if a != b and b.startswith(a):
                raise PlanError(
                    f"paddle-ps: address {a} is a prefix of {b}; paddle would assign {b}'s "
                    "endpoints to the node with {a} (use addresses that are not prefixes)"
                )

    def ep(t: Task) -> str:
        return f"{addrs[t.node.name]}:{ports[(t.role, t.index)][PADDLE_LABEL][0]}"

    server_eps = ",".join(ep(t) for t in servers)
    trainer_eps = ",".join(ep(t) for t in trainers)
    gloo = ports[(servers[0].role, 0)][GLOO_LABEL][0]
    spec = JobSpec(
        script=str(job.script),
        job_id=base.job_id,
        args=job.args,
        launcher="plain",
        nproc_per_node=1,
        master_port=int(gloo),
        env={},
        backend=job.backend or base.backend,
        created=base.created,
    )
    plan = make_plan([t.node for t in tasks], spec, facts or None, code_digest=code_digest)
    nodes = []
    for t, np in zip(tasks, plan.nodes, strict=True):
        argv = (
            python_path(np),
            "-m",
            "paddle.distributed.launch",
            f"--servers={server_eps}",
            f"--trainers={trainer_eps}",
            f"--host={addrs[t.node.name]}",
            f"--gloo_port={gloo}",
            f"--job_id={base.job_id}",
            "--log_dir=log",
            script_path(np, str(job.script)),
            *job.args,
        )
        env = {k: v for k, v in np.env.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
        env["FLEET_LAUNCHER"] = "paddle-ps"
        nodes.append(replace(np, argv=argv, env=env))
    return [(list(tasks), replace(plan, nodes=tuple(nodes), launcher="paddle-ps"))]


# ------------------------------------------------------------------------- completion policy


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


def split_command(text: str) -> tuple[str, ...]:
    """``shlex.split`` for CLI command strings (UsageError on bad quoting)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise UsageError(f"cannot split command {text!r}: {e}") from e
