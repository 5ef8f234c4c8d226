"""``fleetctl run --before fabfile.py:prepare``: a Fabric task run on every node of the job
after the check and the push, before the plan and the launch.

The task is called once per node with that node's ``fabric.Connection`` (from
``Fleet.group()``: the run's users, keys, jump hosts and host-key rules), the nodes in
parallel, as ``fab -H a,b,c prepare`` calls it per host. A task that raises on any node stops
the run before launch (``FleetError``, exit 3) naming each failing host. The fabfile is loaded
(its code runs) when the option is read, so a missing file or task is a usage error (exit 2)
before any node is reached. fabric is imported only when a task runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import shlex
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fleetctl.errors import FleetError, UsageError

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings

DEFAULT_TIMEOUT = 3600.0  # s for the task on every node; then the run stops before launch
MAX_PARALLEL = 64  # nodes the task runs on at once
STOP_GRACE = 2.0  # s between SIGTERM and SIGKILL for what a stopped task started
STOP_WAIT = 30.0  # s for the stop on a node, and then for the stopped tasks to return


@dataclass(frozen=True)
class BeforeTask:
    """A loaded task, called with the job's nodes and settings (``RunOptions.before_launch``)."""

    spec: str  # as given: "fabfile.py:prepare"
    func: Callable[..., Any]
    timeout: float = DEFAULT_TIMEOUT

    def __call__(self, nodes: Sequence[Node], settings: SSHSettings | None) -> None:
        run_task(self, nodes, settings)


#: Fabric 1's modules, gone in Fabric 2: a fabfile importing them was written for Fabric 1
FABRIC1_MODULES = frozenset(
    {
        "fabric.api",
        "fabric.operations",
        "fabric.context_managers",
        "fabric.contrib",
        "fabric.contrib.files",
        "fabric.contrib.project",
        "fabric.decorators",
        "fabric.state",
        "fabric.colors",
        "fabric.network",
        "fabric.utils",
    }
)


