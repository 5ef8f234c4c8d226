"""Node state checks behind ``tests/infra`` (testinfra): is a node ready, is it clean after a job.

Shared by the testinfra suite users run against their own fleet (``pytest tests/infra
--hosts=…``) and by fleetctl's own lab/e2e tests, which call :func:`assert_node_clean` after
failure scenarios. Every check costs one remote command: the node side is a small stdlib
Python program (:data:`CLEAN_PROBE`: the supervisor's ``clean`` mode) that looks at ``/proc`` and
the workdir and answers one ``D <json>`` frame.

"Clean" follows the brief's contract: a process belongs to a fleetctl job when its environment
carries ``FLEET_JOB_ID`` (any value, or the given job id), or when it is in the process group
that job's supervisor recorded in ``W/runs/<job_id>/<rank>-<host>/supervisor.json`` and that
group's leader is still the recorded process (same start time), never by name. Temp files are
what push and the supervisor write before an atomic rename (``.tmp-*``, ``*.part``,
``*.<pid>.tmp``).

``host`` is a testinfra ``Host`` or a fleetctl ``Connection``; testinfra is only imported by
:func:`node_host`, so this module stays importable without it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetctl import remote
from fleetctl.node import DEFAULT_WORKDIR
from fleetctl.phases.frames import last_data

if TYPE_CHECKING:
    from fleetctl.node import Node
    from fleetctl.transport.connection import SSHSettings

__all__ = [
    "CLEAN_PROBE",
    "READY_MAX_SESSIONS",
    "READY_MAX_STARTUPS",
    "Leftovers",
    "assert_node_clean",
    "node_host",
    "node_leftovers",
    "sshd_effective",
]

#: What playbooks/bootstrap.yml sets and tests/infra requires at least (a pure test keeps the
#: two in step).
READY_MAX_SESSIONS = 64
READY_MAX_STARTUPS = 64
PROBE_TIMEOUT = 60.0

#: Node-side program: the supervisor (its ``clean`` mode), shipped with ``python -c``, so a
#: node needs nothing installed and /proc is read by the same code that stops jobs. Its inline
#: code is already compressed (``remote.COMPRESS_OVER``: zlib and base64, no quotes, so
#: testinfra's two more quotings for ``sh -c`` and ``ssh`` add little); compressing it again
#: gained nothing and cost a second unpacking (tests/pure/test_inline_room.py catches a double).
CLEAN_PROBE = remote.inline("supervisor.py")


@dataclass
class Leftovers:
    """What a finished job left on one node."""

    node: str
    processes: list[dict[str, Any]] = field(default_factory=list)
    temp_files: list[str] = field(default_factory=list)
    workdir: str = ""

    @property
    def clean(self) -> bool:
        return not self.processes and not self.temp_files

    def describe(self) -> str:
        """Multi-line, for assertion messages: every process and file, not only the first."""
        lines = [f"{self.node}: not clean"]
        lines += [
            f"  process {p['pid']} (pgid {p['pgid']}, FLEET_JOB_ID={p['job_id']}): {p['cmd']}"
            for p in self.processes
        ]
        lines += [f"  temp file {t}" for t in self.temp_files]
        return "\n".join(lines)


def _run(host: Any, command: str) -> tuple[int, str, str]:
    """One command on a testinfra Host or a fleetctl Connection: (exit code, stdout, stderr)."""
    if hasattr(host, "backend"):  # testinfra Host
        r = host.run(command)
        return r.rc, r.stdout, r.stderr
    r = host.run(command, timeout=PROBE_TIMEOUT)
    return r.exit_code, r.stdout, r.stderr


def _name(host: Any) -> str:
    if hasattr(host, "backend"):
        return str(getattr(host.backend, "hostname", host))
    node = getattr(host, "node", None)
    return getattr(node, "name", None) or str(host)


def node_leftovers(
    host: Any,
    job_id: str | None = None,
    *,
    workdir: str | None = None,
    python: str | None = None,
) -> Leftovers:
    """Processes and temp files of fleetctl jobs (of ``job_id`` only, when given) on one node.

    Processes are found in ``/proc`` as the SSH user sees it: run as root (or as the user the
    jobs ran as) to see every job process. ``workdir``/``python`` default to the Connection's
    node's (``fleetctl_workdir``/``fleetctl_python``), else ``~/.fleetctl`` and ``python3``.
    """
    node = None if hasattr(host, "backend") else getattr(host, "node", None)
    workdir = workdir or getattr(node, "workdir", None) or DEFAULT_WORKDIR
    python = python or getattr(node, "python", None) or "python3"
    argv = [python, "-S", "-c", CLEAN_PROBE, "clean", "--workdir", workdir]
    if job_id:
        argv += ["--job-id", job_id]
    rc, out, err = _run(host, shlex.join(argv))
    data = last_data(out)
    if rc != 0 or not isinstance(data, dict):
        raise RuntimeError(f"{_name(host)}: cleanliness probe exited {rc}: {err.strip()[-500:]}")
    return Leftovers(_name(host), data["processes"], data["temp_files"], data["workdir"])


def assert_node_clean(
    host: Any,
    job_id: str | None = None,
    *,
    workdir: str | None = None,
    python: str | None = None,
    temp_files: bool = True,
) -> None:
    """AssertionError listing every leftover process (and temp file) of fleetctl jobs on a node.

    For tests after failure scenarios: ``assert_node_clean(host, job_id)`` checks that teardown
    left nothing of that job. ``temp_files=False`` ignores temp files (processes only).
    """
    left = node_leftovers(host, job_id, workdir=workdir, python=python)
    if not temp_files:
        left.temp_files = []
    if not left.clean:
        raise AssertionError(left.describe())


def sshd_effective(
    host: Any, config: str = "/etc/ssh/sshd_config", sshd: str = "/usr/sbin/sshd"
) -> dict[str, str]:
    """``sshd -T -f config`` as a dict (lower-case keys): what sshd would run with.

    ``sshd -T`` needs root (it reads the host keys). A testinfra Host that is not root uses
    sudo (``sudo -n``-style: it fails rather than prompt when a password is needed).
    """
    command = shlex.join([sshd, "-T", "-f", config])
    if hasattr(host, "backend") and host.run("id -u").stdout.strip() != "0":
        with host.sudo():
            rc, out, err = _run(host, command)
    else:
        rc, out, err = _run(host, command)
    if rc != 0:
        raise RuntimeError(f"{_name(host)}: `{command}` exited {rc}: {err.strip()[-500:]}")
    settings: dict[str, str] = {}
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key.lower(), value.strip())
    return settings


def node_host(node: Node, settings: SSHSettings | None = None) -> Any:
    """A testinfra Host for a fleetctl Node, dialled with fleetctl's key and known_hosts.

    Host keys are verified (StrictHostKeyChecking yes against the known_hosts fleetctl uses);
    no connection sharing, so nothing lingers after the checks.
    """
    import testinfra

    from fleetctl.transport.connection import SSHSettings

    if node.local:
        return testinfra.get_host("local://")
    settings = settings or SSHSettings()
    extra = [
        "-o", f"UserKnownHostsFile={settings.known_hosts_for(node)}",
        "-o", "StrictHostKeyChecking=" + ("accept-new" if settings.accept_new else "yes"),
        "-o", "BatchMode=yes",
        "-o", "ControlMaster=no",
        "-o", f"ConnectTimeout={int(settings.connect_timeout)}",
    ]  # fmt: skip
    config = settings.ssh_config or node.ssh_config or os.environ.get("FLEETCTL_SSH_CONFIG")
    if config:
        extra = ["-F", os.path.expanduser(config), *extra]
    address = f"[{node.address}]" if ":" in node.address else node.address
    user = f"{node.user}@" if node.user else ""
    return testinfra.get_host(
        f"ssh://{user}{address}:{node.port}",
        ssh_identity_file=node.key_file,
        ssh_extra_args=shlex.join(extra),
    )
