"""Launch: start the node supervisor on every node at once, each as ONE streamed SSH command.

The supervisor (``fleetctl/remote/programs/supervisor.py`` and the node modules it imports) lives on
the node in ``W/bin/supervisor_<sha12>/``, imported from there so that its bytecode is cached.
The start command runs the installer's stdin entrance (``fleetctl.remote.stdin_argv``): when
the folder is missing it asks for the bundle (``U``), checks its hash, installs it atomically
and runs it — so a node costs one remote command per launch whether or not the supervisor was
there. Then the supervisor says ``R``, gets
the JSON spec on stdin and answers ``S <json>`` once the job is running.

``fleetctl.job.run.job`` starts every node at once, one thread per node (a job needs all its nodes
at once: the fan-out is never narrower than the node count); as soon as a node's supervisor is up,
its stream goes to the watcher, which starts heartbeating it.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.errors import LaunchError
from fleetctl.phases.frames import Frame, FrameReader
from fleetctl.plan.launchers import launcher_for
from fleetctl.remote.kit.records import RecordError, SupervisorSpec

if TYPE_CHECKING:
    from pathlib import Path

    from fleetctl.node import Node
    from fleetctl.phases.check.report import HeldProbe
    from fleetctl.plan.rankplan import NodePlan
    from fleetctl.transport.connection import Connection, Stream

START_TIMEOUT = 30.0  # handshake: supervisor up, spec sent, job started

# Runs the supervisor from W/bin/supervisor_<sha>/, installing it first when missing (the
# installer's STDIN entrance: ``U``, then the bundle on stdin).
LOADER = remote.stdin_entrance()


def supervisor_source() -> tuple[bytes, str]:
    """The supervisor's bundle and its content hash (12 hex), which names it on the nodes."""
    return remote.bundle("supervisor.py"), remote.digest("supervisor.py")


def supervisor_path(workdir: str) -> str:
    """Where the supervisor lives under a (home-expanded) workdir."""
    return remote.installed_path(workdir, "supervisor.py")


def start_command(python: str, sup_path: str, *args: str) -> str:
    """One shell line: exec the supervisor through the installer's STDIN entrance.

    ``args``: the supervisor's mode and its options (default ``run``). A missing supervisor
    answers ``U`` and waits for ``<length>\\n<bundle>`` on stdin (see :func:`upload_on_request`).
    """
    argv = remote.stdin_argv(python, sup_path, *(args or ("run",)))
    return shlex.join(["sh", "-c", "exec " + shlex.join(argv)])


# The same start, as Python run by a held check probe in its own process
# (fleetctl.remote.programs.probe.handoff) with argv ``<supervisor path> run``.
HANDOFF = LOADER


def handoff_line(sup_path: str, *args: str) -> bytes:
    """The line a held probe runs the supervisor from (see ``HANDOFF``)."""
    msg = {"code": HANDOFF, "argv": [sup_path, *(args or ("run",))]}
    return json.dumps(msg).encode() + b"\n"


def upload_on_request(stream: Stream) -> None:
    """Answer the installer's ``U``: the supervisor's bundle, length first."""
    stream.send(remote.upload("supervisor.py"))


def supervisor_command(python: str, sup_path: str, mode: str, **opts: object) -> list[str]:
    """argv for a one-shot supervisor mode (stop, status, pack, ...) on a node."""
    argv = remote.file_argv(python, sup_path, mode)
    for key, value in opts.items():
        if value is not None:
            argv += ["--" + key.replace("_", "-"), str(value)]
    return argv


# ------------------------------------------------------------------------------ protocol


def exit_code_of(frame: Frame) -> int | None:
    """The ``X`` frame's code: exit code >= 0, or -signal. None if malformed."""
    try:
        return int(frame.payload.split()[0])
    except (ValueError, IndexError):
        return None


def exit_report_of(frame: Frame) -> dict[str, Any] | None:
    """The ``X`` frame's JSON after the code: the supervisor's scan for the job's processes
    once the launcher had exited (``found``, ``killed``, ``remaining``). None when absent."""
    _, _, rest = frame.payload.partition(b" ")
    if not rest.strip():
        return None
    try:
        data = json.loads(rest)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("remaining"), list):
        return None
    return data


# ---------------------------------------------------------------------------------- start


