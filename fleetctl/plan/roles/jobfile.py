"""The role job file (YAML), parsed and validated into :class:`JobFile`, :class:`RoleSpec`
and :class:`RetrySpec`; errors name the file, line and key.

Job file (YAML)::

    name: ps-demo                 # optional, for people
    env_style: pai                # fleet (default) | pai — ``--env-style`` wins
    launcher: paddle-ps           # optional job-level variant (fleetctl.plan.roles)
    script: train.py              # paddle-ps only: the script every task runs
    args: []
    env: {LOG_LEVEL: info}        # every task
    retry: {max_retries: 2, retry_on: ["log:NCCL timeout"], no_retry_on: ["exit:2"]}
                                  # also backoff, backoff_max (keys -> RunSpec.Retry: RETRY_KEYS)
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

Job-level ``collective:`` is ``run --collective`` from the file (the command line's flag wins):
``true`` for the defaults, or a mapping of ``size_mib`` (MiB per transfer), ``min`` (fraction of
the fleet median), ``floor`` (GB/s) and ``timeout`` (s), each optional; ``false`` is off. Each
knob is its ``--collective-*`` flag's (``api/runspec_collective.py``: one definition, the same
bounds and refusal).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl.errors import UsageError
from fleetctl.plan.launchers import LAUNCHER_NAMES, LAUNCHERS
from fleetctl.plan.retryrules import RETRY_KEYS, RetrySpec, parse_rule
from fleetctl.plan.roles.yamlfields import (
    LocatedList,
    LocatedMap,
    get_args,
    get_env,
    get_int,
    get_seconds,
    get_str,
    known,
    load_located,
)
from fleetctl.plan.userinput import MAX_BACKOFF, MAX_NPROC, MAX_RETRIES

if TYPE_CHECKING:
    from fleetctl.plan.collective import CollectiveOptions

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
LABEL_RE = re.compile(r"^[A-Za-z0-9_]{1,32}$")
ENV_STYLES = ("fleet", "pai")
ROLE_LAUNCHERS = (*LAUNCHER_NAMES, "command")
JOB_LAUNCHERS = ("roles", "paddle-ps")
# launchers that meet at a rendezvous port of their own (a role gets a "master" port for it)
MULTI_NODE_LAUNCHERS = frozenset(n for n, la in LAUNCHERS.items() if not la.one_process_per_node)
DEFAULT_ROLE_LAUNCHER = "plain"  # a role with a script and no launcher
MASTER_LABEL = "master"
PADDLE_LABEL = "paddle"
GLOO_LABEL = "gloo"
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
    {
        "name",
        "env_style",
        "launcher",
        "script",
        "args",
        "env",
        "retry",
        "roles",
        "backend",
        "timeout",
        "stall_timeout",
        "collective",
        "image",
        "container_runtime",
    }
)


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
    procs: int | str = "auto"  # its nproc_per_node (``auto``: one per GPU)
    min_failed: int | None = 1  # None: never fails the job
    min_succeeded: int | None = None
    backend: str | None = None
    where: str = ""  # "job.yml:12" — for messages


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
    retry: RetrySpec = field(default_factory=RetrySpec)
    backend: str | None = None
    timeout: float | None = None  # like `run --timeout` (the command line wins)
    stall_timeout: float | None = None  # like `run --stall-timeout`
    collective: CollectiveOptions | None = None  # like `run --collective`
    image: str | None = None  # like `run --image` (the command line wins)
    container_runtime: str | None = None  # like `run --container-runtime`

    def env_names(self, override: str | None = None) -> str:
        """The names the role env uses (fleet | pai): ``override`` (``--env-style``, the
        command line's) over this file's ``env_style``; resolved once, by the role planner."""
        return override or self.env_style

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


def load_job_file(path: str, text: str | None = None) -> JobFile:
    """Read and validate a job file. Every error is one line naming ``path:line``."""
    if text is None:
        from fleetctl.plan.userinput import read_user_file

        raw = read_user_file(path, "job file", lambda msg: UsageError(f"{path}: {msg}"))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{path}: job file is not UTF-8 text") from e
    return parse_job_file(text, path)


def parse_job_file(text: str, path: str = "job.yml") -> JobFile:
    """Validate job-file text (see the module doc). Raises UsageError naming ``path:line``."""
    data = load_located(text, path)
    if not isinstance(data, LocatedMap):
        raise UsageError(f"{path}:1: a job file is a mapping with a 'roles:' key")

    def at(m: LocatedMap, key: Any = None) -> str:
        return f"{path}:{m.key_lines.get(key, m.line) if key is not None else m.line}"

    for key in data:
        if key not in _JOB_KEYS:
            raise UsageError(f"{at(data, key)}: unknown key {key!r} (known: {known(_JOB_KEYS)})")
    env_style = get_str(data, "env_style", at, default="fleet")
    if env_style not in ENV_STYLES:
        raise UsageError(f"{at(data, 'env_style')}: env_style must be one of {ENV_STYLES}")
    launcher = get_str(data, "launcher", at, default="roles")
    if launcher not in JOB_LAUNCHERS:
        raise UsageError(
            f"{at(data, 'launcher')}: job launcher must be one of {', '.join(JOB_LAUNCHERS)} "
            "(a role's own launcher goes under the role)"
        )
    roles_raw = data.get("roles")
    if not isinstance(roles_raw, LocatedMap) or not roles_raw:
        raise UsageError(f"{at(data, 'roles')}: 'roles:' must map role names to their settings")
    roles = tuple(_parse_role(name, roles_raw, path) for name in roles_raw)
    job_env = get_env(data, "env", at)
    retry = _parse_retry(data, path, at)
    script = get_str(data, "script", at, default=None, plain=True)
    args = get_args(data, "args", at)
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
        name=get_str(data, "name", at, default=None, plain=True),
        env_style=env_style,
        launcher=launcher,
        script=script,
        args=args,
        env=job_env,
        retry=retry,
        backend=_backend(data, at),
        timeout=get_seconds(data, "timeout", at),
        stall_timeout=get_seconds(data, "stall_timeout", at),
        collective=_collective(data, at),
        image=_image(data, at),
        container_runtime=_runtime(data, at),
    )


def _image(data: LocatedMap, at: Any) -> str | None:
    """``image:``, checked at its line as ``--image`` is."""
    from fleetctl.plan.userinput import image_problem

    name = get_str(data, "image", at, default=None, plain=True)
    why = image_problem(name) if name else None
    if why:
        raise UsageError(f"{at(data, 'image')}: image: {why}")
    return name


def _backend(data: LocatedMap, at: Any) -> str | None:
    """``backend:`` (job or role), checked at its line as ``--backend`` is."""
    from fleetctl.plan.rankplan import BACKENDS

    name = get_str(data, "backend", at, default=None)
    if name is not None and name not in BACKENDS:
        raise UsageError(
            f"{at(data, 'backend')}: unknown backend {name!r} (known: {', '.join(BACKENDS)})"
        )
    return name


def _runtime(data: LocatedMap, at: Any) -> str | None:
    """The ``container_runtime:`` key: one of the runtimes fleetctl knows, or absent."""
    from fleetctl.plan.runtimes import ORDER

    name = get_str(data, "container_runtime", at, default=None, plain=True)
    if name is not None and name not in ORDER:
        raise UsageError(
            f"{at(data, 'container_runtime')}: unknown container runtime {name!r} "
            f"(known: {', '.join(ORDER)})"
        )
    return name


def _collective(data: LocatedMap, at: Any) -> CollectiveOptions | None:
    """The ``collective:`` key: ``run --collective``'s knobs, by the flags' one definition."""
    from fleetctl.api.runspec_collective import collective_of_file

    v = data.get("collective")

    def where(key: Any) -> str:
        inside = key is not None and isinstance(v, LocatedMap)
        return str(at(v, key) if inside else at(data, "collective"))

    record: CollectiveOptions | None = collective_of_file(v, where)
    return record


def _parse_role(name: Any, roles: LocatedMap, path: str) -> RoleSpec:
    line = roles.key_lines.get(name, roles.line)
    where = f"{path}:{line}"
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise UsageError(
            f"{where}: role name {name!r} must be letters, digits and '_' (it is part of env "
            "variable names)"
        )
    m = roles[name]
    if not isinstance(m, LocatedMap):
        raise UsageError(f"{where}: role {name!r} must be a mapping of settings")

    def at(mm: LocatedMap, key: Any = None) -> str:
        return f"{path}:{mm.key_lines.get(key, mm.line) if key is not None else mm.line}"

    for key in m:
        if key not in _ROLE_KEYS:
            raise UsageError(f"{at(m, key)}: unknown role key {key!r} (known: {known(_ROLE_KEYS)})")
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
    script = get_str(m, "script", at, default=None, plain=True)
    launcher = get_str(m, "launcher", at, default=None)
    if command and (script or launcher not in (None, "command")):
        raise UsageError(f"{at(m, 'command')}: role {name!r}: give command or script+launcher")
    if command:
        launcher = "command"
        if m.get("args"):
            raise UsageError(f"{at(m, 'args')}: args go into the command itself")
    else:
        launcher = launcher or DEFAULT_ROLE_LAUNCHER
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
            nproc = get_int(
                m, "nproc_per_node", at, default=None, low=1, null_ok=False, high=MAX_NPROC
            )
    min_failed = get_int(m, "min_failed", at, default=1, low=1, null_ok=True)
    min_succeeded = get_int(m, "min_succeeded", at, default=None, low=1, null_ok=True)
    instances = get_int(m, "instances", at, default=None, low=1, null_ok=False)
    if min_succeeded is not None and instances is not None and min_succeeded > instances:
        raise UsageError(
            f"{at(m, 'min_succeeded')}: min_succeeded {min_succeeded} > instances {instances}"
        )
    return RoleSpec(
        name=name,
        group=get_str(m, "group", at, default=None),
        instances=instances,
        launcher=launcher,
        script=script,
        args=get_args(m, "args", at),
        command=command,
        ports=ports,
        env=get_env(m, "env", at),
        procs=nproc,
        min_failed=min_failed,
        min_succeeded=min_succeeded,
        backend=_backend(m, at),
        where=where,
    )


def _ports(m: LocatedMap, at: Any) -> tuple[tuple[str, int], ...]:
    v = m.get("ports")
    if v is None:
        return ()
    items: list[tuple[Any, Any, str]] = []
    if isinstance(v, LocatedList):
        items = [(label, 1, f"{at(m, 'ports')}") for label in v]
    elif isinstance(v, LocatedMap):
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


def _parse_retry(data: LocatedMap, path: str, at: Any) -> RetrySpec:
    r = data.get("retry")
    if r is None:
        return RetrySpec()
    if not isinstance(r, LocatedMap):
        raise UsageError(f"{at(data, 'retry')}: retry must be a mapping")
    for key in r:
        if key not in RETRY_KEYS:
            raise UsageError(
                f"{at(r, key)}: unknown retry key {key!r} (known: {known(RETRY_KEYS)})"
            )

    def rules(key: str) -> tuple[str, ...]:
        v = r.get(key)
        if v is None:
            return ()
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, (str, int)) for x in v):
            raise UsageError(f"{at(r, key)}: {key} must be a list of rules")
        for i, x in enumerate(v):
            line = r.key_lines.get(key, r.line)
            if isinstance(v, LocatedList) and i < len(v.item_lines):
                line = v.item_lines[i]
            try:
                parse_rule(str(x), "retry", source=f"{path}:{line}")
            except UsageError as e:
                raise UsageError(f"{path}:{line}: {e}") from e
        return tuple(str(x) for x in v)

    def number(key: str) -> float | None:
        return get_seconds(r, key, at, low=0.0, high=MAX_BACKOFF)  # --retry-backoff's bounds

    values = {
        "max_retries": get_int(
            r, "max_retries", at, default=None, low=0, null_ok=False, high=MAX_RETRIES
        ),
        "retry_on": rules("retry_on"),
        "no_retry_on": rules("no_retry_on"),
        "backoff": number("backoff"),
        "backoff_max": number("backoff_max"),
    }
    return RetrySpec(**{RETRY_KEYS[k]: v for k, v in values.items()}, where=at(data, "retry"))


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
        if r.command or r.script or r.launcher != DEFAULT_ROLE_LAUNCHER:
            raise UsageError(
                f"{r.where}: under paddle-ps a role only picks hosts (group, instances, ports)"
            )


def split_command(text: str) -> tuple[str, ...]:
    """``shlex.split`` for CLI command strings (UsageError on bad quoting)."""
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise UsageError(f"cannot split command {text!r}: {e}") from e
