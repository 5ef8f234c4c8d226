"""The exception tree. Library code raises these; only the CLI turns them into exit codes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.results import FleetResult


class FleetctlError(Exception):
    """Root of every error fleetctl raises on purpose. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def one_line(self) -> str:
        """The message as a single line, for `fleetctl: error: …`."""
        return " ".join(str(self).split("\n")[0].split()) or type(self).__name__


def one_line(e: object, *, typed: bool = False) -> str:
    """Any error as one line: ours by ``FleetctlError.one_line``, any other by the words of
    its message (``typed``: after its class name, where the message alone would not say what
    broke: ``OSError: …``); its class name when it says nothing."""
    if isinstance(e, FleetctlError):
        return e.one_line()
    text = " ".join(str(e).split())
    if typed:
        return f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text or type(e).__name__


class UsageError(FleetctlError):
    """Bad command-line usage."""

    exit_code = 2


class InventoryError(FleetctlError):
    """The inventory cannot be read or is invalid. Message names file:line and host/field."""

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        host: str | None = None,
        field: str | None = None,
    ) -> None:
        where = ""
        if path:
            where = f"{path}:{line}: " if line else f"{path}: "
        super().__init__(where + message)
        self.path, self.line, self.host, self.field = path, line, host, field


class PlanError(FleetctlError):
    """The job cannot be planned on these nodes (mixed GPU counts, unknown launcher, …)."""

    exit_code = 2


class LabError(FleetctlError):
    """The namespace lab cannot be set up, inspected or torn down."""


class LabInputError(LabError):
    """Bad lab arguments (host count, --subnet, --name, --dir, fault options)."""

    exit_code = 2


class ConnectError(FleetctlError):
    """A node cannot be reached over SSH (refused, timeout, auth, host key)."""

    exit_code = 3

    def __init__(self, node: str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{node}: {message}" + (f" ({hint})" if hint else ""))
        self.node, self.reason, self.hint = node, message, hint


class HostKeyError(ConnectError):
    """The node's host key is unknown or changed: refused, never auto-added."""


class SSHConfigError(ConnectError):
    """The ssh_config file used for a node cannot be read or parsed (the message names it)."""

    def __init__(self, node: str, path: str, why: str) -> None:
        super().__init__(node, f"cannot use ssh_config {path}: {' '.join(why.split())}")
        self.path = path


class RemoteCommandError(FleetctlError):
    """A command on one node failed. Carries the result so the caller can show its output."""

    exit_code = 3

    def __init__(self, node: str, command: str, result: Any, message: str | None = None) -> None:
        code = getattr(result, "exit_code", None)
        tail = (getattr(result, "stderr", "") or getattr(result, "stdout", "") or "").strip()
        last = tail.splitlines()[-1] if tail else ""
        msg = message or f"{node}: `{command}` exited {code}" + (f": {last}" if last else "")
        super().__init__(msg)
        self.node, self.command, self.result = node, command, result


class FleetError(FleetctlError):
    """A fan-out failed on some nodes. ``result`` keeps every node's outcome, not just the first."""

    exit_code = 3

    def __init__(self, message: str, result: FleetResult) -> None:
        super().__init__(message)
        self.result = result


class CheckError(FleetError):
    """Preflight found problems; ``result`` holds every host's check report."""


class PushError(FleetError):
    """Code or environment push failed on some nodes."""


class NodePushError(FleetctlError):
    """Push failed on one node; kept per node inside ``PushError.result``.

    ``stage`` says where (probe, disk, code, upload, fetch, unpack, verify, nccl); ``enospc``
    whether the node's disk was full.
    """

    exit_code = 3

    def __init__(self, node: str, message: str, *, stage: str = "", enospc: bool = False) -> None:
        super().__init__(f"{node}: {message}")
        self.node, self.reason, self.stage, self.enospc = node, message, stage, enospc


class ExecFailed(FleetctlError):
    """``fleetctl exec`` failed on some nodes (exit 3, or the largest remote code with -S)."""

    exit_code = 3

    def __init__(self, message: str, exit_code: int = 3) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class JobFailed(FleetctlError):
    """The training job failed on a node (exit code, signal or lost node)."""

    exit_code = 3


class LogsIncomplete(FleetctlError):
    """The job succeeded, but some node's logs did not come home (a script must not take the
    run folder for the whole story): ``fleetctl collect JOB`` fetches the rest."""

    exit_code = 4


class LaunchError(FleetctlError):
    """A node's supervisor could not start the job (message names the node)."""

    exit_code = 3


class CollectError(FleetctlError):
    """A node's logs could not be brought back."""

    exit_code = 3


class RunFolderError(FleetctlError):
    """A controller run folder (fleet-runs/<job>) cannot be created or read."""


class NoSuchJob(RunFolderError):
    """The JOB given is not in the runs folder (or is an ambiguous prefix): bad input."""

    exit_code = 2


class Interrupted(FleetctlError):
    """The user pressed Ctrl-C; teardown ran."""

    exit_code = 130


class ProvisionError(FleetctlError):
    """``fleetctl provision``: ansible-playbook is missing or failed. ``exit_code`` depends on why
    (1 ansible missing or crashed, 2 bad playbook/inventory/options, 3 hosts failed or
    unreachable, 130 interrupted); ``returncode`` is ansible-playbook's own, when it ran."""

    def __init__(self, message: str, *, exit_code: int = 1, returncode: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.returncode = returncode


class HealthLedgerError(FleetctlError):
    """The health ledger (or a host's last-check figures) cannot be read or written: the file
    and why, in one line."""