@dataclass
class NodeRun:
    """A node whose supervisor is up and running the job."""

    node: Node
    rank: int
    conn: Connection
    stream: Stream
    reader: FrameReader
    python: str
    sup_path: str
    run_dir: str  # home-expanded
    info: dict[str, Any] = field(default_factory=dict)
    started: float = 0.0  # time.time() when the supervisor reported the job running
    pending: list[Frame] = field(default_factory=list)  # frames read along with ``S``
    uploaded: bool = False
    lines: int = 0  # console.log lines received (where a reattach resumes)
    reattached: int = 0  # times the stream was taken over by a new connection
    ranks_ended: bool = False  # its ``A`` arrived (a reattach says it again: once is news)


def node_spec(
    np: NodePlan,
    conn: Connection,
    *,
    job_id: str,
    deadman: float,
    grace: float,
    heartbeat: float = 1.0,
    detach: bool = False,
    path_prepend: Sequence[str] = (),
    collect: dict[str, Any] | None = None,
    pace: dict[str, Any] | None = None,
) -> SupervisorSpec:
    """The spec the supervisor gets on stdin (paths home-expanded: no ``~`` on the node).
    ``collect``: what the supervisor sends when asked for its run folder after the exit;
    ``pace``: the slow-node sampler's settings (None: no sampling)."""
    spec: dict[str, Any] = {
        "job_id": job_id,
        "node_rank": np.node_rank,
        "argv": list(np.argv),
        # faulthandler: a stalled job's ranks can be made to print every thread as they end
        "env": {"PYTHONFAULTHANDLER": "1", **np.env},
        "cwd": conn.expand(np.cwd),
        "run_dir": conn.expand(np.run_dir),
        "files": dict(np.files),
        "path_prepend": [conn.expand(p) for p in path_prepend],
        "deadman": deadman,
        "grace": grace,
        "heartbeat": heartbeat,
        "detach": detach,
    }
    if collect is not None:
        spec["collect"] = collect
    if pace is not None:  # the slow-node watch: where the ranks are (remote/kit/pace.py)
        spec["pace"] = pace
    if not detach:  # a closed channel is not the end: the controller may reattach
        spec["reattach"] = True
    work = np.work_dir or np.cwd  # cwd: the work folder, or the script's folder inside it
    if work not in (np.run_dir, np.code_dir):  # the job's work folder: a copy of the code
        spec["work_seed"] = conn.expand(np.code_dir)
        if work != np.cwd:
            spec["work"] = conn.expand(work)
    # per-rank files the supervisor tails into whole ``[rank G]`` lines: the launcher says where
    nproc = int(np.env.get("FLEET_NPROC_PER_NODE") or 1)
    launcher = launcher_for(np.env.get("FLEET_LAUNCHER"))
    rank_logs = launcher.rank_logs(np.node_rank, nproc)
    if rank_logs is not None:
        spec["rank_logs"] = rank_logs
    if launcher.one_process and not np.container:  # the supervisor's child is local rank 0
        spec["one_process"] = True
    if np.container:
        _in_container(spec, np, conn, grace)
    return SupervisorSpec(**spec)


def _in_container(spec: dict[str, Any], np: NodePlan, conn: Connection, grace: float) -> None:
    """``--image``: the launcher's argv run in one container of the image, found again by the
    job's label when the supervisor ends (docs/containers.md)."""
    from fleetctl.plan.runtimes import ContainerSpec, runtime

    c = np.container or {}
    rt = runtime(c.get("runtime") or "podman")
    paths = (np.code_dir, np.work_dir or np.cwd, np.run_dir)
    run_dir = conn.expand(np.run_dir)
    cs = ContainerSpec(
        image=c["image"],
        job_id=spec["job_id"],
        node_rank=np.node_rank,
        cwd=spec["cwd"],
        mounts=tuple(conn.expand(p) for p in paths),
        env_names=(*spec["env"], *CONTAINER_ENV),
        gpus=bool(c.get("gpus")),
        pidfile=f"{run_dir}/{CONTAINER_PID}" if rt.pidfile else None,
    )
    spec["argv"] = rt.run_argv(cs, spec["argv"])
    if rt.labels:
        spec["container"] = {
            "list": rt.list_argv(cs.job_id, cs.node_rank),
            "stop": rt.stop_argv([], grace),
            "remove": rt.remove_argv([]),
            "pid": rt.pid_argv(cs.name),
            "pidfile": cs.pidfile,
            "timeout": c.get("timeout"),  # one runtime call's bound (--runtime-timeout)
        }