def load_task(spec: str, timeout: float = DEFAULT_TIMEOUT) -> BeforeTask:
    """``FILE:TASK`` → the task; UsageError (one line) when the file or task is not there."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name:
        raise UsageError(f"--before {spec!r}: expected FILE:TASK (e.g. fabfile.py:prepare)")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise UsageError(f"--before {spec}: no such file {path}")
    module = _load_module(path, spec)
    func = _find(module, name)
    if func is None:
        raise UsageError(f"--before {spec}: {path} has no task {name!r}")
    return BeforeTask(spec, func, timeout)


def _load_module(path: Path, spec: str) -> Any:
    """The fabfile as a module (its folder first on sys.path while it loads, as fab does)."""
    full = path.resolve()
    mod_name = "fleetctl_before_" + hashlib.sha256(str(full).encode()).hexdigest()[:12]
    found = importlib.util.spec_from_file_location(mod_name, full)
    if found is None or found.loader is None:
        raise UsageError(f"--before {spec}: {path} is not a Python file")
    module = importlib.util.module_from_spec(found)
    folder = str(full.parent)
    sys.path.insert(0, folder)
    try:
        found.loader.exec_module(module)
    except Exception as e:
        why = " ".join(f"{type(e).__name__}: {e}".split())
        if isinstance(e, ImportError) and e.name in FABRIC1_MODULES:
            why += (
                " (a Fabric 1 fabfile: --before runs Fabric >= 2 tasks, "
                "`@task def prepare(c): c.run(...)` with `from fabric import task`)"
            )
        raise UsageError(f"--before {spec}: cannot load {path}: {why}") from e
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def _find(module: Any, name: str) -> Callable[..., Any] | None:
    """A module-level task (``@task`` or a plain function), else one of its ``ns`` Collection."""
    func: Callable[..., Any] | None = getattr(module, name, None)
    if callable(func):
        return func
    for attr in ("ns", "namespace"):
        coll = getattr(module, attr, None)
        tasks = getattr(coll, "tasks", None)
        if isinstance(tasks, dict):
            for key in (name, name.replace("_", "-")):
                task: Callable[..., Any] | None = tasks.get(key)
                if callable(task):
                    return task
    return None


def run_task(task: BeforeTask, nodes: Sequence[Node], settings: SSHSettings | None) -> None:
    """The task on every node at once (at most MAX_PARALLEL), every node's outcome kept;
    FleetError naming each node it failed on (or did not finish on within the timeout).

    Every command the task runs carries an env tag of this call (``FLEET_JOB_ID``, as a job's
    ranks do). When the task fails on a node, passes its timeout or is interrupted (Ctrl-C),
    what it started on every node is stopped by that tag (the supervisor's ``stop``): closing
    a channel would not end a command without a pty, and the other nodes' tasks end at once
    instead of running to their end."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    from fleetctl.api.group import group
    from fleetctl.job.run.beforelog import BEFORE_OUTPUT
    from fleetctl.results import FleetResult
    from fleetctl.transport.connection import SSHSettings

    settings = settings or SSHSettings()
    conns = list(group(nodes, settings))
    tag = f"before-{uuid.uuid4().hex[:12]}"
    for i, c in enumerate(conns):  # a task's own env= replaces it (invoke's rule)
        env = dict(c.config.run.get("env") or {})
        c.config.run["env"] = {**env, "FLEET_JOB_ID": tag, "FLEET_NODE_RANK": str(i)}
    sink = BEFORE_OUTPUT.get()
    streams = [_Lines(i, sink) for i in range(len(conns))] if sink is not None else []
    for c, s in zip(conns, streams, strict=False):  # what c.run/c.sudo/c.local do not hide
        c.config.run["out_stream"] = c.config.run["err_stream"] = s
    outcomes: dict[str, Any] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(conns))))
    routed = contextlib.ExitStack()
    routed.enter_context(_routing(streams))  # the tasks' own prints, until the end
    ended = False
    unstopped: dict[str, str] = {}
    try:
        futures = {
            pool.submit(_on_node, task.func, c, streams[i] if streams else None): n
            for i, (n, c) in enumerate(zip(nodes, conns, strict=True))
        }
        done, late = wait(futures, timeout=task.timeout, return_when=FIRST_EXCEPTION)
        failed_first = any(f.exception() is not None for f in done)
        if late:  # a failure (or the timeout): the others' commands are stopped, not awaited
            _refuse(conns, "stopped: the task failed on another node")
            unstopped = stop_tagged(nodes, settings, tag)
            wait(late, timeout=STOP_WAIT)
        for fut, node in futures.items():
            if fut not in late:
                err = fut.exception()
                outcomes[node.name] = err if err is not None else fut.result()
            elif failed_first and fut.done():
                err = fut.exception()
                outcomes[node.name] = Stopped() if err is not None else fut.result()
            else:
                outcomes[node.name] = TimeoutError(f"not done after {task.timeout:g} s")
        ended = True
    finally:
        if not ended:  # interrupted: what the tasks started must not outlive the run
            _refuse(conns, "stopped: the run was interrupted")
            stop_tagged(nodes, settings, tag)
        pool.shutdown(wait=False, cancel_futures=True)
        for c in conns:
            with contextlib.suppress(Exception):  # a dead link has nothing left to close
                c.close()
        routed.close()
        for s in streams:
            s.close()
    result: FleetResult[Any] = FleetResult(outcomes)
    if result.failed:
        labels = {n.name: n.label for n in nodes}
        own = {h: e for h, e in result.failed.items() if not isinstance(e, Stopped)}
        parts = [f"{labels[h]}: {describe(e)}" for h, e in own.items()]
        more = len(result.failed) - len(own)
        tail = f"; stopped on the {more} other node(s)" if more else ""
        if unstopped:
            tail += "; could not stop what it started on " + "; ".join(
                f"{labels[h]}: {why}" for h, why in unstopped.items()
            )
        raise FleetError(
            f"--before {task.spec} failed on {len(own)} of {len(nodes)} node(s): "
            + "; ".join(parts)
            + tail,
            result,
        )


def _refuse(conns: Sequence[Any], why: str) -> None:
    """No command of the tasks starts from now on; the ones in flight lose their channel."""
    for c in conns:
        c.refused = why
    for c in conns:
        with contextlib.suppress(Exception):
            c.close()


class Stopped(Exception):
    """A node's task ended because fleetctl stopped it (the task failed on another node)."""

    def __str__(self) -> str:
        return "stopped: the task failed on another node"


def stop_tagged(nodes: Sequence[Node], settings: SSHSettings, tag: str) -> dict[str, str]:
    """Stop, on every node at once, the processes the task's commands started (env tag
    ``tag``: the supervisor's ``stop``, SIGTERM then SIGKILL); the nodes it could not stop
    on, with why (a node that cannot be reached: its commands' channels are gone)."""
    from concurrent.futures import ThreadPoolExecutor

    from fleetctl import remote
    from fleetctl.api.group import connection
    from fleetctl.phases.frames import last_data

    def one(i: int, node: Node) -> str | None:
        argv = remote.cached_argv(node.python, node.workdir, "supervisor.py", "stop")
        stop = shlex.join([*argv, "--job-id", tag, "--rank", str(i), "--grace", str(STOP_GRACE)])
        try:
            with connection(node, settings) as c:
                # twice: a command whose exec request was in flight at the first scan
                line = f"{stop} >/dev/null; sleep 0.5; {stop}"
                res = c.run(line, hide=True, warn=True, timeout=STOP_WAIT)
        except Exception as e:
            return describe(e)
        data = last_data(res.stdout)
        if res.exited != 0 or not isinstance(data, dict):
            return f"stop exited {res.exited}"
        left = data.get("remaining") or []
        return f"{len(left)} process(es) left" if left else None

    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(nodes)))) as pool:
        whys = list(pool.map(one, range(len(nodes)), nodes))
    return {n.name: why for n, why in zip(nodes, whys, strict=True) if why}


class _Lines:
    """A text stream (fabric's ``out_stream``, a print's target) that hands whole lines of one
    node's output to the job's sink; a last line without its newline at ``close``."""

    def __init__(self, index: int, sink: Callable[[int, str], None]) -> None:
        self.index, self.sink = index, sink
        self._part = ""
        self._closed = False  # a task still running past the timeout: its output is dropped
        self._lock = threading.Lock()  # stdout and stderr of one command: two reader threads

    def write(self, text: str) -> int:
        with self._lock:
            if self._closed:
                return len(text)
            *lines, self._part = (self._part + text).split("\n")
            for line in lines:
                self.sink(self.index, line.rstrip("\r"))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def close(self) -> None:
        with self._lock:
            part, self._part, self._closed = self._part, "", True
        if part:
            self.sink(self.index, part)


_node = threading.local()  # the stream of the node whose task this thread runs


def _on_node(func: Callable[[Any], Any], conn: Any, stream: _Lines | None) -> Any:
    """The task on one node, its prints (this thread's) going to the node's stream."""
    _node.stream = stream
    try:
        return func(conn)
    finally:
        _node.stream = None


class _ThreadRouted:
    """sys.stdout/sys.stderr while tasks run: a task thread's writes go to its node's stream,
    every other thread's (and a write the sink itself makes) to the real one."""

    def __init__(self, real: TextIO) -> None:
        self.real = real

    def write(self, text: str) -> int:
        stream: _Lines | None = getattr(_node, "stream", None)
        if stream is None or getattr(_node, "busy", False):
            return self.real.write(text)
        _node.busy = True
        try:
            return stream.write(text)
        finally:
            _node.busy = False

    def flush(self) -> None:
        if getattr(_node, "stream", None) is None:
            self.real.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@contextlib.contextmanager
def _routing(streams: list[_Lines]) -> Any:
    if not streams:
        yield
        return
    real = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _ThreadRouted(real[0]), _ThreadRouted(real[1])
    try:
        yield
    finally:
        sys.stdout, sys.stderr = real


def describe(e: BaseException) -> str:
    """One line: a command's exit status and last stderr line, else the exception."""
    res = getattr(e, "result", None)
    if res is not None and hasattr(res, "exited"):
        tail = (getattr(res, "stderr", "") or getattr(res, "stdout", "") or "").strip()
        last = tail.splitlines()[-1] if tail else ""
        return f"`{res.command}` exited {res.exited}" + (f": {last}" if last else "")
    one = getattr(e, "one_line", None)
    text = one() if callable(one) else f"{type(e).__name__}: {e}"
    return " ".join(str(text).split()) or type(e).__name__