CONTAINER_PID = "container.pid"  # in the node run folder: the container's main pid (podman)

#: what the supervisor adds to the job's env (``Supervisor.child_env``): passed in by name too
CONTAINER_ENV = (
    "FLEET_JOB_ID",
    "FLEET_NODE_RANK",
    "FLEET_RUN_DIR",
    "FLEET_PROGRESS_FILE",
    "PYTHONUNBUFFERED",
)


def install_file(conn: Connection, local: Path, remote: str, *, timeout: float) -> bool:
    """Put ``local`` at ``remote`` (0700, parent made 0700) unless it is already there; the
    name carries the content hash, so "there" means "this very file". True when uploaded."""
    if conn.run(["test", "-x", remote], timeout=timeout).exit_code == 0:
        return False
    conn.run(["mkdir", "-p", "-m", "700", posixpath.dirname(remote)], timeout=timeout)
    conn.put(local, remote, mode=0o700)
    return True


def install_program(conn: Connection, python: str, path: str, *, timeout: float) -> bool:
    """Install the node program whose folder is ``path`` (``W/bin/<stem>_<sha12>``) unless it
    is there already; True when it is there now."""
    name = posixpath.basename(path).rsplit("_", 1)[0] + ".py"
    argv = remote.cached_argv(python, posixpath.dirname(posixpath.dirname(path)), name)
    return conn.run([*argv, "--install-only"], timeout=timeout).exit_code == 0


def start_node(
    node: Node,
    conn: Connection,
    spec: SupervisorSpec | Mapping[str, Any],
    *,
    python: str,
    timeout: float = START_TIMEOUT,
    held: HeldProbe | None = None,
) -> NodeRun:
    """Start one node's supervisor and job; returns once the job runs. Raises LaunchError.

    ``held``: this node's probe, still on its channel after the check: it runs the supervisor
    in its own process (no new remote command). Closed and not used when it no longer may be.
    A spec given as a mapping is read as the supervisor would read it (``SupervisorSpec``).
    """
    if not isinstance(spec, SupervisorSpec):
        try:
            spec = SupervisorSpec.from_dict(dict(spec))
        except RecordError as e:
            raise LaunchError(f"{node.label}: {e}") from None
    line = json.dumps(spec.to_dict()).encode() + b"\n"
    workdir = conn.expand(node.workdir)
    sup = supervisor_path(workdir)
    py = conn.expand(python)
    stream = None
    if held is not None:
        if held.usable(python, time.monotonic()):
            try:
                held.stream.send(handoff_line(sup))
                stream = held.stream
            except OSError:
                pass
        if stream is None:
            held.close()
    if stream is None:
        stream = conn.start(start_command(py, sup))
    reader = FrameReader()
    noise: list[str] = []
    uploaded = False
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LaunchError(
                    f"{node.label}: supervisor did not start the job within "
                    f"{timeout:g}s" + _tail(noise)
                )
            data = stream.recv(min(left, 1.0))
            if data is None:
                continue
            frames = reader.feed(data) if data else reader.flush()
            for i, fr in enumerate(frames):
                if fr.kind == "U":
                    upload_on_request(stream)
                    uploaded = True
                elif fr.kind == "R":
                    stream.send(line)
                elif fr.kind == "S":
                    try:
                        info = json.loads(fr.payload)
                    except ValueError:
                        info = {}
                    return NodeRun(
                        node=node,
                        rank=spec.node_rank,
                        conn=conn,
                        stream=stream,
                        reader=reader,
                        python=py,
                        sup_path=sup,
                        run_dir=spec.run_dir,
                        info=info,
                        started=time.time(),
                        pending=frames[i + 1 :],
                        uploaded=uploaded,
                    )
                elif fr.kind == "F":
                    noise.append(fr.text)
                elif fr.kind == "X":
                    raise LaunchError(
                        f"{node.label}: "
                        + (noise[-1] if noise else f"supervisor ended with {fr.text}")
                    )
                elif fr.kind == "?" and fr.payload:
                    noise.append(fr.text)
            if not data:
                code = stream.exit_code(2.0)
                raise LaunchError(
                    f"{node.label}: supervisor exited (status {code}) before "
                    "starting the job" + _tail(noise)
                )
    except BaseException:
        stream.close()
        raise


def _tail(noise: list[str]) -> str:
    return (": " + " | ".join(noise[-3:])) if noise else ""
